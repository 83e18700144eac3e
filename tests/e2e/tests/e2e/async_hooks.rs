//! The async hooks (ABI 1.7) through the loaded libraries: cancellation by
//! dropping the future, panics, streaming, and the async facade's fallback
//! to the blocking hooks of older providers.

use crate::support::*;
use e2e::library;
use host_harness::async_host::AsyncProvider;
use provider_abi::{
    EnvironmentParams, ErrorKind, ExecuteParams, HookFuture, HookResult, LoadedProvider, OutputStream,
    OwnedByteSink, Provider, ABI_1_5, ABI_1_6, ABI_1_7,
};
use serde_json::json;
use std::{
    future::Future,
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context, Poll},
    time::Duration,
};

/// The host's own runtime: one thread, none of the provider's.
fn host_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a host runtime")
}

/// Polls `future` at most `polls` times (each time it is woken), then drops
/// it: `Some(result)` if it completed first.
struct DropAfter<T> {
    future: Option<HookFuture<T>>,
    polls: usize,
}

impl<T> Future for DropAfter<T> {
    type Output = Option<HookResult<T>>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let Some(future) = self.future.as_mut() else { return Poll::Ready(None) };
        if let Poll::Ready(result) = future.as_mut().poll(cx) {
            return Poll::Ready(Some(result));
        }
        self.polls -= 1;
        if self.polls == 0 {
            self.future = None;
            return Poll::Ready(None);
        }
        Poll::Pending
    }
}

/// Awaits `future` until it completes or the simulator has answered `after`
/// more requests than `before`, then drops it: `Some(result)` if it
/// completed first.
async fn drop_after_requests<T>(
    bed: &Bed,
    future: HookFuture<T>,
    before: usize,
    after: usize,
) -> Option<HookResult<T>> {
    let mut future = future;
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    loop {
        tokio::select! {
            result = &mut future => return Some(result),
            _ = tick.tick() => {
                if bed.ledger().requests.len() >= before + after {
                    return None;
                }
            }
        }
    }
}

/// How many requests one uncancelled call of `call` makes.
fn requests_of<T>(
    bed: &Bed,
    runtime: &tokio::runtime::Runtime,
    call: impl FnOnce() -> HookFuture<T>,
) -> (usize, T) {
    let before = bed.ledger().requests.len();
    let value = runtime.block_on(call()).expect("the uncancelled call succeeds");
    (bed.ledger().requests.len() - before, value)
}

#[test]
fn dropping_an_async_acquire_at_any_point_leaves_no_live_sandbox() {
    let bed = Bed::new();
    let config = bed.config(json!({}));
    let runtime = host_runtime();
    let acquire = || bed.provider.acquire_lease_async(bed.acquire_params(&config));
    let (requests, lease) = requests_of(&bed, &runtime, acquire);
    bed.provider.destroy_lease(&bed.lease_params(&config, &lease)).unwrap();
    let mut created = 1;
    let mut finish = |outcome: Option<HookResult<provider_abi::Lease>>, what: &str| {
        if let Some(result) = outcome {
            let lease = result.unwrap_or_else(|error| panic!("{what}: {error}"));
            bed.provider.destroy_lease(&bed.lease_params(&config, &lease)).unwrap();
        }
        // Every acquire creates exactly one sandbox (no faults), cancelled or
        // not; once it exists, the provider deletes it on its own runtime.
        created += 1;
        bed.wait_for_ledger(what, |ledger| ledger.sandboxes.len() == created && ledger.leaked().is_empty());
    };
    // Dropped after N polls on the host's executor, for N from 1 up.
    for polls in 1.. {
        let outcome = runtime.block_on(DropAfter { future: Some(acquire()), polls });
        let completed = outcome.is_some();
        finish(outcome, &format!("acquire dropped after {polls} polls"));
        if completed {
            break;
        }
    }
    // Dropped after the provider's k-th request, for every request it makes.
    for after in 0..=requests {
        let before = bed.ledger().requests.len();
        let outcome = runtime.block_on(drop_after_requests(&bed, acquire(), before, after));
        finish(outcome, &format!("acquire dropped after {after} of {requests} requests"));
    }
}

