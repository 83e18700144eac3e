//! The async hooks through the loaded libraries: cancellation by dropping
//! the future, panics, streaming, the write-ahead recorder's two moments,
//! file sync, and the host's own acquire dropped at any point.

use crate::support::*;
use e2e::library;
use provider_abi::{
    ready, ByteSink, ByteSource, CreationRecorder, EnvironmentParams, ErrorKind, ExecuteParams, HookFuture,
    HookResult, Lease, OutputStream, PostUploadCommand, Provider, ProviderError, RecordCreation,
    SyncDirection, SyncMapping, SyncOperation, SyncParams, SyncResult,
};
use provider_host::{loader::LoadedProvider, wait, LeaseStore};
use serde_json::{json, Value};
use std::{
    collections::HashSet,
    future::Future,
    path::Path,
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context, Poll},
    time::Duration,
};

/// The host's own runtime: one thread, none of the provider's.
fn host_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a host runtime")
}

/// A hook's future, or a host's (which borrows the host).
type CallFuture<'a, T> = Pin<Box<dyn Future<Output = HookResult<T>> + 'a>>;

/// Polls `future` at most `polls` times (each time it is woken), then drops
/// it: `Some(result)` if it completed first.
struct DropAfter<'a, T> {
    future: Option<CallFuture<'a, T>>,
    polls: usize,
}

impl<T> Future for DropAfter<'_, T> {
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
    future: CallFuture<'_, T>,
    before: usize,
    after: usize,
) -> Option<HookResult<T>> {
    drop_when(bed, future, |ledger| ledger.requests.len() >= before + after).await
}

/// Awaits `future` until it completes or `reached` holds on the simulator's
/// ledger, then drops it: `Some(result)` if it completed first.
async fn drop_when<T>(
    bed: &Bed,
    future: CallFuture<'_, T>,
    reached: impl Fn(&createos_sim::Ledger) -> bool,
) -> Option<HookResult<T>> {
    let mut future = future;
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    loop {
        tokio::select! {
            result = &mut future => return Some(result),
            _ = tick.tick() => {
                if reached(&bed.ledger()) {
                    return None;
                }
            }
        }
    }
}

/// How many requests one uncancelled call of `call` makes.
fn requests_of<T, F: Future<Output = HookResult<T>>>(
    bed: &Bed,
    runtime: &tokio::runtime::Runtime,
    call: impl FnOnce() -> F,
) -> (usize, T) {
    let before = bed.ledger().requests.len();
    let value = runtime.block_on(call()).expect("the uncancelled call succeeds");
    (bed.ledger().requests.len() - before, value)
}

/// Drops `acquire()`'s future after N polls on the host's executor (N from
/// 1 up) and after the provider's k-th request (for every request it makes).
/// After each drop, once a lease the acquire did return (checked by
/// `returned`) is destroyed, waits until the simulator created exactly
/// `made(acquires so far)` sandboxes and `settled` holds: once one exists,
/// the provider deletes it on its own runtime.
fn drop_acquire_at_every_point<'a, F: Future<Output = HookResult<Lease>> + 'a>(
    bed: &Bed,
    config: &Value,
    acquire: impl Fn() -> F,
    returned: impl Fn(&Lease),
    made: impl Fn(usize) -> usize,
    settled: impl Fn(&createos_sim::Ledger) -> bool,
) {
    let runtime = host_runtime();
    let (requests, lease) = requests_of(bed, &runtime, &acquire);
    returned(&lease);
    wait(bed.provider.destroy_lease(bed.lease_params(config, &lease))).unwrap();
    let mut acquires = 1;
    let mut finish = |outcome: Option<HookResult<Lease>>, what: &str| {
        if let Some(result) = outcome {
            let lease = result.unwrap_or_else(|error| panic!("{what}: {error}"));
            returned(&lease);
            wait(bed.provider.destroy_lease(bed.lease_params(config, &lease))).unwrap();
        }
        acquires += 1;
        let expected = made(acquires);
        bed.wait_for_ledger(what, |ledger| ledger.sandboxes.len() == expected && settled(ledger));
    };
    for polls in 1.. {
        let outcome = runtime.block_on(DropAfter { future: Some(Box::pin(acquire())), polls });
        let completed = outcome.is_some();
        finish(outcome, &format!("acquire dropped after {polls} polls"));
        if completed {
            break;
        }
    }
    for after in 0..=requests {
        let before = bed.ledger().requests.len();
        let outcome = runtime.block_on(drop_after_requests(bed, Box::pin(acquire()), before, after));
        finish(outcome, &format!("acquire dropped after {after} of {requests} requests"));
    }
}

