//! Versions side by side, hot swap and drain, through real fixture libraries
//! of ABI 1.0 up to the newest (one provider id, a version each), and the
//! CreateOS provider across a swap.

use host_harness::provider_set::{ProviderSet, SwapError};
use provider_abi::{ExecuteParams, Hook, LoadedProvider, OutputSink, OutputStream, Provider};
use std::sync::mpsc;

use e2e::library;

fn load(crate_name: &str) -> LoadedProvider {
    LoadedProvider::load(library(crate_name)).unwrap()
}

fn health(set: &ProviderSet) -> String {
    set.health().unwrap().message.to_string()
}

/// The version matrix through swaps: a 1.0 provider active, swapped to 1.1,
/// to 1.7 (the first async hooks), to the newest, and back down; after each
/// swap the set answers with the active version's own hooks, exactly those
/// of its ABI, and a hook the active version lacks is `unsupported`.
#[test]
fn swaps_across_abi_versions_and_back_each_answering_with_its_own_hooks() {
    use provider_abi::{
        AbiVersion, ErrorKind, OwnedByteSink, OwnedByteSource, ABI_1_0, ABI_1_1, ABI_1_6, ABI_1_7, ABI_1_8,
        ABI_1_9, ABI_VERSION,
    };
    let newest = format!("fixture_v{}_{}", ABI_VERSION.major, ABI_VERSION.minor);
    let steps: [(&str, AbiVersion); 7] = [
        ("fixture_v1_0", ABI_1_0),
        ("fixture_v1_1", ABI_1_1),
        ("fixture_v1_7", ABI_1_7),
        (&newest, ABI_VERSION),
        ("fixture_v1_7", ABI_1_7),
        ("fixture_v1_1", ABI_1_1),
        ("fixture_v1_0", ABI_1_0),
    ];
    let set = ProviderSet::new(load(steps[0].0));
    for (index, (library, abi)) in steps.into_iter().enumerate() {
        if index > 0 {
            let report = set.swap_to(load(library)).unwrap();
            assert_eq!(report.draining, 0, "nothing in flight: the old version drains at once");
        }
        // The share granted to the set while older versions were active
        // reaches the first version with the hook when it is swapped in.
        let share = if abi >= ABI_1_6 { ", request share 500000 ppm" } else { "" };
        assert_eq!(health(&set), format!("fixture {}.{}.0{share}", abi.major, abi.minor), "{library}");
        assert_eq!(set.manifest().abi_version, abi, "{library}");
        for hook in Hook::ALL {
            assert_eq!(set.supports(hook), hook.since() <= abi, "{library}: {hook}");
        }
        // An async hook answers only on a version that has it.
        let asked = poll_once(set.health_async());
        assert_eq!(asked.is_ok(), abi >= ABI_1_7, "{library}: {asked:?}");
        // An async hook of ABI 1.8 only on a 1.8 version.
        let synced = poll_once(set.sync_in_async(Default::default()));
        assert_eq!(synced.is_ok(), abi >= ABI_1_8, "{library}: {synced:?}");
        // The execute pulling its stdin (ABI 1.9) only on a 1.9 version.
        let stdin = OwnedByteSource::from_reader(std::io::empty());
        let pulled =
            poll_once(set.execute_stdin_async(Default::default(), stdin, OwnedByteSink::new(|_, _| {})));
        assert_eq!(pulled.is_ok(), abi >= ABI_1_9, "{library}: {pulled:?}");
        // The request share answers only on a version that has the hook.
        match set.grant_request_share(500_000) {
            Ok(()) => assert!(abi >= ABI_1_6, "{library}"),
            Err(error) => assert_eq!((error.kind, abi < ABI_1_6), (ErrorKind::UNSUPPORTED, true)),
        }
    }
    assert_eq!(set.swaps(), 6);
    assert!(set.versions().iter().filter(|version| !version.is_drained()).count() == 1);
}

/// The request share granted to a set reaches the versions swapped in
/// later, before their first call; a version without the hook keeps its
/// whole budget.
#[test]
fn a_granted_request_share_reaches_every_version_swapped_in() {
    let set = ProviderSet::new(load("fixture_v1_6"));
    set.grant_request_share(500_000).unwrap();
    assert_eq!(health(&set), "fixture 1.6.0, request share 500000 ppm");
    set.swap_to(load("fixture_v1_5")).unwrap();
    assert_eq!(health(&set), "fixture 1.5.0");
    set.swap_to(load("fixture_v1_6")).unwrap();
    assert_eq!(health(&set), "fixture 1.6.0, request share 500000 ppm");
}