#[test]
fn dropping_an_async_execute_at_any_point_terminates_its_process() {
    let bed = Bed::new();
    // A command deadline beyond the ledger wait's bound: only cancellation,
    // not the deadline, can terminate the command in time.
    let config = bed.config(json!({"reuseLease": true, "timeoutMs": 120_000}));
    let lease = bed.acquire(&config);
    let runtime = host_runtime();
    let execute = |command: &str, args: &[&str]| {
        bed.provider
            .execute_async(bed.command(&config, &lease, command, args), OwnedByteSink::new(|_, _: &[u8]| ()))
    };
    let (requests, result) = requests_of(&bed, &runtime, || execute("/bin/echo", &["ok"]));
    assert_eq!(result.stdout, "ok\n");
    // A command that never ends by itself: every process created from here
    // on must be terminated by the provider once the future is dropped (the
    // `echo` above ended by itself).
    let unterminated = |ledger: &createos_sim::Ledger| {
        let created = ledger
            .requests
            .iter()
            .filter(|r| {
                r.method == "POST" && createos_sim::path_matches("/v1/sandboxes/*/processes", &r.path)
            })
            .filter(|r| (200..300).contains(&r.status))
            .count();
        created - ledger.count("DELETE", "/v1/sandboxes/*/processes/*")
    };
    let ended_by_themselves = unterminated(&bed.ledger());
    let all_terminated = |ledger: &createos_sim::Ledger| unterminated(ledger) == ended_by_themselves;
    // On the host's executor the future has one await point (its result,
    // which wakes it once): dropped after its first poll. The provider's
    // await points are reached by dropping it after its k-th request.
    let outcome = runtime.block_on(DropAfter { future: Some(execute("/bin/sleep", &["300"])), polls: 1 });
    assert!(outcome.is_none(), "a 300 s command does not end after one poll: {outcome:?}");
    bed.wait_for_ledger("execute dropped after one poll", all_terminated);
    // The last request (the output stream) is recorded when it ends, with
    // the command.
    for after in 0..requests {
        let before = bed.ledger().requests.len();
        let outcome =
            runtime.block_on(drop_after_requests(&bed, execute("/bin/sleep", &["300"]), before, after));
        assert!(
            outcome.is_none(),
            "a 300 s command does not end (dropped after {after} of {requests}): {outcome:?}"
        );
        bed.wait_for_ledger(&format!("execute dropped after {after} requests"), all_terminated);
    }
    bed.wait_for_ledger("every cancelled command's process terminated", all_terminated);
    // The lease is still usable (no cleanup was left unconfirmed), and
    // nothing leaks once it is destroyed.
    let again = runtime.block_on(execute("/bin/echo", &["again"])).expect("the lease is still usable");
    assert_eq!(again.stdout, "again\n");
    bed.provider.destroy_lease(&bed.lease_params(&config, &lease)).unwrap();
    assert!(bed.ledger().leaked().is_empty());
}

#[test]
fn a_panicking_async_hook_is_an_error_before_and_while_polled() {
    let provider = LoadedProvider::load(library("fixture_v1_7")).unwrap();
    let runtime = host_runtime();
    // Before the future is returned.
    let panics = EnvironmentParams { config_json: "panic".into(), ..Default::default() };
    let error = runtime.block_on(provider.probe_async(panics)).unwrap_err();
    assert_eq!(error.kind, ErrorKind::INTERNAL);
    assert_eq!(
        error.message.as_str(),
        "The provider panicked in the `probe_async` hook: fixture probe_async was told to panic"
    );
    // While it is polled, after streaming output.
    let seen = Arc::new(Mutex::new(Vec::new()));
    let kept = Arc::clone(&seen);
    let sink = OwnedByteSink::new(move |_, chunk: &[u8]| kept.lock().unwrap().extend_from_slice(chunk));
    let params =
        ExecuteParams { command: "panic".into(), args: vec!["a".into()].into(), ..Default::default() };
    let error = runtime.block_on(provider.execute_async(params, sink)).unwrap_err();
    assert_eq!(error.kind, ErrorKind::INTERNAL);
    assert_eq!(
        error.message.as_str(),
        "The provider panicked in the `execute_async` hook: fixture execute_async was told to panic"
    );
    assert_eq!(*seen.lock().unwrap(), b"a");
    // The host and the provider carry on.
    assert_eq!(runtime.block_on(provider.health_async()).unwrap().status, "ok");
}

