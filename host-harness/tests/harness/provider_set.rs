//! Versions side by side, hot swap and drain, through real fixture libraries
//! (one provider id, a version each: every hook, the required hooks only, a
//! later minor version), and the CreateOS provider across a swap.

use provider_abi::{ByteSink, ByteSource, ExecuteParams, Hook, OutputStream, Provider};
use provider_host::{
    loader::{library_file_name, LoadedProvider},
    provider_set::{ProviderSet, SwapError},
    wait, HookSupport, RemoteCommand,
};
use std::{sync::mpsc, time::Duration};

use e2e::library;

fn load(crate_name: &str) -> LoadedProvider {
    LoadedProvider::load(library(crate_name)).unwrap()
}

/// What a version learnt moves to the next one at the swap, before its
/// first call, when both have the memory hooks (2.1); a 2.0 version gets
/// nothing and gives nothing.
#[test]
fn a_swap_hands_the_old_versions_memory_to_the_new_one() {
    use provider_abi::{AcquireParams, CreationRecorder, MemoryEntry};
    let set = ProviderSet::new(load("fixture_provider"));
    set.import_memory(&[MemoryEntry::new("leases", b"5".to_vec())]).unwrap();
    let acquire = AcquireParams { run_id: "run".into(), ..Default::default() };
    wait(set.acquire_lease(acquire, CreationRecorder::discard())).unwrap();
    let report = set.swap_to(load("fixture_next_minor")).unwrap();
    assert_eq!(report.remembered, 1);
    assert_eq!(set.export_memory().unwrap(), [MemoryEntry::new("leases", b"6".to_vec())]);
    let report = set.swap_to(load("fixture_frozen")).unwrap();
    assert_eq!(report.remembered, 0, "a 2.0 version cannot take it");
    let report = set.swap_to(load("fixture_provider")).unwrap();
    assert_eq!(report.remembered, 0, "nor give it");
    assert_eq!(set.export_memory().unwrap(), [MemoryEntry::new("leases", b"0".to_vec())]);
}

fn health(set: &ProviderSet) -> String {
    set.health().unwrap().message.to_string()
}

/// Swaps between versions of one provider whose tables differ, and back:
/// after each swap the set answers with the active version's own hooks
/// (its table's), and a hook the active version lacks is `unsupported`.
#[test]
fn swaps_between_tables_and_back_each_answering_with_its_own_hooks() {
    use provider_abi::{ErrorKind, SyncDirection, SyncParams};
    let steps =
        ["fixture_provider", "fixture_frozen", "fixture_next_minor", "fixture_frozen", "fixture_provider"];
    let set = ProviderSet::new(load(steps[0]));
    for (index, library) in steps.into_iter().enumerate() {
        if index > 0 {
            let report = set.swap_to(load(library)).unwrap();
            assert_eq!(report.draining, 0, "nothing in flight: the old version drains at once");
        }
        let alone = load(library);
        assert_eq!(set.manifest().version, alone.manifest().version, "{library}");
        assert_eq!(set.manifest().abi_version, alone.library_abi(), "{library}");
        for hook in Hook::ALL {
            assert_eq!(set.supports(hook), alone.supports(hook), "{library}: {hook}");
        }
        // An optional hook answers only on a version that has it.
        let params = SyncParams { direction: SyncDirection::In, ..Default::default() };
        let synced = wait(set.sync_files(params));
        if !alone.supports(Hook::SyncFiles) {
            assert_eq!(synced.unwrap_err().kind, ErrorKind::UNSUPPORTED, "{library}");
        }
        match set.grant_request_share(500_000) {
            Ok(()) => assert!(alone.supports(Hook::GrantRequestShare), "{library}"),
            Err(error) => {
                assert_eq!(
                    (error.kind, alone.supports(Hook::GrantRequestShare)),
                    (ErrorKind::UNSUPPORTED, false)
                )
            }
        }
    }
    assert_eq!(set.swaps(), 4);
    assert!(set.versions().iter().filter(|version| !version.is_drained()).count() == 1);
}

/// The request share granted to a set reaches the versions swapped in
/// later, before their first call; a version without the hook keeps its
/// whole budget.
#[test]
fn a_granted_request_share_reaches_every_version_swapped_in() {
    let set = ProviderSet::new(load("fixture_provider"));
    set.grant_request_share(500_000).unwrap();
    assert!(health(&set).ends_with("request share 500000 ppm"), "{}", health(&set));
    set.swap_to(load("fixture_frozen")).unwrap();
    assert!(!health(&set).contains("500000"), "{}", health(&set));
    set.swap_to(load("fixture_provider")).unwrap();
    assert!(health(&set).ends_with("request share 500000 ppm"), "{}", health(&set));
}