#[test]
fn dropping_an_async_acquire_at_any_point_leaves_no_live_sandbox() {
    let bed = Bed::new();
    let config = bed.config(json!({}));
    let acquire = || bed.provider.acquire_lease(bed.acquire_params(&config), CreationRecorder::discard());
    // The discarding recorder accepts every creation, so every acquire,
    // cancelled or not, creates exactly one sandbox.
    let made = |acquires| acquires;
    drop_acquire_at_every_point(&bed, &config, acquire, |_| (), made, |ledger| ledger.leaked().is_empty());
}

/// Polls `future` once, waits (bounded) until it is woken, which for a
/// provider's hook means its result has reached the future, then drops it
/// without polling again: the host walked away just as the answer arrived.
/// `Some(result)` if it was ready at the first poll.
fn drop_once_answered<T>(future: CallFuture<'_, T>) -> Option<HookResult<T>> {
    struct Signal(Mutex<std::sync::mpsc::Sender<()>>);
    impl std::task::Wake for Signal {
        fn wake(self: Arc<Self>) {
            let _ = self.0.lock().unwrap().send(());
        }
    }
    let (woken, wait) = std::sync::mpsc::channel();
    let waker = Arc::new(Signal(Mutex::new(woken))).into();
    let mut future = future;
    if let Poll::Ready(result) = future.as_mut().poll(&mut Context::from_waker(&waker)) {
        return Some(result);
    }
    wait.recv_timeout(Duration::from_secs(20)).expect("the hook's future is woken once its result is there");
    None
}

/// An acquire whose lease reached its future, which the host then dropped
/// without polling it again: nobody holds that lease, so the provider
/// deletes it, with or without the write-ahead recorder.
#[test]
fn an_acquired_lease_the_host_never_polled_for_is_deleted() {
    let bed = Bed::new();
    let config = bed.config(json!({}));
    let seen = Arc::new(Mutex::new(HashSet::new()));
    for round in 1..=4 {
        let recorder = if round % 2 == 1 { CreationRecorder::discard() } else { recorder(&seen, || Ok(())) };
        let acquire = bed.provider.acquire_lease(bed.acquire_params(&config), recorder);
        let outcome = drop_once_answered(acquire);
        assert!(outcome.is_none(), "an acquire needs the network, so it is not ready at once");
        bed.wait_for_ledger(&format!("acquire {round}'s unclaimed lease deleted"), |ledger| {
            ledger.sandboxes.len() == round && ledger.leaked().is_empty()
        });
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
        let params = bed.command(&config, &lease, command, args);
        bed.provider.execute(params, ByteSource::empty(), ByteSink::discard())
    };
    let (requests, result) = requests_of(&bed, &runtime, || execute("/bin/echo", &["ok"]));
    assert_eq!(result.stdout, "ok\n");
    // A command that never ends by itself: every process created from here
    // on must be terminated by the provider once the future is dropped (the
    // `echo` above ended by itself).
    let ended_by_themselves = bed.ledger().unterminated_processes();
    let all_terminated =
        |ledger: &createos_sim::Ledger| ledger.unterminated_processes() == ended_by_themselves;
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
    wait(bed.provider.destroy_lease(bed.lease_params(&config, &lease))).unwrap();
    assert!(bed.ledger().leaked().is_empty());
}