/// Polls a hook's future once: the fixture's async hooks answer at once.
fn poll_once<T>(mut future: provider_abi::HookFuture<T>) -> provider_abi::HookResult<T> {
    let mut context = std::task::Context::from_waker(std::task::Waker::noop());
    match future.as_mut().poll(&mut context) {
        std::task::Poll::Ready(result) => result,
        std::task::Poll::Pending => panic!("the fixture's async hooks answer at once"),
    }
}

/// An async call counts in flight on its version until its future is
/// dropped: a swap retires the version, which drains only then.
#[test]
fn an_async_call_keeps_its_version_in_flight_until_its_future_is_dropped() {
    let set = ProviderSet::new(load("fixture_v1_8"));
    let pending = set.health_async();
    let syncing = set.sync_out_async(Default::default());
    let old = set.active();
    assert_eq!(old.in_flight(), 2, "an ABI 1.8 async call counts in flight too");
    let report = set.swap_to(load("fixture_v1_1")).unwrap();
    assert_eq!(report.draining, 2, "both calls are in flight on the retired version");
    assert!(old.is_retired() && !old.is_drained());
    drop(pending);
    assert!(!old.is_drained(), "the 1.8 async call still holds the version");
    drop(syncing);
    assert_eq!(old.in_flight(), 0);
    assert!(old.is_drained(), "the version drains once its last async call is dropped");
}

#[test]
fn a_call_in_flight_finishes_on_the_old_version_which_then_drains() {
    let set = ProviderSet::new(load("fixture_v1_1"));
    let (started_tx, started) = mpsc::channel();
    let (release_tx, release) = mpsc::channel::<()>();
    let shared = &set;
    std::thread::scope(|scope| {
        let call = scope.spawn(move || {
            // The fixture echoes each argument through the sink: the first
            // chunk blocks until the test lets it go, keeping the call on v1.1.
            let mut first = true;
            let mut sink = move |_: OutputStream, _: &str| {
                if std::mem::take(&mut first) {
                    started_tx.send(()).unwrap();
                    release.recv().unwrap();
                }
            };
            let params = ExecuteParams { args: vec!["a".into(), "b".into()].into(), ..Default::default() };
            shared.execute(&params, &mut OutputSink::new(&mut sink)).unwrap()
        });
        started.recv().unwrap();
        let old = set.active();
        let report = set.swap_to(load("fixture_v1_2")).unwrap();
        assert_eq!((report.from.as_str(), report.to.as_str(), report.draining), ("1.1.0", "1.2.0", 1));
        assert_eq!(health(&set), "fixture 1.2.0", "new calls go to the new version at once");
        assert!(old.is_retired() && !old.is_drained(), "the old version waits for its call");
        release_tx.send(()).unwrap();
        let result = call.join().unwrap();
        assert_eq!(result.stdout.as_str(), "ab", "the call finished where it started");
        assert!(old.is_drained(), "its last call returned: shut down and dropped");
    });
}

#[test]
fn a_swap_to_another_provider_or_past_the_bound_is_refused_and_changes_nothing() {
    let set = ProviderSet::with_limit(load("fixture_v1_1"), 2);
    let other = LoadedProvider::load(library("createos_provider")).unwrap();
    let refused = set.swap_to(other).unwrap_err();
    assert!(matches!(refused, SwapError::OtherProvider { .. }), "{refused}");
    assert!(!refused.to_string().contains('\n'));
    assert_eq!(health(&set), "fixture 1.1.0");

    // Keep a call in flight on 1.1, swap to 1.2 (two retained), then a third
    // version would exceed the bound of two.
    let (started_tx, started) = mpsc::channel();
    let (release_tx, release) = mpsc::channel::<()>();
    let shared = &set;
    std::thread::scope(|scope| {
        scope.spawn(move || {
            let mut sink = move |_: OutputStream, _: &str| {
                started_tx.send(()).unwrap();
                release.recv().unwrap();
            };
            let params = ExecuteParams { args: vec!["a".into()].into(), ..Default::default() };
            shared.execute(&params, &mut OutputSink::new(&mut sink)).unwrap();
        });
        started.recv().unwrap();
        set.swap_to(load("fixture_v1_2")).unwrap();
        let refused = set.swap_to(load("fixture_v1_0")).unwrap_err();
        assert_eq!(refused, SwapError::TooManyVersions { limit: 2 });
        assert_eq!(health(&set), "fixture 1.2.0", "the active version stays");
        release_tx.send(()).unwrap();
    });
    set.swap_to(load("fixture_v1_0")).expect("once 1.1 drained, the bound has room");
    assert_eq!(health(&set), "fixture 1.0.0");
}

const SEED_MESSAGE: &str = "CreateOS process cleanup is unconfirmed; destroy this lease before reusing it.";

