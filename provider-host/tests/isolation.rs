//! The isolated provider through the library: the fixture provider in
//! worker processes, crashing on demand. The host survives every crash, the
//! calls in flight fail with one line naming the signal and the hook, the
//! next call starts a new worker, and the ledger keeps what the dead worker
//! knew only in memory.
//!
//! This test binary is its own workers' program, as a host's binary is: its
//! `main` calls [`run_worker_if_requested`] first, so it runs its tests
//! itself (`harness = false`, libtest-mimic) and the isolated providers here
//! start workers with the default options' program, this executable.

use createos_sim::{FaultKind, FaultRule, FaultTrigger, SimConfig, Simulator};
use e2e::library;
use libtest_mimic::{Arguments, Trial};
use provider_abi::{
    ready, AcquireParams, ByteSink, ByteSource, CreationRecorder, ErrorKind, ExecuteParams, Hook, HookFuture,
    Lease, LeaseParams, LogLevel, LogSink, OutputStream, Provider, ProviderError, RecordCreation,
    SetupParams,
};
use provider_host::{
    environment::Environment,
    host::{Host, Released},
    isolation::{is_worker_failure, run_worker_if_requested, IsolatedProvider, IsolationOptions, Limits},
    loader::LoadedProvider,
    store::sqlite::Ledger,
    store::{LeaseState, LeaseStore, Owner},
    sweep::{sweep, Scope, SweepSecrets},
    wait, RemoteCommand,
};
use serde_json::json;
use std::{
    process::{Command, ExitCode, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

/// A test of this file as a libtest-mimic trial named after its function.
macro_rules! trial {
    ($test:ident) => {
        Trial::test(stringify!($test), || {
            $test();
            Ok(())
        })
    };
}

fn main() -> ExitCode {
    run_worker_if_requested();
    let tests = vec![
        trial!(a_worker_started_by_hand_says_in_one_line_what_it_lacks),
        trial!(each_crash_fails_the_call_in_flight_in_one_line_and_the_next_call_starts_a_new_worker),
        trial!(a_hook_past_its_deadline_gets_its_worker_killed_and_restarted),
        trial!(the_worker_inherits_no_stdin_and_only_the_variables_the_schema_names),
        trial!(both_creation_moments_round_trip_to_the_host_before_the_hook_goes_on),
        trial!(creations_run_in_creation_workers_up_to_their_bound),
        trial!(many_threads_call_at_once_and_each_gets_its_own_output),
        trial!(a_lease_poisoned_before_a_crash_stays_poisoned_after_it),
        trial!(a_lease_handed_over_as_unconfirmed_is_handed_to_every_new_worker_until_destroyed),
        trial!(a_lease_whose_command_died_with_the_worker_is_destroyed_not_reused),
        trial!(a_command_left_running_does_not_hold_up_the_news_of_its_workers_death),
        trial!(the_worker_inherits_no_other_descriptor_of_the_host),
        trial!(a_library_the_worker_cannot_load_is_refused_in_one_line),
        trial!(a_worker_told_a_hash_loads_only_a_library_with_that_hash),
        trial!(a_worker_killed_while_creations_are_in_flight_leaks_no_sandbox),
        trial!(dropping_an_execute_through_the_worker_terminates_its_command),
        trial!(the_worker_serves_the_hooks_of_the_librarys_table),
    ];
    libtest_mimic::run(&Arguments::from_args(), tests).exit_code()
}

/// Options with limits small enough that a runaway allocation or a spin
/// ends quickly; the worker program is this executable.
fn options() -> IsolationOptions {
    IsolationOptions {
        limits: Limits { address_space: Some(4 << 30), cpu_seconds: Some(1), open_files: Some(64) },
        ..IsolationOptions::default()
    }
}

/// Options for the CreateOS provider's workers: the fixture limits, but CPU
/// enough for a provider with its own runtime.
fn createos_options() -> IsolationOptions {
    IsolationOptions { limits: Limits { cpu_seconds: Some(600), ..options().limits }, ..options() }
}

fn start(options: IsolationOptions) -> IsolatedProvider {
    IsolatedProvider::start(library("fixture_provider"), options).expect("start the worker")
}

/// Output chunks as a sink collects them.
type Chunks = Arc<Mutex<Vec<String>>>;

/// A sink keeping each chunk as text, and what it keeps.
fn collect() -> (ByteSink, Chunks) {
    let chunks = Chunks::default();
    let kept = Arc::clone(&chunks);
    let sink = ByteSink::new(move |_: OutputStream, chunk: &[u8]| {
        kept.lock().unwrap().push(String::from_utf8_lossy(chunk).into_owned())
    });
    (sink, chunks)
}

/// A host-side output callback that drops everything.
fn ignore() -> impl FnMut(OutputStream, &[u8]) + Send {
    |_: OutputStream, _: &[u8]| {}
}

fn lease_params(id: &str) -> LeaseParams {
    LeaseParams {
        provider_lease_id: Some(id.into()).into(),
        metadata_json: "{}".into(),
        ..Default::default()
    }
}

/// Runs `command` with `args` through `provider`, returning the result and
/// the chunks that arrived.
fn execute(
    provider: &dyn Provider,
    command: &str,
    args: &[&str],
) -> (Result<provider_abi::ExecuteResult, ProviderError>, Vec<String>) {
    let params = ExecuteParams {
        lease: lease_params("lease-1"),
        command: command.into(),
        args: args.iter().map(|arg| (*arg).into()).collect(),
        ..Default::default()
    };
    let (sink, chunks) = collect();
    let result = wait(provider.execute(params, ByteSource::empty(), sink));
    let chunks = chunks.lock().unwrap().clone();
    (result, chunks)
}

/// Polls `check` until it gives a value or `limit` passes (a guard against
/// a hang, not a measurement).
fn poll<T>(limit: Duration, mut check: impl FnMut() -> Option<T>) -> Option<T> {
    let until = Instant::now() + limit;
    loop {
        if let Some(value) = check() {
            return Some(value);
        }
        if Instant::now() > until {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Polls `condition` until it holds; panics after `limit`.
fn wait_until(what: &str, limit: Duration, mut condition: impl FnMut() -> bool) {
    assert!(poll(limit, || condition().then_some(())).is_some(), "timed out waiting until {what}");
}

/// A worker started by hand, without its host: one line on stderr says what
/// it lacks (the control socket, or a library), and it exits 2.
fn a_worker_started_by_hand_says_in_one_line_what_it_lacks() {
    let library = library("fixture_provider");
    let this = std::env::current_exe().unwrap();
    let cases: [(&[&std::ffi::OsStr], &str); 3] = [
        (&["__worker".as_ref(), library.as_os_str()], "no control socket on file descriptor 3"),
        (&["__worker".as_ref()], "no provider library given"),
        (&["__worker".as_ref(), library.as_os_str(), "--sha256".as_ref()], "--sha256 without a hash"),
    ];
    for (args, lacking) in cases {
        let output = Command::new(&this).args(args).stdin(Stdio::null()).output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(output.stdout.is_empty(), "{args:?}: no test ran");
        assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
        assert!(stderr.starts_with("provider worker: ") && stderr.contains(lacking), "{args:?}: {stderr}");
    }
}

fn each_crash_fails_the_call_in_flight_in_one_line_and_the_next_call_starts_a_new_worker() {
    // (command, the signal the line must name)
    let cases = [
        ("crash:segv", "SIGSEGV"),
        ("crash:abort", "SIGABRT"),
        ("crash:stack", "SIGABRT"),
        ("crash:oom", "SIGABRT"),
        // The CPU-time limit (one second here) ends a worker that spins.
        ("crash:spin", "SIGXCPU"),
    ];
    for (command, signal) in cases {
        let provider = start(options());
        let first_pid = provider.worker_pid().expect("a worker runs");
        let (result, chunks) = execute(&provider, command, &["streamed before the crash"]);
        let error = result.expect_err(command);
        assert_eq!(error.kind, ErrorKind::INTERNAL, "{command}: {error:?}");
        assert!(is_worker_failure(&error), "{command}: {error:?}");
        let message = error.message.as_str();
        assert!(message.contains(signal) && message.contains("`execute`"), "{command}: {message}");
        assert!(!message.contains('\n'), "one line: {message}");
        assert_eq!(chunks, ["streamed before the crash"], "{command}: output streams as it arrives");

        assert_eq!(provider.health().expect("a new worker answers").status, "ok", "{command}");
        assert_eq!(provider.workers_started(), 2, "{command}");
        assert_eq!(provider.crashes(), 1, "{command}");
        assert_ne!(provider.worker_pid(), Some(first_pid), "{command}");
    }
}

fn a_hook_past_its_deadline_gets_its_worker_killed_and_restarted() {
    let provider = start(IsolationOptions { deadline: Duration::from_millis(500), ..options() });
    let (result, _) = execute(&provider, "crash:hang", &[]);
    let error = result.unwrap_err();
    assert_eq!(error.kind, ErrorKind::INTERNAL);
    assert!(error.message.contains("deadline") && error.message.contains("`execute`"), "{error:?}");
    let (result, chunks) = execute(&provider, "echo", &["after"]);
    assert_eq!(result.unwrap().exit_code.into_option(), Some(1));
    assert_eq!(chunks, ["after"]);
    assert_eq!(provider.workers_started(), 2);
}

fn the_worker_inherits_no_stdin_and_only_the_variables_the_schema_names() {
    // The fixture's schema names FIXTURE_GREETING (`x-env`); nothing else
    // of this process's environment (PATH, HOME, ...) may reach the worker.
    std::env::set_var("FIXTURE_GREETING", "hello from the host");
    let provider = start(options());
    let (result, _) = execute(&provider, "introspect", &[]);
    let stdout = result.unwrap().stdout.to_string();
    assert!(stdout.contains("env=FIXTURE_GREETING\n"), "{stdout}");
    assert!(stdout.contains("stdin=/dev/null\n"), "{stdout}");
    assert!(stdout.contains("greeting=hello from the host\n"), "{stdout}");
    assert!(stdout.contains("open_files=64\n"), "the open-files limit applies: {stdout}");
}

/// Keeps the moments a creating hook reports (`sending`, then the lease
/// id), refusing the one named in `refuse`.
struct Journal {
    seen: Arc<Mutex<Vec<String>>>,
    refuse: &'static str,
}

impl RecordCreation for Journal {
    fn sending(&mut self) -> HookFuture<()> {
        self.seen.lock().unwrap().push("sending".into());
        match self.refuse {
            "sending" => ready(Err(ProviderError::internal("the ledger is full"))),
            _ => ready(Ok(())),
        }
    }

    fn created(&mut self, lease: &Lease) -> HookFuture<()> {
        self.seen.lock().unwrap().push(lease.provider_lease_id.clone().unwrap().to_string());
        match self.refuse {
            "created" => ready(Err(ProviderError::internal("the ledger is full"))),
            _ => ready(Ok(())),
        }
    }
}

fn both_creation_moments_round_trip_to_the_host_before_the_hook_goes_on() {
    let provider = start(options());
    assert!(provider.supports(Hook::AcquireLease));
    let params = AcquireParams { run_id: "run".into(), ..Default::default() };
    let acquire = |refuse: &'static str| {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let recorder = CreationRecorder::new(Journal { seen: Arc::clone(&seen), refuse });
        let outcome = wait(provider.acquire_lease(params.clone(), recorder));
        let seen = seen.lock().unwrap().clone();
        (outcome, seen)
    };
    let (lease, seen) = acquire("");
    assert_eq!(seen, ["sending".to_owned(), lease.unwrap().provider_lease_id.unwrap().to_string()]);

    // The host's refusal at either moment reaches the provider, whose hook
    // fails with it: before the request, nothing more is reported.
    let (refused, seen) = acquire("sending");
    assert_eq!(refused.unwrap_err().message.as_str(), "the ledger is full");
    assert_eq!(seen, ["sending"]);
    let (refused, seen) = acquire("created");
    assert_eq!(refused.unwrap_err().message.as_str(), "the ledger is full");
    assert_eq!(seen.len(), 2, "{seen:?}");
}

/// Each creation runs in a creation worker, kept for the next one; at
/// the bound, creations share them and all still succeed.
fn creations_run_in_creation_workers_up_to_their_bound() {
    let params = AcquireParams { run_id: "run".into(), ..Default::default() };
    let provider = start(IsolationOptions { creation_workers: 8, ..options() });
    for _ in 0..3 {
        wait(provider.acquire_lease(params.clone(), CreationRecorder::discard())).expect("acquired");
    }
    assert_eq!(provider.creation_workers(), 1, "an idle creation worker is reused");
    let bounded = start(IsolationOptions { creation_workers: 1, ..options() });
    std::thread::scope(|scope| {
        for _ in 0..6 {
            scope.spawn(|| {
                wait(bounded.acquire_lease(params.clone(), CreationRecorder::discard())).expect("acquired")
            });
        }
    });
    assert_eq!(bounded.creation_workers(), 1, "the bound holds");
    assert_eq!(bounded.workers_started(), 1, "the main worker served no creation");
}

fn many_threads_call_at_once_and_each_gets_its_own_output() {
    let provider = start(options());
    std::thread::scope(|scope| {
        for thread in 0..8 {
            let provider = &provider;
            scope.spawn(move || {
                for call in 0..40 {
                    let word = format!("t{thread}c{call}");
                    let (result, chunks) = execute(provider, "echo", &[&word, "x"]);
                    assert_eq!(result.unwrap().stdout.as_str(), format!("{word}x"));
                    assert_eq!(chunks, [word.as_str(), "x"]);
                    assert_eq!(provider.health().unwrap().status, "ok");
                }
            });
        }
    });
    assert_eq!(provider.workers_started(), 1);
}

/// The release rule across a crash, with a provider that cannot be told
/// (the frozen 2.0 fixture has neither `import_unconfirmed` nor
/// `inspect_lease`): a command's cleanup is unconfirmed on worker 1, worker
/// 1 crashes (and with it the provider's memory of that), and a release for
/// reuse through worker 2 still destroys the lease instead of pausing it,
/// because the host's ledger remembers.
fn a_lease_poisoned_before_a_crash_stays_poisoned_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(&dir.path().join("ledger.sqlite3")).unwrap();
    let provider = IsolatedProvider::start(library("fixture_frozen"), options()).expect("start the worker");
    assert!(!provider.supports(Hook::ImportUnconfirmed) && !provider.supports(Hook::InspectLease));
    let config = Environment::new("acme", "dev", json!({"holdOnRelease": true}));
    let host = Host::new(&provider, &ledger, &config, Owner::Command, "seed");
    let poisoned = wait(host.acquire()).unwrap();
    let control = wait(host.acquire()).unwrap();
    let command = RemoteCommand::new("unconfirmed");
    let error = wait(host.execute(&poisoned, command, ByteSource::empty(), &mut ignore())).unwrap_err();
    assert_eq!(error.kind, ErrorKind::CLEANUP_UNCONFIRMED);
    assert_eq!(ledger.get(poisoned.row).unwrap().unwrap().state, LeaseState::Unconfirmed);

    let (crashed, _) = execute(&provider, "crash:abort", &[]);
    assert!(is_worker_failure(&crashed.unwrap_err()));

    match wait(host.release(&poisoned)).unwrap() {
        Released::DestroyedInstead(cause) => assert_eq!(cause.kind, ErrorKind::CLEANUP_UNCONFIRMED),
        other => panic!("an unconfirmed lease was released as {other:?}"),
    }
    assert_eq!(ledger.get(poisoned.row).unwrap().unwrap().state, LeaseState::Destroyed);
    assert_eq!(wait(host.release(&control)).unwrap(), Released::Kept, "worker 2 would have paused it");
    assert_eq!(provider.workers_started(), 2);
}

/// The release rule across a crash with a provider that takes leases over
/// (`import_unconfirmed`): the host hands the poisoned lease to the
/// provider, and every worker started after a crash is handed it again, so
/// the provider itself keeps refusing it until it is destroyed.
fn a_lease_handed_over_as_unconfirmed_is_handed_to_every_new_worker_until_destroyed() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(&dir.path().join("ledger.sqlite3")).unwrap();
    let provider = start(options());
    assert!(provider.supports(Hook::ImportUnconfirmed));
    let config = Environment::new("acme", "dev", json!({"holdOnRelease": true}));
    let host = Host::new(&provider, &ledger, &config, Owner::Command, "seed");
    let poisoned = wait(host.acquire()).unwrap();
    let command = RemoteCommand::new("unconfirmed");
    let error = wait(host.execute(&poisoned, command, ByteSource::empty(), &mut ignore())).unwrap_err();
    assert_eq!(error.kind, ErrorKind::CLEANUP_UNCONFIRMED);
    let unconfirmed = |provider: &IsolatedProvider| {
        wait(provider.inspect_lease(host.params(&poisoned.lease))).unwrap().unconfirmed
    };

    for crash in 1..=2 {
        let (crashed, _) = execute(&provider, "crash:abort", &[]);
        assert!(is_worker_failure(&crashed.unwrap_err()));
        assert!(unconfirmed(&provider), "worker {} was not handed the lease", crash + 1);
    }
    assert_eq!(provider.workers_started(), 3);

    wait(host.destroy(&poisoned)).unwrap();
    let (crashed, _) = execute(&provider, "crash:abort", &[]);
    assert!(is_worker_failure(&crashed.unwrap_err()));
    assert!(!unconfirmed(&provider), "a destroyed lease is not handed to new workers");
}

/// A command whose worker died under it may still be running: the host
/// records the lease unconfirmed and never pauses it for reuse.
fn a_lease_whose_command_died_with_the_worker_is_destroyed_not_reused() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(&dir.path().join("ledger.sqlite3")).unwrap();
    let provider = start(options());
    let config = Environment::new("acme", "dev", json!({"holdOnRelease": true}));
    let host = Host::new(&provider, &ledger, &config, Owner::Command, "died");
    let held = wait(host.acquire()).unwrap();
    let command = RemoteCommand::new("crash:segv");
    let error = wait(host.execute(&held, command, ByteSource::empty(), &mut ignore())).unwrap_err();
    assert!(error.message.contains("SIGSEGV"), "{error:?}");
    assert_eq!(ledger.get(held.row).unwrap().unwrap().state, LeaseState::Unconfirmed);
    assert!(matches!(wait(host.release(&held)).unwrap(), Released::DestroyedInstead(_)));
}

/// A command the provider started and left running holds no descriptor of
/// its worker's control socket (it would keep the socket open after the
/// worker died, and the host, reading it to learn how the worker ended,
/// would hold the failed call until the command exited).
fn a_command_left_running_does_not_hold_up_the_news_of_its_workers_death() {
    let provider = start(options());
    let script = "sleep 60 >/dev/null 2>&1 </dev/null & echo $!";
    let (result, _) = execute(&provider, "/bin/sh", &["-c", script]);
    let sleeper: i32 = result.unwrap().stdout.trim().parse().expect("the sleeper's pid");
    let started = Instant::now();
    let (result, _) = execute(&provider, "crash:segv", &[]);
    let took = started.elapsed();
    // SAFETY: a signal to the process this test started.
    unsafe { libc::kill(sleeper, libc::SIGKILL) };
    assert!(result.unwrap_err().message.contains("SIGSEGV"));
    assert!(took < Duration::from_secs(30), "the crash was reported after {took:?}");
}

/// A descriptor the host opened without close-on-exec reaches neither the
/// worker nor the commands its provider starts.
fn the_worker_inherits_no_other_descriptor_of_the_host() {
    // Above the worker's open-files limit (64), so no descriptor of its own
    // has that number. SAFETY: a new descriptor of this test's own (the
    // first free one from 200), closed below; F_DUPFD leaves it without
    // close-on-exec, as a library of the host might.
    let stray = unsafe { libc::fcntl(2, libc::F_DUPFD, 200) };
    assert!(stray >= 200, "{}", std::io::Error::last_os_error());
    let provider = start(options());
    let probe = format!("test -e /proc/self/fd/{stray} && echo held || echo closed");
    let (result, _) = execute(&provider, "/bin/sh", &["-c", &probe]);
    // SAFETY: the descriptor fcntl opened above.
    unsafe { libc::close(stray) };
    assert_eq!(result.unwrap().stdout.to_string(), "closed\n");
}

fn a_library_the_worker_cannot_load_is_refused_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let bogus = dir.path().join("libbogus.so");
    std::fs::write(&bogus, b"not a library").unwrap();
    let error = IsolatedProvider::start(&bogus, options()).err().expect("refused").to_string();
    assert!(error.contains("cannot load provider") && error.contains("libbogus.so"), "{error}");
    assert!(!error.contains('\n'), "{error}");
}