/// A panic while a hook's future is polled, after it streamed output, is an
/// `internal` error naming the hook; the output still arrived and the
/// provider carries on. (A panic before the future exists is in `abi.rs`.)
#[test]
fn a_panic_while_a_hooks_future_is_polled_is_an_error_and_the_provider_carries_on() {
    let provider = LoadedProvider::load(library("fixture_frozen")).unwrap();
    let runtime = host_runtime();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let kept = Arc::clone(&seen);
    let sink = ByteSink::new(move |_, chunk: &[u8]| kept.lock().unwrap().extend_from_slice(chunk));
    let params =
        ExecuteParams { command: "panic".into(), args: vec!["a".into()].into(), ..Default::default() };
    let error = runtime.block_on(provider.execute(params, ByteSource::empty(), sink)).unwrap_err();
    assert_eq!(error.kind, ErrorKind::INTERNAL);
    assert!(error.message.contains("The provider panicked in the `execute` hook"), "{error}");
    assert_eq!(*seen.lock().unwrap(), b"a");
    let probe = EnvironmentParams { config_json: "{}".into(), ..Default::default() };
    assert!(runtime
        .block_on(provider.acquire_lease(Default::default(), CreationRecorder::discard()))
        .is_ok());
    assert_eq!(provider.health().unwrap().status, "ok");
    drop(probe);
}