/// A call counts in flight on its version until its future is dropped: a
/// swap retires the version, which drains only then.
#[test]
fn a_call_keeps_its_version_in_flight_until_its_future_is_dropped() {
    let set = ProviderSet::new(load("fixture_provider"));
    let pending = set.resume_lease(Default::default());
    let syncing = set.sync_files(Default::default());
    let old = set.active();
    assert_eq!(old.in_flight(), 2, "each future counts in flight");
    let report = set.swap_to(load("fixture_frozen")).unwrap();
    assert_eq!(report.draining, 2, "both calls are in flight on the retired version");
    assert!(old.is_retired() && !old.is_drained());
    drop(pending);
    assert!(!old.is_drained(), "the other call still holds the version");
    drop(syncing);
    assert_eq!(old.in_flight(), 0);
    assert!(old.is_drained(), "the version drains once its last call is dropped");
}

/// A sink whose first chunk tells `started` and waits for `release`.
fn holding_sink(started: mpsc::Sender<()>, release: mpsc::Receiver<()>) -> ByteSink {
    let mut first = true;
    ByteSink::new(move |_: OutputStream, _: &[u8]| {
        if std::mem::take(&mut first) {
            started.send(()).unwrap();
            release.recv().unwrap();
        }
    })
}

#[test]
fn a_call_in_flight_finishes_on_the_old_version_which_then_drains() {
    let set = ProviderSet::new(load("fixture_frozen"));
    let (started_tx, started) = mpsc::channel();
    let (release_tx, release) = mpsc::channel::<()>();
    let shared = &set;
    std::thread::scope(|scope| {
        let call = scope.spawn(move || {
            // The fixture echoes each argument through the sink: the first
            // chunk blocks until the test lets it go, keeping the call on
            // the first version.
            let sink = holding_sink(started_tx, release);
            let params = ExecuteParams { args: vec!["a".into(), "b".into()].into(), ..Default::default() };
            wait(shared.execute(params, ByteSource::empty(), sink)).unwrap()
        });
        started.recv().unwrap();
        let old = set.active();
        let report = set.swap_to(load("fixture_provider")).unwrap();
        assert_eq!((report.from.as_str(), report.to.as_str(), report.draining), ("2.0.0-frozen", "2.0.0", 1));
        assert!(health(&set).starts_with("fixture 2.0.0"), "new calls go to the new version at once");
        assert!(!health(&set).starts_with("fixture 2.0.0-frozen"), "{}", health(&set));
        assert!(old.is_retired() && !old.is_drained(), "the old version waits for its call");
        release_tx.send(()).unwrap();
        let result = call.join().unwrap();
        assert_eq!(result.stdout.as_str(), "ab", "the call finished where it started");
        assert!(old.is_drained(), "its last call returned: shut down and dropped");
    });
}

#[test]
fn a_swap_to_another_provider_or_past_the_bound_is_refused_and_changes_nothing() {
    let set = ProviderSet::with_limit(load("fixture_frozen"), 2);
    let version = |set: &ProviderSet| set.manifest().version.to_string();
    let other = LoadedProvider::load(library("createos_provider")).unwrap();
    let refused = set.swap_to(other).unwrap_err();
    assert!(matches!(refused, SwapError::OtherProvider { .. }), "{refused}");
    assert!(!refused.to_string().contains('\n'));
    assert_eq!(version(&set), "2.0.0-frozen");

    // Keep a call in flight on the first version, swap to a second (two
    // retained), then a third version would exceed the bound of two.
    let (started_tx, started) = mpsc::channel();
    let (release_tx, release) = mpsc::channel::<()>();
    let shared = &set;
    std::thread::scope(|scope| {
        scope.spawn(move || {
            let params = ExecuteParams { args: vec!["a".into()].into(), ..Default::default() };
            wait(shared.execute(params, ByteSource::empty(), holding_sink(started_tx, release))).unwrap();
        });
        started.recv().unwrap();
        set.swap_to(load("fixture_provider")).unwrap();
        let refused = set.swap_to(load("fixture_next_minor")).unwrap_err();
        assert_eq!(refused, SwapError::TooManyVersions { limit: 2 });
        assert_eq!(version(&set), "2.0.0", "the active version stays");
        release_tx.send(()).unwrap();
    });
    set.swap_to(load("fixture_next_minor")).expect("once the first version drained, the bound has room");
    assert_eq!(version(&set), "2.2.0");
}