fn a_worker_told_a_hash_loads_only_a_library_with_that_hash() {
    let library = library("fixture_provider");
    let wrong = IsolationOptions { library_sha256: Some("00".repeat(32)), ..options() };
    let error = IsolatedProvider::start(&library, wrong).err().expect("refused").to_string();
    assert!(error.contains(&format!("not the {} the host checked", "00".repeat(32))), "{error}");
    assert!(error.contains("fixture_provider") && !error.contains('\n'), "{error}");
    let sha256 = provider_host::staging::library_sha256(&library).unwrap();
    let right = IsolationOptions { library_sha256: Some(sha256), ..options() };
    let provider = IsolatedProvider::start(&library, right).expect("the checked library loads");
    assert_eq!(provider.manifest().version.as_str(), "2.0.0");
}

/// A crash of the worker serving other hooks while creations are in flight
/// leaks no sandbox: the simulator holds each creation's reply (the sandbox
/// exists, its id is on the way), the worker serving the other hooks is
/// killed meanwhile, and at the end, once the host destroyed what it holds
/// and swept its ledger, the simulator's live set is empty.
fn a_worker_killed_while_creations_are_in_flight_leaks_no_sandbox() {
    const CREATIONS: usize = 4;
    let sim = Simulator::start(SimConfig { rate_limit: None, ..Default::default() }).unwrap();
    // Long enough that every creation is made before the first reply is
    // released, on a loaded machine too; the test waits for the simulator's
    // live set, never for a time.
    sim.add_fault(FaultRule::new(
        "POST /v1/sandboxes",
        FaultTrigger::from_nth(1),
        FaultKind::DelayReply(Duration::from_secs(5)),
    ));
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(&dir.path().join("ledger.sqlite3")).unwrap();
    let provider = IsolatedProvider::start(library("createos_provider"), createos_options()).unwrap();
    provider.setup(&SetupParams::default(), LogSink::new(|_| {}), LogLevel::Warn).unwrap();
    let mut settings = sim.provider_config(false);
    settings["requestsPerMinute"] = json!(100_000);
    let config = Environment::new("acme", "dev", settings);
    let host = Host::new(&provider, &ledger, &config, Owner::Lifecycle, "in-flight");
    let serving = provider.worker_pid().expect("a worker serves");

    let acquired: Vec<_> = std::thread::scope(|scope| {
        let acquires: Vec<_> = (0..CREATIONS).map(|_| scope.spawn(|| wait(host.acquire()))).collect();
        let made = poll(Duration::from_secs(60), || (sim.live_sandboxes().len() == CREATIONS).then_some(()));
        assert!(made.is_some(), "the simulator made {} of {CREATIONS} sandboxes", sim.live_sandboxes().len());
        // SAFETY: kill(2) on the worker's pid, a child of this process.
        assert_eq!(unsafe { libc::kill(serving as i32, libc::SIGKILL) }, 0);
        acquires.into_iter().map(|acquire| acquire.join().unwrap()).collect()
    });
    for held in acquired.iter().flatten() {
        wait(host.destroy(held)).unwrap();
    }
    let secrets = SweepSecrets::from_config(&provider, &config);
    let swept = sweep(&provider, &ledger, Scope::ThisProcess, &secrets).unwrap();
    let failures: Vec<_> = acquired.iter().filter_map(|outcome| outcome.as_ref().err()).collect();
    assert_eq!(
        sim.live_sandboxes(),
        Vec::<String>::new(),
        "leaked; acquires that failed: {failures:?}; swept: {:?}",
        swept.iter().map(|swept| &swept.outcome).collect::<Vec<_>>()
    );
}