#[test]
fn many_concurrent_async_executes_stream_their_output() {
    const LEASES: usize = 10;
    const PER_LEASE: usize = 100;
    let _machine = e2e::machine::saturated();
    let bed = Bed::new();
    // Generous: a thousand processes on a shared two-core machine.
    let config = bed.config(json!({"timeoutMs": e2e::machine::UNHURRIED_TIMEOUT_MS}));
    let leases: Vec<_> = (0..LEASES).map(|_| bed.acquire(&config)).collect();
    let provider = LoadedProvider::load(library("createos_provider")).unwrap();
    let runtime = host_runtime();
    let outputs = runtime.block_on(async {
        let mut running = Vec::new();
        for (index, lease) in (0..LEASES * PER_LEASE).map(|i| (i, &leases[i % LEASES])) {
            let script = format!("echo out-{index}; echo err-{index} >&2");
            let chunks = Arc::new(Mutex::new(Vec::new()));
            let kept = Arc::clone(&chunks);
            let sink = ByteSink::new(move |stream, chunk: &[u8]| {
                kept.lock().unwrap().push((stream, chunk.to_vec()))
            });
            let params = bed.command(&config, lease, "/bin/sh", &["-c", &script]);
            let execution = provider.execute(params, ByteSource::empty(), sink);
            running.push(tokio::spawn(async move {
                let result = execution.await;
                let chunks = std::mem::take(&mut *chunks.lock().unwrap());
                (index, chunks, result)
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
        wait(bed.provider.destroy_lease(bed.lease_params(&config, lease))).unwrap();
    }
    assert!(bed.ledger().leaked().is_empty());
}

/// Waits once before it is ready (waking itself), with no runtime of its
/// own: an await point inside the host's record, wherever it is polled.
struct YieldOnce(bool);

impl Future for YieldOnce {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0 {
            return Poll::Ready(());
        }
        self.0 = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

/// A test recorder: accepts every creation request leaving, and hands each
/// created lease to `created`.
struct OnCreated<C>(C);

impl<C: FnMut(&Lease) -> HookFuture<()> + Send + 'static> RecordCreation for OnCreated<C> {
    fn sending(&mut self) -> HookFuture<()> {
        ready(Ok(()))
    }

    fn created(&mut self, lease: &Lease) -> HookFuture<()> {
        (self.0)(lease)
    }
}

/// A recorder whose record of each created lease is `created`'s future.
fn on_created(created: impl FnMut(&Lease) -> HookFuture<()> + Send + 'static) -> CreationRecorder {
    CreationRecorder::new(OnCreated(created))
}

/// A recorder keeping every lease id it is handed in `seen` (after one
/// await point), answering `answer` for each.
fn recorder(
    seen: &Arc<Mutex<HashSet<String>>>,
    answer: impl Fn() -> HookResult<()> + Send + Sync + 'static,
) -> CreationRecorder {
    let (seen, answer) = (Arc::clone(seen), Arc::new(answer));
    on_created(move |lease: &Lease| -> HookFuture<()> {
        let (id, seen, answer) = (lease_id(lease), Arc::clone(&seen), Arc::clone(&answer));
        Box::pin(async move {
            YieldOnce(false).await;
            seen.lock().unwrap().insert(id);
            answer()
        })
    })
}

/// True when every sandbox the simulator ever created was handed to the
/// recorder, and none is alive.
fn all_recorded_and_deleted(ledger: &createos_sim::Ledger, seen: &Mutex<HashSet<String>>) -> bool {
    let seen = seen.lock().unwrap();
    ledger.leaked().is_empty() && ledger.sandboxes.iter().all(|sandbox| seen.contains(&sandbox.id))
}

#[test]
fn dropping_an_async_recording_acquire_at_any_point_leaves_no_sandbox_the_recorder_did_not_see() {
    let bed = Bed::new();
    let config = bed.config(json!({}));
    let seen = Arc::new(Mutex::new(HashSet::new()));
    let acquire = || bed.provider.acquire_lease(bed.acquire_params(&config), recorder(&seen, || Ok(())));
    // A returned lease was recorded before it was returned; every sandbox
    // was handed to the recorder before anything else, and none is alive.
    let returned = |lease: &Lease| assert!(seen.lock().unwrap().contains(&lease_id(lease)), "recorded first");
    drop_acquire_at_every_point(
        &bed,
        &config,
        acquire,
        returned,
        |acquires| acquires,
        |ledger| all_recorded_and_deleted(ledger, &seen),
    );
}

#[test]
fn a_refusing_or_panicking_async_recorder_fails_the_hook_and_leaves_no_live_sandbox() {
    let bed = Bed::new();
    let config = bed.config(json!({}));
    let runtime = host_runtime();
    let seen = Arc::new(Mutex::new(HashSet::new()));
    let refuse = || Err(ProviderError::new(ErrorKind::API, "the host's ledger is full"));
    // Refused: the sandbox is deleted and the hook fails with the host's error.
    let refused = recorder(&seen, refuse);
    let error = runtime.block_on(bed.provider.acquire_lease(bed.acquire_params(&config), refused));
    let error = error.unwrap_err();
    assert!(error.message.contains("the host's ledger is full"), "{error}");
    bed.wait_for_ledger("the refused acquire's sandbox deleted", |ledger| {
        ledger.sandboxes.len() == 1 && all_recorded_and_deleted(ledger, &seen)
    });
    let probed = runtime.block_on(bed.provider.probe(bed.env(&config), recorder(&seen, refuse)));
    assert!(probed.unwrap_err().message.contains("the host's ledger is full"));
    bed.wait_for_ledger("the refused probe's sandbox deleted", |ledger| {
        ledger.sandboxes.len() == 2 && all_recorded_and_deleted(ledger, &seen)
    });
    // A host that panics making the record's future, or while it is polled:
    // an internal error, and the sandbox deleted all the same.
    let panics_now = on_created(|_: &Lease| -> HookFuture<()> { panic!("host ledger exploded") });
    let panics_later = on_created(|_: &Lease| -> HookFuture<()> {
        Box::pin(async { panic!("host ledger exploded later") })
    });
    for (index, panicking) in [panics_now, panics_later].into_iter().enumerate() {
        let result = runtime.block_on(bed.provider.acquire_lease(bed.acquire_params(&config), panicking));
        let error = result.unwrap_err();
        assert_eq!(error.kind, ErrorKind::INTERNAL, "{error}");
        assert!(error.message.contains("The host panicked while recording a created lease."), "{error}");
        assert!(!error.message.contains("exploded"), "the host's panic text stays on the host side");
        bed.wait_for_ledger("the panicking recorder's sandbox deleted", |ledger| {
            ledger.sandboxes.len() == 3 + index && ledger.leaked().is_empty()
        });
    }
    // The provider carries on.
    let lease = runtime
        .block_on(bed.provider.acquire_lease(bed.acquire_params(&config), recorder(&seen, || Ok(()))))
        .expect("a recorder that accepts");
    wait(bed.provider.destroy_lease(bed.lease_params(&config, &lease))).unwrap();
    assert!(bed.ledger().leaked().is_empty());
}

#[test]
fn a_record_that_needs_the_hosts_runtime_is_spawned_there_and_awaited_by_the_provider() {
    let bed = Bed::new();
    let config = bed.config(json!({}));
    let runtime = host_runtime();
    let seen = Arc::new(Mutex::new(HashSet::new()));
    // The host's record needs the host's tokio (its timer here, a database
    // client in a real host). Polled as it is on the provider's runtime, it
    // finds no reactor: the panic is an internal error and the sandbox is
    // deleted.
    let unspawned = on_created(|_: &Lease| -> HookFuture<()> {
        Box::pin(async {
            tokio::time::sleep(Duration::ZERO).await;
            Ok(())
        })
    });
    let result = runtime.block_on(bed.provider.acquire_lease(bed.acquire_params(&config), unspawned));
    assert_eq!(result.unwrap_err().kind, ErrorKind::INTERNAL);
    bed.wait_for_ledger("the unrecorded sandbox deleted", |ledger| {
        ledger.sandboxes.len() == 1 && ledger.leaked().is_empty()
    });
    // Spawned on the host's runtime, the provider awaits its `JoinHandle`.
    let (host, kept) = (runtime.handle().clone(), Arc::clone(&seen));
    let spawned = on_created(move |lease: &Lease| -> HookFuture<()> {
        let (id, kept) = (lease_id(lease), Arc::clone(&kept));
        let task = host.spawn(async move {
            tokio::time::sleep(Duration::ZERO).await;
            kept.lock().unwrap().insert(id);
        });
        Box::pin(async move { task.await.map_err(|_| ProviderError::internal("the host's record failed")) })
    });
    let lease = runtime
        .block_on(bed.provider.acquire_lease(bed.acquire_params(&config), spawned))
        .expect("the record ran on the host's runtime");
    assert!(seen.lock().unwrap().contains(&lease_id(&lease)));
    wait(bed.provider.destroy_lease(bed.lease_params(&config, &lease))).unwrap();
    assert!(bed.ledger().leaked().is_empty());
}

/// One sync operation of `mappings`, with `commands` after an inbound one.
fn sync_params(
    bed: &Bed,
    (config, lease): (&Value, &Lease),
    direction: SyncDirection,
    mappings: Vec<SyncMapping>,
    commands: &[&str],
) -> SyncParams {
    let commands =
        commands.iter().map(|command| PostUploadCommand { command: (*command).into(), ..Default::default() });
    SyncParams {
        lease: bed.lease_params(config, lease),
        direction,
        operations: vec![SyncOperation {
            id: "op".into(),
            mappings: mappings.into(),
            post_upload_commands: commands.collect(),
        }]
        .into(),
    }
}

fn directory(source: &Path, target: &Path) -> SyncMapping {
    SyncMapping {
        kind: "directory".into(),
        source_path: source.to_str().unwrap().into(),
        target_path: target.to_str().unwrap().into(),
        ..Default::default()
    }
}

/// Every file under `root`, relative, with its bytes.
fn tree(root: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files = Vec::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                pending.push(path);
            } else {
                let relative = path.strip_prefix(root).unwrap().to_str().unwrap().to_owned();
                files.push((relative, std::fs::read(&path).unwrap()));
            }
        }
    }
    files.sort();
    files
}

fn counts(result: &SyncResult) -> Vec<(u64, u64)> {
    result.operations.iter().map(|op| (op.files_transferred, op.bytes_transferred)).collect()
}

#[test]
fn a_sync_round_trip_brings_the_files_back_and_a_dropped_sync_leaves_the_lease_usable() {
    let bed = Bed::new();
    let config = bed.config(json!({"reuseLease": true, "timeoutMs": 120_000}));
    let lease = bed.acquire(&config);
    let runtime = host_runtime();
    let host = tempfile::tempdir().unwrap();
    let source = host.path().join("source");
    std::fs::create_dir_all(source.join("deep")).unwrap();
    std::fs::write(source.join("a.txt"), "alpha\n").unwrap();
    std::fs::write(source.join("deep/b.bin"), (0..=255u8).cycle().take(10_000).collect::<Vec<u8>>()).unwrap();
    let workspace = Path::new("/paperclip-workspace");
    let inbound = |target: &str, commands: &[&str]| {
        let mapping = directory(&source, &workspace.join(target));
        sync_params(&bed, (&config, &lease), SyncDirection::In, vec![mapping], commands)
    };
    let outbound = |from: &str, to: &str| {
        let mapping = directory(&workspace.join(from), &host.path().join(to));
        sync_params(&bed, (&config, &lease), SyncDirection::Out, vec![mapping], &[])
    };
    // A round trip brings back the source's files.
    let synced_in = runtime.block_on(bed.provider.sync_files(inbound("blocking", &[]))).unwrap();
    let synced_out = runtime.block_on(bed.provider.sync_files(outbound("blocking", "back"))).unwrap();
    assert_eq!(counts(&synced_out), counts(&synced_in));
    assert_eq!(tree(&host.path().join("back")), tree(&source));
    let blocking_in = synced_in;
    // Dropped after the provider's k-th request, for every request an
    // inbound sync with a post-upload command makes, and after its first
    // poll: the sync stops (its command terminated, its scratch removed),
    // and the lease stays usable.
    let (requests, _) =
        requests_of(&bed, &runtime, || bed.provider.sync_files(inbound("dropped", &["echo done"])));
    let ended_by_themselves = bed.ledger().unterminated_processes();
    let all_terminated =
        |ledger: &createos_sim::Ledger| ledger.unterminated_processes() == ended_by_themselves;
    // Dropped once its post-upload command runs: the command's process is
    // terminated (with no other sync under way, so no other can end it).
    let sync = bed.provider.sync_files(inbound("dropped", &["sleep 300"]));
    let outcome = runtime.block_on(drop_when(&bed, sync, |ledger| !all_terminated(ledger)));
    assert!(outcome.is_none(), "a sync with a 300 s command does not end: {outcome:?}");
    bed.wait_for_ledger("the dropped sync's command terminated", all_terminated);
    let outcome = runtime.block_on(DropAfter {
        future: Some(bed.provider.sync_files(inbound("dropped", &["sleep 300"]))),
        polls: 1,
    });
    assert!(outcome.is_none(), "a sync with a 300 s command does not end after one poll");
    for after in 0..requests {
        let before = bed.ledger().requests.len();
        let sync = bed.provider.sync_files(inbound("dropped", &["sleep 300"]));
        let outcome = runtime.block_on(drop_after_requests(&bed, sync, before, after));
        assert!(outcome.is_none(), "dropped after {after} of {requests}: {outcome:?}");
    }
    bed.wait_for_ledger("every dropped sync's command terminated", all_terminated);
    // An outbound sync dropped at its first requests.
    for after in 0..3 {
        let before = bed.ledger().requests.len();
        let sync = bed.provider.sync_files(outbound("blocking", "dropped-out"));
        let _ = runtime.block_on(drop_after_requests(&bed, sync, before, after));
    }
    let again = runtime
        .block_on(bed.provider.sync_files(outbound("blocking", "again")))
        .expect("the lease is still usable");
    assert_eq!(counts(&again), counts(&blocking_in));
    assert_eq!(tree(&host.path().join("again")), tree(&source));
    let synced = runtime.block_on(bed.provider.sync_files(inbound("again", &["echo done"])));
    assert_eq!(counts(&synced.expect("the lease still takes files and runs commands")), counts(&blocking_in));
    wait(bed.provider.destroy_lease(bed.lease_params(&config, &lease))).unwrap();
    assert!(bed.ledger().leaked().is_empty());
}

/// The host's own acquire (`Host::acquire`), the write-ahead record
/// crossing as the recorder's two moments: dropped at any point
/// (after N polls, after each of the provider's requests), it leaves no live
/// sandbox, and the ledger holds one row per acquire, whose lease id, once
/// the record was committed, names the sandbox the simulator made.
#[test]
fn dropping_the_hosts_async_acquire_at_any_point_leaves_no_sandbox_and_a_row_per_call() {
    use provider_host::{
        environment::Environment,
        host::Host,
        store::sqlite::Ledger,
        store::{LeaseState, Owner},
    };
    let bed = Bed::new();
    let config = bed.config(json!({}));
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(&dir.path().join("ledger.sqlite3")).unwrap();
    let harness = Environment::new(COMPANY, ENVIRONMENT, config.clone());
    let host = Host::new(&bed.provider, &ledger, &harness, Owner::Lifecycle, "run-1");
    let acquire = || async { host.acquire().await.map(|held| held.lease) };
    // A creation request leaves only once the provider heard `creating` is
    // committed: an acquire dropped before that sends nothing, and its row
    // stays (or goes back to) `acquiring`. So the sandboxes made are the
    // rows past `acquiring`.
    let sent = |_| ledger.list().unwrap().iter().filter(|row| row.state != LeaseState::Acquiring).count();
    drop_acquire_at_every_point(&bed, &config, acquire, |_| (), sent, |sim| sim.leaked().is_empty());

    let rows = ledger.list().unwrap();
    let made: HashSet<String> = bed.ledger().sandboxes.iter().map(|sandbox| sandbox.id.clone()).collect();
    let named: Vec<&str> = rows.iter().filter_map(|row| row.provider_lease_id.as_deref()).collect();
    assert!(named.iter().all(|id| made.contains(*id)), "{named:?} not all among {made:?}");
    assert!(named.len() >= 2, "the completed acquires at least are named: {rows:?}");
    assert!(
        rows.iter().any(|row| row.state == LeaseState::Acquiring),
        "an acquire dropped at its first poll sent nothing: {rows:?}"
    );
    for row in &rows {
        match (&row.provider_lease_id, row.state) {
            // Completed: the lease was handed over as active.
            (Some(_), LeaseState::Active) => {}
            // Dropped after the provider returned it, while its `active`
            // record committed: the host destroyed it.
            (Some(_), LeaseState::Destroyed) => {}
            // Dropped before its creation request left: nothing exists.
            (None, LeaseState::Acquiring) => {}
            // Dropped after the request left, before or after its reply was
            // recorded (the provider deleted what it made): `creating`, for
            // a sweep to resolve.
            (_, LeaseState::Creating) => {}
            _ => panic!("unexpected row {row:?}"),
        }
    }
}

/// A SQLite ledger whose first write that `hold_from` picks (and every
/// write after it) waits for the test to let it commit: the window between
/// the host submitting a record and learning it is durable, held open.
struct HeldWrites {
    ledger: provider_host::Ledger,
    hold_from: fn(&provider_host::store::Write) -> bool,
    held: Mutex<Vec<(provider_host::store::Write, provider_host::store::Done)>>,
}

impl HeldWrites {
    fn open(dir: &Path, hold_from: fn(&provider_host::store::Write) -> bool) -> Self {
        let ledger = provider_host::Ledger::open(&dir.join("ledger.sqlite3")).unwrap();
        HeldWrites { ledger, hold_from, held: Mutex::new(Vec::new()) }
    }

    fn holding(&self) -> bool {
        !self.held.lock().unwrap().is_empty()
    }

    /// Commits the held writes in order, each durable before this returns.
    fn commit_held(&self) {
        for (write, done) in std::mem::take(&mut *self.held.lock().unwrap()) {
            done(self.ledger.write(write));
        }
    }
}

impl provider_host::LeaseStore for HeldWrites {
    fn host_name(&self) -> String {
        self.ledger.host_name()
    }
    fn patrol_interval(&self) -> Duration {
        self.ledger.patrol_interval()
    }
    fn write(&self, write: provider_host::store::Write) -> Result<i64, provider_host::LedgerError> {
        self.ledger.write(write)
    }
    fn get(&self, row: i64) -> Result<Option<provider_host::LeaseRecord>, provider_host::LedgerError> {
        self.ledger.get(row)
    }
    fn find(
        &self,
        id: &str,
        company_id: &str,
        environment_id: &str,
    ) -> Result<Option<provider_host::LeaseRecord>, provider_host::LedgerError> {
        self.ledger.find(id, company_id, environment_id)
    }
    fn list(&self) -> Result<Vec<provider_host::LeaseRecord>, provider_host::LedgerError> {
        self.ledger.list()
    }
    fn left_behind(
        &self,
        whose: provider_host::store::Whose,
    ) -> Result<Vec<provider_host::LeaseRecord>, provider_host::LedgerError> {
        self.ledger.left_behind(whose)
    }
    fn take_over(
        &self,
        records: &[provider_host::LeaseRecord],
    ) -> Result<Vec<provider_host::LeaseRecord>, provider_host::LedgerError> {
        self.ledger.take_over(records)
    }
    fn budget_group(&self) -> Result<usize, provider_host::LedgerError> {
        self.ledger.budget_group()
    }
    fn submit(&self, write: provider_host::store::Write, done: provider_host::store::Done) {
        // Held from the picked write on, every later write after it, so the
        // store commits them in the order they were submitted.
        let mut held = self.held.lock().unwrap();
        if !held.is_empty() || (self.hold_from)(&write) {
            held.push((write, done));
        } else {
            self.ledger.submit(write, done);
        }
    }
    fn queue(&self, write: provider_host::store::Write, executed: provider_host::store::Done) {
        self.ledger.queue(write, executed)
    }
}

/// Runs `host`'s acquire until `store` holds a write of it, then drops it.
fn drop_acquire_once_held(
    runtime: &tokio::runtime::Runtime,
    host: &provider_host::Host<'_>,
    store: &HeldWrites,
) {
    runtime.block_on(async {
        let mut acquire = std::pin::pin!(host.acquire());
        let mut tick = tokio::time::interval(Duration::from_millis(1));
        loop {
            tokio::select! {
                result = &mut acquire => panic!("the acquire ended with its record held: {result:?}"),
                _ = tick.tick() => if store.holding() { break },
            }
        }
    });
}

/// The host's acquire dropped after it submitted the `creating` record and
/// before the provider heard the record was durable: the provider sends no
/// creation request, and the row says so (`acquiring`, which a sweep closes
/// without a word), not `creating` (a creation that may exist).
#[test]
fn an_acquire_dropped_while_its_creating_record_commits_sends_nothing_and_stays_acquiring() {
    use provider_host::{environment::Environment, host::Host, store::Write, LeaseState, LeaseStore, Owner};
    let bed = Bed::new();
    let config = bed.config(json!({}));
    let dir = tempfile::tempdir().unwrap();
    let store = HeldWrites::open(dir.path(), |write| {
        matches!(write, Write::SetState { state: LeaseState::Creating, .. })
    });
    let environment = Environment::new(COMPANY, ENVIRONMENT, config.clone());
    let host = Host::new(&bed.provider, &store, &environment, Owner::Lifecycle, "run-1");
    let runtime = host_runtime();
    let requests_before = bed.ledger().requests.len();
    drop_acquire_once_held(&runtime, &host, &store);
    // The acquire is dropped; now the record commits and its answer finds
    // nobody waiting.
    store.commit_held();
    let rows = store.list().unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].state, LeaseState::Acquiring, "{rows:?}");
    // An acquire completed after it shows the provider is still serving, and
    // its creation is the only one the simulator saw.
    let store_for_completion = provider_host::Ledger::open(&dir.path().join("second.sqlite3")).unwrap();
    let second = Host::new(&bed.provider, &store_for_completion, &environment, Owner::Lifecycle, "run-2");
    let held = runtime.block_on(second.acquire()).expect("a later acquire succeeds");
    assert_eq!(bed.ledger().sandboxes.len(), 1, "only the completed acquire created a sandbox");
    assert!(bed.ledger().requests.len() > requests_before);
    runtime.block_on(second.destroy(&held)).unwrap();
}