#[test]
fn many_concurrent_async_executes_stream_their_output() {
    const LEASES: usize = 10;
    const PER_LEASE: usize = 100;
    let bed = Bed::new();
    // Generous: a thousand processes on a shared two-core machine.
    let config = bed.config(json!({"timeoutMs": 300_000}));
    let leases: Vec<_> = (0..LEASES).map(|_| bed.acquire(&config)).collect();
    let provider = AsyncProvider::new(Arc::new(LoadedProvider::load(library("createos_provider")).unwrap()));
    let runtime = host_runtime();
    let outputs = runtime.block_on(async {
        let mut running = Vec::new();
        for (index, lease) in (0..LEASES * PER_LEASE).map(|i| (i, &leases[i % LEASES])) {
            let script = format!("echo out-{index}; echo err-{index} >&2");
            let execution = provider.execute(bed.command(&config, lease, "/bin/sh", &["-c", &script]));
            running.push(tokio::spawn(async move {
                let mut execution = execution;
                let mut chunks = Vec::new();
                while let Some((stream, chunk)) = execution.output.recv().await {
                    chunks.push((stream, chunk));
                }
                (index, chunks, execution.result().await)
            }));
        }
        let mut outputs = Vec::new();
        for task in running {
            outputs.push(task.await.expect("the host task"));
        }
        outputs
    });
    for (index, chunks, result) in outputs {
        let result = result.unwrap_or_else(|error| panic!("execute {index}: {error}"));
        assert_eq!(result.exit_code.into_option(), Some(0), "execute {index}: {result:?}");
        let stream = |wanted: OutputStream| -> Vec<u8> {
            chunks
                .iter()
                .filter(|(stream, _)| *stream == wanted)
                .flat_map(|(_, chunk)| chunk.clone())
                .collect()
        };
        assert_eq!(stream(OutputStream::Stdout), format!("out-{index}\n").as_bytes());
        assert_eq!(stream(OutputStream::Stderr), format!("err-{index}\n").as_bytes());
    }
    for lease in &leases {
        bed.provider.destroy_lease(&bed.lease_params(&config, lease)).unwrap();
    }
    assert!(bed.ledger().leaked().is_empty());
}

#[test]
fn the_async_facade_uses_async_hooks_when_the_library_has_them_and_falls_back_otherwise() {
    let runtime = host_runtime();
    // New host / new provider, new host / old provider, old host / new
    // provider: the same answers through the facade.
    for (name, host, async_hooks) in [
        ("fixture_v1_7", ABI_1_7, true),
        ("fixture_v1_6", ABI_1_7, false),
        ("fixture_v1_5", ABI_1_7, false),
        ("fixture_v1_0", ABI_1_7, false),
        ("fixture_v1_7", ABI_1_6, false),
        ("fixture_v1_7", ABI_1_5, false),
    ] {
        let loaded = LoadedProvider::load_as(library(name), host).unwrap();
        assert_eq!(loaded.supports(provider_abi::Hook::ExecuteAsync), async_hooks, "{name} as {host}");
        let provider = AsyncProvider::new(Arc::new(loaded));
        let (health, lease, result, output) = runtime.block_on(async {
            let health = provider.health().await.unwrap();
            let lease = provider.acquire_lease(Default::default()).await.unwrap();
            let params = ExecuteParams {
                command: "echo".into(),
                args: vec!["a".into(), "b".into()].into(),
                ..Default::default()
            };
            let mut execution = provider.execute(params);
            let mut output = Vec::new();
            while let Some((_, chunk)) = execution.output.recv().await {
                output.extend(chunk);
            }
            (health, lease, execution.result().await.unwrap(), output)
        });
        assert_eq!(health.status, "ok", "{name} as {host}");
        assert!(lease.provider_lease_id.is_some(), "{name} as {host}");
        assert_eq!((result.stdout.as_str(), output.as_slice()), ("ab", b"ab".as_slice()), "{name} as {host}");
    }
}
