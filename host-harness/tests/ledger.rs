//! The seed's defensive policy and the durable lease ledger, against a
//! simulator this test process starts itself: it outlives every harness
//! process the tests run (and kill), and its own view of which sandboxes are
//! live is the ground truth the ledger is checked against.

use createos_sim::{FaultKind, FaultRule, FaultTrigger, SimConfig, Simulator};
use host_harness::{
    host::{Host, Released},
    ledger::{LeaseState, Ledger, Owner},
    lifecycle::{self, StepReport},
    plugin::load_provider,
    request::HarnessConfig,
};
use provider_abi::ErrorKind;
use rand::Rng;
use serde_json::{json, Value};
use std::{
    path::Path,
    process::{Command, Output, Stdio},
    time::Duration,
};

fn simulator() -> Simulator {
    Simulator::start(SimConfig { rate_limit: None, ..Default::default() }).expect("start the simulator")
}

fn provider_config(sim: &Simulator) -> Value {
    json!({
        "apiUrl": sim.url(),
        "apiKey": sim.api_key(),
        "shape": "s-1vcpu-1gb",
        "reuseLease": true,
        "timeoutMs": 30_000,
        "requestsPerMinute": 100_000,
    })
}

/// Writes the harness configuration file for `sim` into `dir`.
fn config_file(sim: &Simulator, dir: &Path) -> String {
    let path = dir.join("config.json");
    let config = json!({"companyId": "acme", "environmentId": "dev", "config": provider_config(sim)});
    std::fs::write(&path, config.to_string()).unwrap();
    path.to_string_lossy().into_owned()
}

fn harness(ledger: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_host-harness"))
        .arg("--ledger")
        .arg(ledger)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run host-harness")
}