/// The host's acquire dropped after the provider returned the lease, while
/// its `active` record commits: nobody holds the lease, so the host
/// destroys it, and its row says so (`destroyed`) after the `active` record.
#[test]
fn an_acquire_dropped_while_its_active_record_commits_destroys_the_lease_and_records_it() {
    use provider_host::{environment::Environment, host::Host, store::Write, LeaseState, LeaseStore, Owner};
    let bed = Bed::new();
    let config = bed.config(json!({}));
    let dir = tempfile::tempdir().unwrap();
    let store = HeldWrites::open(dir.path(), |write| {
        matches!(write, Write::SetLease { state: LeaseState::Active, .. })
    });
    let environment = Environment::new(COMPANY, ENVIRONMENT, config.clone());
    let host = Host::new(&bed.provider, &store, &environment, Owner::Lifecycle, "run-1");
    let runtime = host_runtime();
    drop_acquire_once_held(&runtime, &host, &store);
    // Dropped: the host destroyed the lease as it let go of it.
    assert!(bed.ledger().leaked().is_empty(), "{:?}", bed.ledger().leaked());
    assert_eq!(bed.ledger().sandboxes.len(), 1);
    store.commit_held();
    let rows = store.list().unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].state, LeaseState::Destroyed, "{rows:?}");
    assert_eq!(rows[0].provider_lease_id.as_deref(), Some(bed.ledger().sandboxes[0].id.as_str()));
}
