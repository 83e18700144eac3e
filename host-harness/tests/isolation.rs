//! Isolation mode: the fixture provider in a worker process, crashing on
//! demand. The host survives every crash, the calls in flight fail with one
//! line naming the signal and the hook, the next call starts a new worker,
//! and the ledger keeps what the dead worker knew only in memory.

mod common;

use createos_sim::{FaultKind, FaultRule, FaultTrigger, SimConfig, Simulator};
use host_harness::{
    config_file::harness_environment,
    host::{Host, Released},
    isolation::{is_worker_failure, IsolatedProvider, IsolationOptions, Limits},
    ledger::{LeaseState, Ledger, Owner},
    loader::{library_file_name, LoadedProvider},
    sweep::{sweep, Scope, SweepSecrets},
    wait,
};
use provider_abi::{
    ready, AcquireParams, ByteSink, ByteSource, CreationRecorder, ErrorKind, ExecuteParams, Hook, HookFuture,
    Lease, LeaseParams, LogLevel, LogSink, OutputStream, Provider, ProviderError, RecordCreation,
    SetupParams,
};
use serde_json::json;
use std::{
    path::PathBuf,
    process::{Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

/// The shared library cargo built for fixture crate `name`.
fn fixture(name: &str) -> PathBuf {
    let deps = std::env::current_exe().unwrap().parent().unwrap().to_path_buf();
    let path = deps.join(library_file_name(name));
    assert!(path.exists(), "{} was not built", path.display());
    path
}

/// Options running the harness binary as the worker.
fn options() -> IsolationOptions {
    IsolationOptions {
        program: Some(env!("CARGO_BIN_EXE_host-harness").into()),
        // Small enough that a runaway allocation or a spin ends quickly.
        limits: Limits { address_space: Some(4 << 30), cpu_seconds: Some(1), open_files: Some(64) },
        ..IsolationOptions::default()
    }
}

fn start(options: IsolationOptions) -> IsolatedProvider {
    IsolatedProvider::start(fixture("fixture_provider"), options).expect("start the worker")
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

#[test]
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

#[test]
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

#[test]
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

#[test]
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
#[test]
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

#[test]
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
#[test]
fn a_lease_poisoned_before_a_crash_stays_poisoned_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(&dir.path().join("ledger.sqlite3")).unwrap();
    let provider = IsolatedProvider::start(fixture("fixture_frozen"), options()).expect("start the worker");
    assert!(!provider.supports(Hook::ImportUnconfirmed) && !provider.supports(Hook::InspectLease));
    let config = harness_environment(json!({"holdOnRelease": true}));
    let host = Host::new(&provider, &ledger, &config, Owner::Command, "seed");
    let poisoned = wait(host.acquire()).unwrap();
    let control = wait(host.acquire()).unwrap();
    let command = ExecuteParams { command: "unconfirmed".into(), ..Default::default() };
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
#[test]
fn a_lease_handed_over_as_unconfirmed_is_handed_to_every_new_worker_until_destroyed() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(&dir.path().join("ledger.sqlite3")).unwrap();
    let provider = start(options());
    assert!(provider.supports(Hook::ImportUnconfirmed));
    let config = harness_environment(json!({"holdOnRelease": true}));
    let host = Host::new(&provider, &ledger, &config, Owner::Command, "seed");
    let poisoned = wait(host.acquire()).unwrap();
    let command = ExecuteParams { command: "unconfirmed".into(), ..Default::default() };
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
#[test]
fn a_lease_whose_command_died_with_the_worker_is_destroyed_not_reused() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(&dir.path().join("ledger.sqlite3")).unwrap();
    let provider = start(options());
    let config = harness_environment(json!({"holdOnRelease": true}));
    let host = Host::new(&provider, &ledger, &config, Owner::Command, "died");
    let held = wait(host.acquire()).unwrap();
    let command = ExecuteParams { command: "crash:segv".into(), ..Default::default() };
    let error = wait(host.execute(&held, command, ByteSource::empty(), &mut ignore())).unwrap_err();
    assert!(error.message.contains("SIGSEGV"), "{error:?}");
    assert_eq!(ledger.get(held.row).unwrap().unwrap().state, LeaseState::Unconfirmed);
    assert!(matches!(wait(host.release(&held)).unwrap(), Released::DestroyedInstead(_)));
}

#[test]
fn a_library_the_worker_cannot_load_is_refused_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let bogus = dir.path().join("libbogus.so");
    std::fs::write(&bogus, b"not a library").unwrap();
    let error = IsolatedProvider::start(&bogus, options()).err().expect("refused").to_string();
    assert!(error.contains("cannot load provider") && error.contains("libbogus.so"), "{error}");
    assert!(!error.contains('\n'), "{error}");
}

#[test]
fn a_worker_told_a_hash_loads_only_a_library_with_that_hash() {
    let library = fixture("fixture_provider");
    let wrong = IsolationOptions { library_sha256: Some("00".repeat(32)), ..options() };
    let error = IsolatedProvider::start(&library, wrong).err().expect("refused").to_string();
    assert!(error.contains(&format!("not the {} the host checked", "00".repeat(32))), "{error}");
    assert!(error.contains("fixture_provider") && !error.contains('\n'), "{error}");
    let sha256 = host_harness::staging::library_sha256(&library).unwrap();
    let right = IsolationOptions { library_sha256: Some(sha256), ..options() };
    let provider = IsolatedProvider::start(&library, right).expect("the checked library loads");
    assert_eq!(provider.manifest().version.as_str(), "2.0.0");
}

/// `--isolate` on the command line: the harness survives a provider that
/// crashes in `exec`, reports it in one line and exits 1.
#[test]
fn the_harness_survives_a_crash_under_isolate() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.json");
    std::fs::write(&config, json!({"companyId": "acme", "environmentId": "dev", "config": {}}).to_string())
        .unwrap();
    let lease = dir.path().join("lease.json");
    std::fs::write(&lease, json!({"providerLeaseId": "lease-1", "metadata": {}}).to_string()).unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_host-harness"))
        .args(["--isolate", "--plugin"])
        .arg(fixture("fixture_provider"))
        .arg("--ledger")
        .arg(dir.path().join("ledger.sqlite3"))
        .args(["exec", "--config"])
        .arg(&config)
        .arg("--lease")
        .arg(&lease)
        .args(["--", "crash:segv", "hello"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(String::from_utf8_lossy(&output.stdout).contains("hello"), "the chunk streamed before the crash");
    let line = stderr.lines().find(|line| line.starts_with("error: ")).expect("an error line");
    assert!(line.contains("SIGSEGV") && line.contains("`execute`"), "{stderr}");
}

/// The worker dies with the host (parent-death signal), even when the host
/// is killed outright.
#[test]
fn the_worker_dies_with_the_host() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.json");
    std::fs::write(&config, json!({"companyId": "acme", "environmentId": "dev", "config": {}}).to_string())
        .unwrap();
    let lease = dir.path().join("lease.json");
    std::fs::write(&lease, json!({"providerLeaseId": "lease-1", "metadata": {}}).to_string()).unwrap();
    let mut host = Command::new(env!("CARGO_BIN_EXE_host-harness"))
        .args(["--isolate", "--plugin"])
        .arg(fixture("fixture_provider"))
        .arg("--ledger")
        .arg(dir.path().join("ledger.sqlite3"))
        .args(["exec", "--config"])
        .arg(&config)
        .arg("--lease")
        .arg(&lease)
        .args(["--", "crash:hang"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let worker =
        poll(Duration::from_secs(30), || children(host.id()).into_iter().next()).expect("a worker starts");
    host.kill().unwrap();
    host.wait().unwrap();
    let gone = poll(Duration::from_secs(30), || {
        let state = std::fs::read_to_string(format!("/proc/{worker}/stat")).ok();
        // Gone, or a zombie waiting for init to reap it.
        state
            .is_none_or(|stat| stat.split(") ").nth(1).is_some_and(|rest| rest.starts_with('Z')))
            .then_some(())
    });
    assert!(gone.is_some(), "worker {worker} outlived its host");
}

/// The soak of the issue, sized for CI: lifecycles against the embedded
/// simulator through the CreateOS provider in workers that abort on 1 % of
/// their hook calls (before or after the hook). The harness survives, every
/// crash is reported, no unconfirmed lease is reused, and no sandbox leaks:
/// a crash never cuts another hook's creation short, since each creation
/// runs in a worker of its own.
#[test]
fn a_soak_where_one_call_in_a_hundred_aborts_its_worker_keeps_the_invariants() {
    // The fixture links the CreateOS provider, which exports a root module
    // too: the library must export its own.
    let inspect = Command::new(env!("CARGO_BIN_EXE_host-harness"))
        .args(["--json", "--plugin"])
        .arg(fixture("crashy_createos"))
        .arg("inspect")
        .output()
        .unwrap();
    let manifest: serde_json::Value = serde_json::from_slice(&inspect.stdout).unwrap();
    assert_eq!(manifest["id"], "crashy-createos", "{manifest}");

    let dir = tempfile::tempdir().unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_host-harness"))
        .env("CRASHY_CRASH_SHARE", "0.01")
        .env("RUST_LOG", "warn")
        .args(["--isolate", "--json", "--plugin"])
        .arg(fixture("crashy_createos"))
        .arg("--ledger")
        .arg(dir.path().join("ledger.sqlite3"))
        .args(["soak", "--leases", "200", "--concurrency", "8", "--no-rate-limit"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let summary: serde_json::Value = serde_json::from_str(stdout.lines().last().expect("a summary")).unwrap();
    assert_eq!(output.status.code(), Some(0), "{summary}");
    assert_eq!(summary["invariantsHeld"], true, "{summary}");
    assert_eq!(summary["unconfirmedReused"], 0, "{summary}");
    assert_eq!(summary["panics"], 0, "{summary}");
    assert_eq!(summary["leaked"], 0, "{summary}");

    let announced = stderr.matches("crashy: aborting in `").count();
    let reported = stderr
        .lines()
        .filter(|line| line.contains("WARN") && line.contains("the provider worker (pid"))
        .count();
    assert!(announced > 0, "1 % of some two thousand calls crashed: {summary}");
    assert_eq!(announced, reported, "every crash is reported");
}

/// The child processes of `pid` (every thread's).
fn children(pid: u32) -> Vec<u32> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).into_iter().flatten().flatten();
    tasks
        .filter_map(|task| std::fs::read_to_string(task.path().join("children")).ok())
        .flat_map(|text| text.split_whitespace().filter_map(|pid| pid.parse().ok()).collect::<Vec<_>>())
        .collect()
}

/// Polls `check` until it gives a value or `limit` passes.
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

/// Options for the CreateOS provider's workers: the fixture limits, but CPU
/// enough for a provider with its own runtime.
fn createos_options() -> IsolationOptions {
    IsolationOptions { limits: Limits { cpu_seconds: Some(600), ..options().limits }, ..options() }
}

/// A crash of the worker serving other hooks while creations are in flight
/// leaks no sandbox: the simulator holds each creation's reply (the sandbox
/// exists, its id is on the way), the worker serving the other hooks is
/// killed meanwhile, and at the end, once the host destroyed what it holds
/// and swept its ledger, the simulator's live set is empty.
#[test]
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
    let provider = IsolatedProvider::start(fixture("createos_provider"), createos_options()).unwrap();
    provider.setup(&SetupParams::default(), LogSink::new(|_| {}), LogLevel::Warn).unwrap();
    let mut settings = sim.provider_config(false);
    settings["requestsPerMinute"] = json!(100_000);
    let config = harness_environment(settings);
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

/// `host-harness --isolate` against a simulator this test owns.
struct IsolatedBed {
    sim: Simulator,
    dir: tempfile::TempDir,
    config: PathBuf,
}

impl IsolatedBed {
    fn new() -> IsolatedBed {
        let sim = Simulator::start(SimConfig { rate_limit: None, ..Default::default() }).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let mut provider = sim.provider_config(true);
        provider["requestsPerMinute"] = json!(100_000);
        let config = dir.path().join("config.json");
        let file = json!({"companyId": "acme", "environmentId": "dev", "config": provider});
        std::fs::write(&config, file.to_string()).unwrap();
        IsolatedBed { sim, dir, config }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `host-harness --isolate [--plugin P] --ledger L ARGS...`, each `{config}` replaced.
    fn run(&self, plugin: Option<&PathBuf>, args: &[&str]) -> std::process::Output {
        let mut command = Command::new(env!("CARGO_BIN_EXE_host-harness"));
        command.env_remove("RUST_LOG").arg("--isolate");
        if let Some(plugin) = plugin {
            command.arg("--plugin").arg(plugin);
        }
        let config = self.config.to_str().unwrap();
        let args = args.iter().map(|arg| if *arg == "{config}" { config } else { arg });
        command.arg("--ledger").arg(self.path("ledger.sqlite3")).args(args);
        command.stdin(Stdio::null()).output().unwrap()
    }

    /// Acquires a lease into `lease.json`; its path.
    fn acquire(&self, plugin: Option<&PathBuf>) -> String {
        let output = self.run(plugin, &["acquire", "--config", "{config}"]);
        assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
        let path = self.path("lease.json");
        std::fs::write(&path, &output.stdout).unwrap();
        path.to_str().unwrap().to_owned()
    }
}

/// `exec --isolate` streams a command's stdin to the worker a chunk at a
/// time, as in process: input beyond any bound a frame could hold arrives
/// byte for byte.
#[test]
fn exec_through_the_worker_streams_stdin_of_any_size() {
    let bed = IsolatedBed::new();
    let lease = bed.acquire(None);
    let input: Vec<u8> = (0..70_000_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8).collect();
    let file = bed.path("input.bin");
    std::fs::write(&file, &input).unwrap();
    let stdin = file.to_str().unwrap();
    let output = bed
        .run(None, &["exec", "--config", "{config}", "--lease", &lease, "--stdin", stdin, "--", "sha256sum"]);
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    let remote = String::from_utf8_lossy(&output.stdout).into_owned();
    use sha2::Digest as _;
    let local: String = sha2::Sha256::digest(&input).iter().map(|byte| format!("{byte:02x}")).collect();
    assert_eq!(remote.split_whitespace().next(), Some(local.as_str()), "{remote}");
}

/// `exec --isolate` pulls an endless stdin through the worker a chunk at a
/// time until the command's timeout, in memory far below what buffering the
/// input would take.
#[test]
#[allow(clippy::zombie_processes)] // reaped by wait4, for its peak memory
fn exec_through_the_worker_streams_an_endless_stdin_in_bounded_memory_until_the_timeout() {
    /// Far above the harness's and a worker's own few tens of MiB.
    const PEAK_LIMIT_KIB: i64 = 200 << 10;
    let bed = IsolatedBed::new();
    let lease = bed.acquire(None);
    let config = bed.config.to_str().unwrap();
    let mut harness = Command::new(env!("CARGO_BIN_EXE_host-harness"))
        .env_remove("RUST_LOG")
        .arg("--isolate")
        .arg("--ledger")
        .arg(bed.path("ledger.sqlite3"))
        .args(["exec", "--config", config, "--lease", &lease, "--timeout", "3s", "--stdin", "/dev/zero"])
        .args(["--", "sh", "-c", "cat >/dev/null"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = String::new();
    std::io::Read::read_to_string(harness.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    let (mut status, mut usage) = (0, unsafe { std::mem::zeroed::<libc::rusage>() });
    // SAFETY: reaps our own child, which has closed its stderr.
    let reaped = unsafe { libc::wait4(harness.id() as i32, &mut status, 0, &mut usage) };
    assert_eq!(reaped, harness.id() as i32);
    let code = libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status));
    assert_eq!(code, Some(124), "the timeout's exit code: {stderr}");
    assert!(usage.ru_maxrss < PEAK_LIMIT_KIB, "peak RSS {} KiB: {stderr}", usage.ru_maxrss);
}

/// Dropping a hook's future cancels the call in the worker, which drops the
/// provider's future: a command that would run for minutes is terminated,
/// and the lease stays usable.
#[test]
fn dropping_an_execute_through_the_worker_terminates_its_command() {
    let sim = Simulator::start(SimConfig { rate_limit: None, ..Default::default() }).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(&dir.path().join("ledger.sqlite3")).unwrap();
    let provider = IsolatedProvider::start(fixture("createos_provider"), createos_options()).unwrap();
    provider.setup(&SetupParams::default(), LogSink::new(|_| {}), LogLevel::Warn).unwrap();
    let mut settings = sim.provider_config(true);
    settings["requestsPerMinute"] = json!(100_000);
    settings["timeoutMs"] = json!(600_000);
    let config = harness_environment(settings);
    let host = Host::new(&provider, &ledger, &config, Owner::Command, "cancel");
    let held = wait(host.acquire()).unwrap();
    let command = |program: &str, arg: &str| ExecuteParams {
        command: program.into(),
        args: vec![arg.into()].into(),
        ..Default::default()
    };
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
        common::wait_until("the command was created", Duration::from_secs(60), || {
            created(&sim.ledger()) > before
        });
    }
    common::wait_until("the dropped command was terminated", Duration::from_secs(60), || {
        sim.ledger().unterminated_processes() == ended_by_themselves
    });
    let mut output = ignore();
    let again = wait(host.execute(&held, command("/bin/echo", "again"), ByteSource::empty(), &mut output));
    assert_eq!(again.expect("the lease is still usable").stdout, "again\n");
    wait(host.destroy(&held)).unwrap();
    assert!(sim.ledger().leaked().is_empty());
}

/// `exec --isolate` is byte-exact: output crosses the worker as bytes.
#[test]
fn exec_through_the_worker_is_byte_exact() {
    let bed = IsolatedBed::new();
    let lease = bed.acquire(None);
    let exec = |command: &[&str]| {
        let mut args = vec!["exec", "--config", "{config}", "--lease", &lease, "--"];
        args.extend_from_slice(command);
        bed.run(None, &args)
    };
    let printed = exec(&["printf", r"\377\376A\000B\n"]);
    assert_eq!(printed.status.code(), Some(0), "{}", String::from_utf8_lossy(&printed.stderr));
    assert_eq!(printed.stdout, b"\xff\xfeA\x00B\n");
    let to_stderr = exec(&["sh", "-c", r"printf '\377x' >&2; exit 3"]);
    assert_eq!((to_stderr.status.code(), to_stderr.stderr.as_slice()), (Some(3), &b"\xffx"[..]));
}

/// `sync_files`, in and out, through the worker.
#[test]
fn sync_through_the_worker_moves_files_in_and_out() {
    let bed = IsolatedBed::new();
    let lease = bed.acquire(None);
    std::fs::write(bed.path("input.txt"), "from the host\n").unwrap();
    let inbound = format!("{}:/paperclip-workspace/input.txt", bed.path("input.txt").display());
    let then = "tr a-z A-Z < input.txt > output.txt";
    let args =
        ["--json", "sync", "--config", "{config}", "--lease", &lease, "--in", &inbound, "--then", then];
    let output = bed.run(None, &args);
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    let result: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(result, json!({"operations": [{"id": "in", "filesTransferred": 1, "bytesTransferred": 14}]}));

    let outbound = format!("/paperclip-workspace/output.txt:{}", bed.path("output.txt").display());
    let output = bed.run(None, &["sync", "--config", "{config}", "--lease", &lease, "--out", &outbound]);
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    assert_eq!(std::fs::read_to_string(bed.path("output.txt")).unwrap(), "FROM THE HOST\n");
}

/// `setup`'s log sink through the worker: the provider's events
/// reach the harness's log, at its level, with their target and fields.
#[test]
fn the_providers_logs_cross_the_worker_at_the_harness_level() {
    let bed = IsolatedBed::new();
    let quiet = bed.run(None, &["lifecycle", "--config", "{config}"]);
    let text = String::from_utf8_lossy(&quiet.stderr);
    assert_eq!(quiet.status.code(), Some(0), "{text}");
    assert!(!text.contains("createos_provider"), "warn level: {text}");

    let verbose = bed.run(None, &["-v", "lifecycle", "--config", "{config}"]);
    let text = String::from_utf8_lossy(&verbose.stderr);
    assert_eq!(verbose.status.code(), Some(0), "{text}");
    let created = text.lines().find(|line| line.contains("CreateOS sandbox created"));
    let created = created.unwrap_or_else(|| panic!("-v shows the provider's INFO events: {text}"));
    assert!(created.contains("INFO") && created.contains("createos_provider::lease"), "{created}");
    assert!(created.contains("shape=s-1vcpu-1gb"), "its fields: {created}");
    assert!(!text.contains(bed.sim.api_key()), "never the API key in a log line");
}

/// A library without an optional hook reports it `unsupported` through the
/// worker exactly as in process: the frozen 2.0 fixture (required hooks
/// only) cannot sync; both libraries forward their logs (`setup`).
#[test]
fn through_the_worker_a_library_lacks_the_hooks_its_table_lacks() {
    for library in ["fixture_provider", "fixture_frozen"] {
        let bed = IsolatedBed::new();
        std::fs::write(&bed.config, r#"{"passphrase": "p"}"#).unwrap();
        let plugin = fixture(library);
        let lease = bed.acquire(Some(&plugin));
        let args = [
            "-v",
            "exec",
            "--config",
            "{config}",
            "--lease",
            &lease,
            "--",
            "/bin/sh",
            "-c",
            "printf 'hi\\n'",
        ];
        let output = bed.run(Some(&plugin), &args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(
            (output.status.code(), output.stdout.as_slice()),
            (Some(0), &b"hi\n"[..]),
            "{library}: {stderr}"
        );
        assert!(stderr.contains("fixture set up"), "{library}: {stderr}");
    }
    let bed = IsolatedBed::new();
    std::fs::write(&bed.config, r#"{"passphrase": "p"}"#).unwrap();
    let frozen = fixture("fixture_frozen");
    let lease = bed.acquire(Some(&frozen));
    std::fs::write(bed.path("f"), "f").unwrap();
    let inbound = format!("{}:/fixture/f", bed.path("f").display());
    let output = bed
        .run(Some(&frozen), &["--json", "sync", "--config", "{config}", "--lease", &lease, "--in", &inbound]);
    assert_eq!(output.status.code(), Some(1), "{}", String::from_utf8_lossy(&output.stderr));
    let line: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(line["error"]["kind"], "unsupported", "{line}");
    assert!(
        line["error"]["message"].as_str().unwrap().contains("does not implement the `sync_files` hook"),
        "{line}"
    );
}

/// Every hook of the library's table crosses the worker protocol but
/// `grant_request_share` (each worker paces its own requests): the
/// isolated provider supports, and its manifest lists, exactly those.
#[test]
fn the_worker_serves_the_hooks_of_the_librarys_table() {
    for library in ["fixture_provider", "fixture_frozen"] {
        let loaded = LoadedProvider::load(fixture(library)).unwrap();
        let isolated = IsolatedProvider::start(fixture(library), options()).expect("start the worker");
        for hook in Hook::ALL {
            let expected = loaded.supports(hook) && hook != Hook::GrantRequestShare;
            assert_eq!(isolated.supports(hook), expected, "{library}: {hook}");
            let listed = isolated.manifest().hooks.iter().any(|name| name == hook.name());
            assert_eq!(listed, expected, "{library}: {hook}");
        }
        let refused = isolated.grant_request_share(500_000).unwrap_err();
        assert_eq!(refused.kind, ErrorKind::UNSUPPORTED, "{library}");
    }
}