const SEED_MESSAGE: &str = "CreateOS process cleanup is unconfirmed; destroy this lease before reusing it.";

/// Two builds of the CreateOS provider, each a file of its own.
fn two_createos_builds(dir: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let builds = ["v1", "v2"].map(|name| {
        let path = dir.join(name).join(library_file_name("createos_provider"));
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::copy(library("createos_provider"), &path).unwrap();
        path
    });
    let [v1, v2] = builds;
    (v1, v2)
}

/// The release rule across a swap: the command's cleanup is unconfirmed on v1 (known
/// to v1 only in memory, and to the host's ledger), the swap happens, and v2
/// itself refuses to release the lease for reuse with the release rule's message
/// until a destroy on v2 clears it.
#[test]
fn the_seed_scenario_across_a_swap_is_refused_by_the_new_version_itself() {
    use createos_sim::{FaultKind, FaultRule, FaultTrigger, SimConfig, Simulator};
    use host_harness::config_file::harness_environment;
    use provider_abi::ErrorKind;
    use provider_host::{
        host::Host,
        store::sqlite::Ledger,
        store::LeaseStore,
        store::{LeaseState, Owner},
        sweep::SweepSecrets,
        unconfirmed_handover::unconfirmed_leases,
    };

    let sim = Simulator::start(SimConfig { rate_limit: None, ..Default::default() }).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (v1, v2) = two_createos_builds(dir.path());
    let ledger = Ledger::open(&dir.path().join("ledger.sqlite3")).unwrap();
    let mut config = harness_environment(sim.provider_config(true));
    config.api_in_process = true;
    let set = ProviderSet::new(LoadedProvider::load(&v1).unwrap());
    let host = Host::new(&set, &ledger, &config, Owner::Lifecycle, "seed-swap");

    // On v1: the command's process creation fails ambiguously, so its
    // cleanup cannot be confirmed.
    let held = wait(host.acquire()).unwrap();
    sim.add_fault(FaultRule::new(
        "POST /v1/sandboxes/*/processes",
        FaultTrigger::nth(1),
        FaultKind::Status(503),
    ));
    let command = RemoteCommand::new("/bin/true");
    let mut ignore = |_: OutputStream, _: &[u8]| {};
    wait(host.execute(&held, command, ByteSource::empty(), &mut ignore)).unwrap_err();
    assert_eq!(ledger.get(held.row).unwrap().unwrap().state, LeaseState::Unconfirmed);
    let params = host.params(&held.lease);
    assert!(wait(set.inspect_lease(params.clone())).unwrap().unconfirmed, "v1 knows it in memory");

    // The swap hands v2 what the ledger knows.
    let unconfirmed = unconfirmed_leases(&ledger, &set, &SweepSecrets::from_config(&set, &config)).unwrap();
    let report = set.swap_to_importing(LoadedProvider::load(&v2).unwrap(), &unconfirmed).unwrap();
    assert_eq!(report.imported, 1, "{report:?}");
    assert_eq!(set.active().path(), v2.canonicalize().unwrap());

    // On v2, the provider itself (not the host's ledger check) refuses reuse.
    let pauses = sim.ledger().count("POST", "/v1/sandboxes/*/pause");
    let error = wait(set.release_lease(params.clone())).unwrap_err();
    assert_eq!((error.kind, error.message.as_str()), (ErrorKind::CLEANUP_UNCONFIRMED, SEED_MESSAGE));
    let error = wait(set.resume_lease(params.clone())).unwrap_err();
    assert_eq!((error.kind, error.message.as_str()), (ErrorKind::CLEANUP_UNCONFIRMED, SEED_MESSAGE));
    assert_eq!(sim.ledger().count("POST", "/v1/sandboxes/*/pause"), pauses, "nothing paused");

    // Destroy on v2 clears it.
    wait(host.destroy(&held)).unwrap();
    assert!(!wait(set.inspect_lease(params)).unwrap().unconfirmed);
    assert!(sim.live_sandboxes().is_empty());
    assert_eq!(ledger.get(held.row).unwrap().unwrap().state, LeaseState::Destroyed);
}