fn stdout_json(output: &Output) -> Value {
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout.lines().last().unwrap_or_else(|| panic!("no output; stderr: {}", stderr(output)));
    serde_json::from_str(line).unwrap_or_else(|_| panic!("not JSON: {line}"))
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn a_release_reporting_cleanup_unconfirmed_falls_back_to_destroy() {
    let sim = simulator();
    // The sandbox vanishes once its pause is accepted: the release cannot
    // confirm cleanup and reports `cleanup_unconfirmed`.
    sim.add_fault(FaultRule::new(
        "POST /v1/sandboxes/*/pause",
        FaultTrigger::from_nth(1),
        FaultKind::ForceStopped,
    ));
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(&dir.path().join("ledger.sqlite3")).unwrap();
    let provider = load_provider(None).expect("load the CreateOS provider");
    let config = HarnessConfig::for_config(provider_config(&sim));
    let host = Host::new(&provider, &ledger, &config, Owner::Lifecycle, "fallback", true);

    let held = host.acquire().expect("acquire");
    let released = host.release(&held).expect("the fallback destroy succeeds");
    let Released::DestroyedInstead(cause) = released else { panic!("not destroyed instead: {released:?}") };
    assert_eq!(cause.kind, ErrorKind::CLEANUP_UNCONFIRMED);
    let seen = sim.ledger();
    assert_eq!(seen.count("POST", "/v1/sandboxes/*/pause"), 1);
    assert_eq!(seen.count("DELETE", "/v1/sandboxes/*"), 1, "the fallback destroy");
    assert!(sim.live_sandboxes().is_empty());
    let row = ledger.get(held.row).unwrap().unwrap();
    assert_eq!(row.state, LeaseState::Destroyed);
    // The lifecycle reports it as a failed release and never resumes.
    let mut steps: Vec<StepReport> = Vec::new();
    let mut collect = |step: &StepReport| steps.push(step.clone());
    assert!(!lifecycle::run(&host, &mut collect));
    assert!(!steps.iter().any(|step| step.step == "resume"), "never resumed: {steps:?}");
    if let Some(release) = steps.iter().find(|step| step.step == "release") {
        assert_eq!(release.error.as_ref().map(|error| error.kind), Some(ErrorKind::CLEANUP_UNCONFIRMED));
        assert!(release.note.contains("destroyed instead"), "{release:?}");
    }
    assert_eq!(sim.ledger().count("POST", "/v1/sandboxes/*/resume"), 0);
    assert!(sim.live_sandboxes().is_empty());
}

#[test]
fn a_lease_the_ledger_knows_as_unconfirmed_is_destroyed_never_reused() {
    let sim = simulator();
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(&sim, dir.path());
    let ledger_path = dir.path().join("ledger.sqlite3");
    for command in ["release", "resume"] {
        let acquired = harness(&ledger_path, &["acquire", "--config", &config]);
        assert_eq!(acquired.status.code(), Some(0), "{}", stderr(&acquired));
        let lease = stdout_json(&acquired);
        let id = lease["providerLeaseId"].as_str().unwrap().to_owned();
        let lease_path = dir.path().join("lease.json");
        std::fs::write(&lease_path, lease.to_string()).unwrap();
        {
            let ledger = Ledger::open(&ledger_path).unwrap();
            let row = ledger.find(&id, "acme", "dev").unwrap().expect("the acquire was recorded");
            assert_eq!(row.state, LeaseState::Active);
            assert!(!row.to_json().to_string().contains(sim.api_key()), "no key in the ledger");
            ledger.set_state(row.id, LeaseState::Unconfirmed, "test", None).unwrap();
        }

        let output =
            harness(&ledger_path, &[command, "--config", &config, "--lease", lease_path.to_str().unwrap()]);
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
        let after = stdout_json(&output);
        assert_eq!(after["expired"], true, "{command}: the lease is gone");
        assert_eq!(after["providerLeaseId"], Value::Null);
        let log = stderr(&output);
        assert!(log.contains("WARN") && log.contains(&id), "{command}: the event is logged: {log}");
        assert!(!log.contains(sim.api_key()));
        let row = Ledger::open(&ledger_path).unwrap().find(&id, "acme", "dev").unwrap().unwrap();
        assert_eq!(row.state, LeaseState::Destroyed);
    }
    let seen = sim.ledger();
    assert_eq!(seen.count("POST", "/v1/sandboxes/*/pause"), 0, "never released for reuse");
    assert_eq!(seen.count("POST", "/v1/sandboxes/*/resume"), 0, "never resumed");
    assert!(sim.live_sandboxes().is_empty());
}

/// Kills `soak` runs with SIGKILL at random moments, then sweeps.
///
/// Soundness: the simulator lives in this test process, so after the sweep
/// its own list of live sandboxes is compared with the ledger. Every sandbox
/// the ledger names must be deleted. A sandbox the ledger cannot name is
/// possible only when a kill landed between `POST /sandboxes` and the
/// provider returning the lease (CreateOS has no idempotency key, so nobody
/// can name it): each such sandbox must be matched by an `acquiring` row
/// without a lease id, which `sweep` reports as unresolvable.
#[test]
fn the_ledger_survives_sigkill_and_sweep_leaves_nothing_it_can_name() {
    let sim = simulator();
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(&sim, dir.path());
    let ledger_path = dir.path().join("ledger.sqlite3");
    let mut rng = rand::thread_rng();
    for round in 0..3 {
        let mut child = Command::new(env!("CARGO_BIN_EXE_host-harness"))
            .arg("--ledger")
            .arg(&ledger_path)
            .args(["soak", "--config", &config, "--leases", "60", "--concurrency", "6"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let delay = Duration::from_millis(rng.gen_range(400..3000));
        std::thread::sleep(delay);
        assert!(
            child.try_wait().unwrap().is_none(),
            "round {round}: the soak was still running at {delay:?}"
        );
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
    }

    let swept = harness(&ledger_path, &["sweep", "--config", &config, "--json"]);
    assert_eq!(swept.status.code(), Some(0), "{}", stderr(&swept));
    let summary = stdout_json(&swept);
    assert_eq!(summary["failed"], 0, "{summary}");

    let rows = Ledger::open(&ledger_path).unwrap().list().unwrap();
    assert!(!rows.is_empty());
    let seen = sim.ledger();
    let mut unresolvable = 0;
    for row in &rows {
        match &row.provider_lease_id {
            Some(id) => {
                assert_eq!(row.state, LeaseState::Destroyed, "{}", row.to_json());
                let sandbox =
                    seen.sandboxes.iter().find(|sandbox| &sandbox.id == id).expect("a real sandbox");
                assert!(sandbox.deleted, "{id} was destroyed");
            }
            None if row.state == LeaseState::Acquiring => unresolvable += 1,
            None => assert_eq!(row.state, LeaseState::Destroyed, "{}", row.to_json()),
        }
    }
    let live = sim.live_sandboxes();
    let named = |id: &String| rows.iter().any(|row| row.provider_lease_id.as_ref() == Some(id));
    assert!(!live.iter().any(named), "every sandbox the ledger names is gone: {live:?}");
    assert!(
        live.len() <= unresolvable,
        "{} live sandboxes, only {unresolvable} acquires cut short before naming one",
        live.len()
    );
    assert_eq!(summary["unresolvable"].as_u64().unwrap() as usize, unresolvable);
    let left_behind = summary["destroyed"].as_u64().unwrap() as usize + unresolvable;
    assert!(left_behind > 0, "the last kill interrupted lifecycles in flight: {summary}");
}