/// Dropping a hook's future cancels the call in the worker, which drops the
/// provider's future: a command that would run for minutes is terminated,
/// and the lease stays usable.
fn dropping_an_execute_through_the_worker_terminates_its_command() {
    let sim = Simulator::start(SimConfig { rate_limit: None, ..Default::default() }).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(&dir.path().join("ledger.sqlite3")).unwrap();
    let provider = IsolatedProvider::start(library("createos_provider"), createos_options()).unwrap();
    provider.setup(&SetupParams::default(), LogSink::new(|_| {}), LogLevel::Warn).unwrap();
    let mut settings = sim.provider_config(true);
    settings["requestsPerMinute"] = json!(100_000);
    settings["timeoutMs"] = json!(600_000);
    let config = Environment::new("acme", "dev", settings);
    let host = Host::new(&provider, &ledger, &config, Owner::Command, "cancel");
    let held = wait(host.acquire()).unwrap();
    let command = |program: &str, arg: &str| RemoteCommand::new(program).args([arg]);
    let ended_by_themselves = sim.ledger().unterminated_processes();
    let created = |ledger: &createos_sim::Ledger| {
        ledger
            .requests
            .iter()
            .filter(|r| createos_sim::path_matches("/v1/sandboxes/*/processes", &r.path))
            .count()
    };
    let before = created(&sim.ledger());
    {
        let mut output = ignore();
        let mut running =
            Box::pin(host.execute(&held, command("/bin/sleep", "600"), ByteSource::empty(), &mut output));
        let mut context = std::task::Context::from_waker(std::task::Waker::noop());
        assert!(
            std::future::Future::poll(running.as_mut(), &mut context).is_pending(),
            "a 600 s command runs"
        );
        wait_until("the command was created", Duration::from_secs(60), || created(&sim.ledger()) > before);
    }
    wait_until("the dropped command was terminated", Duration::from_secs(60), || {
        sim.ledger().unterminated_processes() == ended_by_themselves
    });
    let mut output = ignore();
    let again = wait(host.execute(&held, command("/bin/echo", "again"), ByteSource::empty(), &mut output));
    assert_eq!(again.expect("the lease is still usable").stdout, "again\n");
    wait(host.destroy(&held)).unwrap();
    assert!(sim.ledger().leaked().is_empty());
}

/// Every hook of the library's table crosses the worker protocol but
/// `grant_request_share` (each worker paces its own requests) and the
/// memory hooks (what a worker learns stays in it): the isolated provider
/// supports, and its manifest lists, exactly those.
fn the_worker_serves_the_hooks_of_the_librarys_table() {
    let local = [Hook::GrantRequestShare, Hook::ExportMemory, Hook::ImportMemory];
    for crate_name in ["fixture_provider", "fixture_frozen"] {
        let loaded = LoadedProvider::load(library(crate_name)).unwrap();
        let isolated = IsolatedProvider::start(library(crate_name), options()).expect("start the worker");
        for hook in Hook::ALL {
            let expected = loaded.supports(hook) && !local.contains(&hook);
            assert_eq!(isolated.supports(hook), expected, "{crate_name}: {hook}");
            let listed = isolated.manifest().hooks.iter().any(|name| name == hook.name());
            assert_eq!(listed, expected, "{crate_name}: {hook}");
        }
        let refused =
            [isolated.grant_request_share(500_000).unwrap_err(), isolated.export_memory().unwrap_err()];
        for error in refused {
            assert_eq!(error.kind, ErrorKind::UNSUPPORTED, "{crate_name}");
        }
    }
}