/// Two builds of the CreateOS provider, each a file of its own.
fn two_createos_builds(dir: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let builds = ["v1", "v2"].map(|name| {
        let path = dir.join(name).join(provider_abi::library_file_name("createos_provider"));
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
    use host_harness::{
        handover::unconfirmed_leases,
        host::Host,
        ledger::{LeaseState, Ledger, Owner},
        request::HarnessConfig,
        sweep::SweepSecrets,
    };
    use provider_abi::ErrorKind;

    let sim = Simulator::start(SimConfig { rate_limit: None, ..Default::default() }).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (v1, v2) = two_createos_builds(dir.path());
    let ledger = Ledger::open(&dir.path().join("ledger.sqlite3")).unwrap();
    let config = HarnessConfig::for_config(sim.provider_config(true));
    let set = ProviderSet::new(LoadedProvider::load(&v1).unwrap());
    let host = Host::new(&set, &ledger, &config, Owner::Lifecycle, "seed-swap", true);

    // On v1: the command's process creation fails ambiguously, so its
    // cleanup cannot be confirmed.
    let held = host.acquire().unwrap();
    sim.add_fault(FaultRule::new(
        "POST /v1/sandboxes/*/processes",
        FaultTrigger::nth(1),
        FaultKind::Status(503),
    ));
    let command = ExecuteParams { command: "/bin/true".into(), ..Default::default() };
    let mut ignore = |_: OutputStream, _: &str| {};
    host.execute(&held, command, &mut OutputSink::new(&mut ignore)).unwrap_err();
    assert_eq!(ledger.get(held.row).unwrap().unwrap().state, LeaseState::Unconfirmed);
    let params = host.params(&held.lease);
    assert!(set.inspect_lease(&params).unwrap().unconfirmed, "v1 knows it in memory");

    // The swap hands v2 what the ledger knows.
    let unconfirmed = unconfirmed_leases(&ledger, &set, &SweepSecrets::from_config(&set, &config)).unwrap();
    let report = set.swap_to_importing(LoadedProvider::load(&v2).unwrap(), &unconfirmed).unwrap();
    assert_eq!(report.imported, 1, "{report:?}");
    assert_eq!(set.active().path(), v2.canonicalize().unwrap());

    // On v2, the provider itself (not the host's ledger check) refuses reuse.
    let pauses = sim.ledger().count("POST", "/v1/sandboxes/*/pause");
    let error = set.release_lease(&params).unwrap_err();
    assert_eq!((error.kind, error.message.as_str()), (ErrorKind::CLEANUP_UNCONFIRMED, SEED_MESSAGE));
    let error = set.resume_lease(&params).unwrap_err();
    assert_eq!((error.kind, error.message.as_str()), (ErrorKind::CLEANUP_UNCONFIRMED, SEED_MESSAGE));
    assert_eq!(sim.ledger().count("POST", "/v1/sandboxes/*/pause"), pauses, "nothing paused");

    // Destroy on v2 clears it.
    host.destroy(&held).unwrap();
    assert!(!set.inspect_lease(&params).unwrap().unconfirmed);
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
    use host_harness::{
        host::Host,
        ledger::{LeaseState, Ledger, Owner},
        request::HarnessConfig,
    };
    use provider_abi::ErrorKind;

    let sim = Simulator::start(SimConfig { rate_limit: None, ..Default::default() }).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (v1, v2) = two_createos_builds(dir.path());
    let ledger = Ledger::open(&dir.path().join("ledger.sqlite3")).unwrap();
    let config = HarnessConfig::for_config(sim.provider_config(true));
    let set = ProviderSet::new(LoadedProvider::load(&v1).unwrap());
    let host = Host::new(&set, &ledger, &config, Owner::Lifecycle, "drain-swap", true);
    let held = host.acquire().unwrap();
    let params = host.params(&held.lease);

    let (started_tx, started) = mpsc::channel();
    std::thread::scope(|scope| {
        let command = scope.spawn(|| {
            // Runs until its deadline; its tree's termination then fails.
            let script = "echo started; exec sleep 60";
            let command = ExecuteParams {
                command: "/bin/sh".into(),
                args: vec!["-c".into(), script.into()].into(),
                timeout_ms: Some(4_000).into(),
                ..Default::default()
            };
            let mut first = |_: OutputStream, _: &str| {
                let _ = started_tx.send(());
            };
            host.execute(&held, command, &mut OutputSink::new(&mut first))
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
    let error = set.release_lease(&params).unwrap_err();
    assert_eq!((error.kind, error.message.as_str()), (ErrorKind::CLEANUP_UNCONFIRMED, SEED_MESSAGE));
    sim.clear_faults();
    host.destroy(&held).unwrap();
    assert!(sim.live_sandboxes().is_empty());
}