/// The release rule across a swap, the other way round: the command is still running
/// on v1 when the swap happens (nothing is unconfirmed yet, so nothing is
/// handed over), and its cleanup fails afterwards, on v1. The host records
/// it and tells the version now active, which itself refuses reuse.
#[test]
fn a_lease_marked_unconfirmed_by_a_draining_version_is_refused_by_the_active_one() {
    use createos_sim::{FaultKind, FaultRule, FaultTrigger, SimConfig, Simulator};
    use host_harness::config_file::harness_environment;
    use provider_abi::ErrorKind;
    use provider_host::{
        host::Host,
        store::sqlite::Ledger,
        store::LeaseStore,
        store::{LeaseState, Owner},
    };

    let sim = Simulator::start(SimConfig { rate_limit: None, ..Default::default() }).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (v1, v2) = two_createos_builds(dir.path());
    let ledger = Ledger::open(&dir.path().join("ledger.sqlite3")).unwrap();
    let mut config = harness_environment(sim.provider_config(true));
    config.api_in_process = true;
    let set = ProviderSet::new(LoadedProvider::load(&v1).unwrap());
    let host = Host::new(&set, &ledger, &config, Owner::Lifecycle, "drain-swap");
    let held = wait(host.acquire()).unwrap();
    let params = host.params(&held.lease);

    let (started_tx, started) = mpsc::channel();
    std::thread::scope(|scope| {
        let command = scope.spawn(|| {
            // Runs until its deadline; its tree's termination then fails.
            let script = "echo started; exec sleep 60";
            let command = RemoteCommand::new("/bin/sh").args(["-c", script]).timeout(Duration::from_secs(4));
            let mut first = |_: OutputStream, _: &[u8]| {
                let _ = started_tx.send(());
            };
            wait(host.execute(&held, command, ByteSource::empty(), &mut first))
        });
        started.recv().unwrap();
        sim.add_fault(FaultRule::new(
            "DELETE /v1/sandboxes/*/processes/*",
            FaultTrigger::from_nth(1),
            FaultKind::Status(500),
        ));
        let report = set.swap_to_importing(LoadedProvider::load(&v2).unwrap(), &[]).unwrap();
        assert_eq!(report.draining, 1, "the command runs on v1");
        let error = command.join().unwrap().unwrap_err();
        assert_eq!(error.kind, ErrorKind::CLEANUP_UNCONFIRMED, "{error}");
    });
    assert_eq!(ledger.get(held.row).unwrap().unwrap().state, LeaseState::Unconfirmed);
    let error = wait(set.release_lease(params)).unwrap_err();
    assert_eq!((error.kind, error.message.as_str()), (ErrorKind::CLEANUP_UNCONFIRMED, SEED_MESSAGE));
    sim.clear_faults();
    wait(host.destroy(&held)).unwrap();
    assert!(sim.live_sandboxes().is_empty());
}

/// A lease the new version refuses at a swap is not counted as taken, and
/// the warning names the version that refused it.
#[test]
fn a_lease_the_new_version_refuses_at_a_swap_is_a_warning_naming_that_version() {
    use provider_abi::LeaseParams;
    let dir = tempfile::tempdir().unwrap();
    let (v1, v2) = two_createos_builds(dir.path());
    let set = ProviderSet::new(LoadedProvider::load(&v1).unwrap());
    // No configuration: the new version cannot take it as its own.
    let lease = LeaseParams { provider_lease_id: Some("sbx-refused".into()).into(), ..Default::default() };
    let log = dir.path().join("log");
    let subscriber =
        tracing_subscriber::fmt().with_writer(std::fs::File::create(&log).unwrap()).with_ansi(false).finish();
    let report = tracing::subscriber::with_default(subscriber, || {
        set.swap_to_importing(LoadedProvider::load(&v2).unwrap(), &[lease]).unwrap()
    });
    assert_eq!(report.imported, 0, "{report:?}");
    let logged = std::fs::read_to_string(&log).unwrap();
    let warned: Vec<&str> = logged.lines().filter(|line| line.contains("WARN")).collect();
    assert_eq!(warned.len(), 1, "{logged}");
    assert!(
        warned[0].contains("the version answering new calls did not take an unconfirmed lease"),
        "{logged}"
    );
    assert!(warned[0].contains(&format!("version={}", report.to)), "{logged}");
    assert!(warned[0].contains("sbx-refused"), "{logged}");
}

/// Libraries of an older minor version are checked the other way round;
/// loading one first must not keep this host's own minor (or a newer one)
/// from loading in the same process.
#[test]
fn a_library_of_an_older_minor_loaded_first_leaves_the_newer_ones_loadable() {
    let versions: Vec<String> = ["fixture_frozen", "fixture_provider", "fixture_next_minor"]
        .map(|name| load(name).library_abi().to_string())
        .into();
    assert_eq!(versions, ["2.0", "2.1", "2.2"]);
}
