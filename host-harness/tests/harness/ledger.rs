//! The release rule's defensive policy and the durable lease ledger, against a
//! simulator this test process starts itself: it outlives every harness
//! process the tests run (and kill), and its own view of which sandboxes are
//! live is the ground truth the ledger is checked against.

use crate::common::wait_until;
use createos_sim::{FaultKind, FaultRule, FaultTrigger, SimConfig, Simulator};
use host_harness::{
    config_file::harness_environment,
    lifecycle::{self, StepReport},
    plugin::load_provider,
};
use provider_abi::ErrorKind;
use provider_host::{
    host::{Host, Released},
    store::sqlite::Ledger,
    store::LeaseStore,
    store::{LeaseState, Owner},
    wait,
};
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

/// `host-harness acquire`: the lease it holds, as it printed it.
fn acquire(ledger: &Path, config: &str) -> Value {
    let acquired = harness(ledger, &["acquire", "--config", config]);
    assert_eq!(acquired.status.code(), Some(0), "{}", stderr(&acquired));
    stdout_json(&acquired)
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
    let mut config = harness_environment(provider_config(&sim));
    config.api_in_process = true;
    let host = Host::new(&provider, &ledger, &config, Owner::Lifecycle, "fallback");

    let held = wait(host.acquire()).expect("acquire");
    let released = wait(host.release(&held)).expect("the fallback destroy succeeds");
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
        let lease = acquire(&ledger_path, &config);
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
/// Write-ahead: the provider hands the host each sandbox the moment the
/// creation reply arrives, and the host commits it before the provider goes
/// on. Sandbox creation here takes 3 s, so before write-ahead every
/// lifecycle killed while its sandbox was `creating` leaked a sandbox the
/// ledger could not name; every kill comes 1.8 to 3 s after the soak
/// started, so the first creates were always among them. Now a sandbox still
/// live after the sweep must have been created within moments of a kill (its
/// reply in flight, or read but not yet committed), and each is matched by a
/// row without a lease id whose request left (`creating`) that `sweep`
/// reports, exiting non-zero with one line saying what to do; a row whose
/// request never left (`acquiring`) it closes without a word.
#[test]
fn after_sigkill_sweep_leaves_no_sandbox_whose_creation_reply_was_read() {
    const CONCURRENCY: usize = 6;
    /// How long before a kill a sandbox may have been created and still
    /// escape the ledger: the reply's trip and one synchronous SQLite commit
    /// (on the async path, once the soak's one thread gets to it), with room
    /// for a loaded CI machine whose fsyncs queue behind other tests (400 ms
    /// was once too little there). Below the earliest kill, and far below
    /// the 3 s a sandbox spends creating.
    const IN_FLIGHT: Duration = Duration::from_millis(1000);
    let sim = Simulator::start(SimConfig {
        rate_limit: None,
        create_delay: Duration::from_millis(3000),
        ..Default::default()
    })
    .expect("start the simulator");
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(&sim, dir.path());
    let ledger_path = dir.path().join("ledger.sqlite3");
    let mut rng = rand::thread_rng();
    let mut kills = Vec::new();
    for round in 0..3 {
        let mut child = Command::new(env!("CARGO_BIN_EXE_host-harness"))
            .arg("--ledger")
            .arg(&ledger_path)
            .args(["soak", "--config", &config, "--leases", "60", "--concurrency", &CONCURRENCY.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let delay = Duration::from_millis(rng.gen_range(1800..3000));
        std::thread::sleep(delay); // a random kill instant, not a synchronisation
        assert!(
            child.try_wait().unwrap().is_none(),
            "round {round}: the soak was still running at {delay:?}"
        );
        child.kill().unwrap(); // SIGKILL
        kills.push(std::time::SystemTime::now());
        child.wait().unwrap();
    }

    let swept = harness(&ledger_path, &["sweep", "--config", &config, "--json"]);
    let summary = stdout_json(&swept);
    assert_eq!(summary["failed"], 0, "{summary}");
    let unresolvable = summary["unresolvable"].as_u64().unwrap() as usize;
    if unresolvable == 0 {
        assert_eq!(swept.status.code(), Some(0), "{}", stderr(&swept));
    } else {
        assert_eq!(swept.status.code(), Some(1), "unresolved rows fail the sweep: {summary}");
        let advice = stderr(&swept);
        assert_eq!(advice.lines().filter(|line| line.contains("name no sandbox")).count(), 1, "{advice}");
    }

    let rows = Ledger::open(&ledger_path).unwrap().list().unwrap();
    let seen = sim.ledger();
    for row in rows.iter().filter(|row| row.provider_lease_id.is_some()) {
        assert_eq!(row.state, LeaseState::Destroyed, "{}", row.to_json());
    }
    // A row whose creation request never left was closed without a word;
    // one whose request left and whose reply never came is unresolvable.
    assert!(!rows.iter().any(|row| row.state == LeaseState::Acquiring), "sweep closes the rows never sent");
    let unnamed =
        rows.iter().filter(|row| row.provider_lease_id.is_none() && row.state == LeaseState::Creating);
    assert_eq!(unnamed.count(), unresolvable);
    for sandbox in seen.sandboxes.iter().filter(|sandbox| !sandbox.deleted) {
        let in_flight_at_a_kill = kills
            .iter()
            .any(|kill| kill.duration_since(sandbox.created_at).is_ok_and(|before| before <= IN_FLIGHT));
        assert!(in_flight_at_a_kill, "sandbox {} was created well before any kill yet leaked", sandbox.id);
        assert!(!rows.iter().any(|row| row.provider_lease_id.as_ref() == Some(&sandbox.id)));
    }
    let live = sim.live_sandboxes().len();
    assert!(live <= unresolvable, "{live} live sandboxes, {unresolvable} unresolved rows");
    assert!(unresolvable <= CONCURRENCY * kills.len(), "bounded by the creates in flight at the kills");
    assert!(
        summary["destroyed"].as_u64().unwrap() > 0,
        "the kills interrupted lifecycles in flight: {summary}"
    );
}

/// Writes a harness configuration whose provider configuration leaves
/// `reuseLease` out (its documented default is `false`).
fn config_without_reuse(sim: &Simulator, dir: &Path) -> String {
    let path = dir.join("config-default.json");
    let mut provider = provider_config(sim);
    provider.as_object_mut().unwrap().remove("reuseLease");
    let config = json!({"companyId": "acme", "environmentId": "dev", "config": provider});
    std::fs::write(&path, config.to_string()).unwrap();
    path.to_string_lossy().into_owned()
}

#[test]
fn lifecycle_with_the_default_configuration_says_release_deleted_the_lease_and_succeeds() {
    let sim = simulator();
    let dir = tempfile::tempdir().unwrap();
    let config = config_without_reuse(&sim, dir.path());
    let output = harness(&dir.path().join("ledger.sqlite3"), &["lifecycle", "--config", &config, "--json"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let steps: Vec<Value> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    let resume = steps.iter().find(|step| step["step"] == "resume").expect("a resume line");
    assert!(resume["note"].as_str().unwrap().contains("skipped"), "{resume}");
    assert_eq!(sim.ledger().count("POST", "/v1/sandboxes/*/resume"), 0, "never resumed a deleted lease");
    assert_eq!(sim.ledger().count("POST", "/v1/sandboxes/*/pause"), 0);
    assert!(sim.live_sandboxes().is_empty());
}

#[test]
fn a_held_lease_is_swept_only_when_the_user_says_so() {
    let sim = simulator();
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(&sim, dir.path());
    let ledger_path = dir.path().join("ledger.sqlite3");
    let id = acquire(&ledger_path, &config)["providerLeaseId"].as_str().unwrap().to_owned();

    // A lifecycle sweeps dead runs first; a plain sweep sweeps the abandoned:
    // neither touches the held lease (its key in the config or not).
    let lifecycle = harness(&ledger_path, &["lifecycle", "--config", &config]);
    assert_eq!(lifecycle.status.code(), Some(0), "{}", stderr(&lifecycle));
    for args in [vec!["sweep", "--config", &config], vec!["sweep"]] {
        let swept = harness(&ledger_path, &args);
        assert_eq!(swept.status.code(), Some(0), "{args:?}: {}", stderr(&swept));
    }
    assert!(sim.live_sandboxes().contains(&id), "the held lease is untouched");
    let row = Ledger::open(&ledger_path).unwrap().find(&id, "acme", "dev").unwrap().unwrap();
    assert_eq!(row.state, LeaseState::Active);

    let swept = harness(&ledger_path, &["sweep", "--include-held", "--config", &config]);
    assert_eq!(swept.status.code(), Some(0), "{}", stderr(&swept));
    assert!(!sim.live_sandboxes().contains(&id), "--include-held destroys it");
}

#[test]
fn a_call_refused_before_any_request_leaves_no_ledger_row() {
    let sim = simulator();
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(&sim, dir.path());
    let ledger_path = dir.path().join("ledger.sqlite3");
    let lease = acquire(&ledger_path, &config);
    let other_tenant = dir.path().join("other-tenant.json");
    let other = json!({"companyId": "globex", "environmentId": "dev", "config": provider_config(&sim)});
    std::fs::write(&other_tenant, other.to_string()).unwrap();
    let rows_before = Ledger::open(&ledger_path).unwrap().list().unwrap().len();
    let requests_before = sim.ledger().requests.len();

    let long_id = "a".repeat(100_000);
    let cases: [(&str, Value, &Path); 3] = [
        ("a path as the lease id", json!("../../v1/sandboxes"), Path::new(&config)),
        ("a 100,000-character id", json!(long_id), Path::new(&config)),
        ("another tenant's configuration", lease["providerLeaseId"].clone(), &other_tenant),
    ];
    for (case, id, config) in cases {
        let mut forged = lease.clone();
        forged["providerLeaseId"] = id;
        let lease_path = dir.path().join("forged.json");
        std::fs::write(&lease_path, forged.to_string()).unwrap();
        for command in [vec!["exec"], vec!["resume"], vec!["release"], vec!["destroy"]] {
            let mut args = command.clone();
            args.extend(["--config", config.to_str().unwrap(), "--lease", lease_path.to_str().unwrap()]);
            if command == ["exec"] {
                args.extend(["--", "/bin/true"]);
            }
            let output = harness(&ledger_path, &args);
            assert_eq!(output.status.code(), Some(1), "{case}, {command:?}: {}", stderr(&output));
            assert_eq!(stderr(&output).lines().count(), 1, "{case}: one line: {}", stderr(&output));
        }
    }
    assert_eq!(sim.ledger().requests.len(), requests_before, "nothing was sent");
    assert_eq!(Ledger::open(&ledger_path).unwrap().list().unwrap().len(), rows_before, "no row was left");
    let swept = harness(&ledger_path, &["sweep", "--config", &config]);
    assert_eq!(swept.status.code(), Some(0), "later sweeps still succeed: {}", stderr(&swept));
}

/// A host killed after its DELETE reached the API (a probe deleting its own
/// sandbox, a `destroy` whose reply was still in flight) leaves its row
/// `creating` or `destroying` although the sandbox is gone. The sweep that
/// finds the row closes it without deleting the sandbox a second time: the
/// chaos test's "0 double destroys" once failed on a probe killed so.
#[test]
fn a_sweep_never_deletes_again_a_sandbox_whose_delete_went_out_before_a_kill() {
    let sim = simulator();
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(&sim, dir.path());
    let ledger_path = dir.path().join("ledger.sqlite3");
    let lease_path = dir.path().join("lease.json");
    std::fs::write(&lease_path, acquire(&ledger_path, &config).to_string()).unwrap();
    let lease_path = lease_path.to_str().unwrap();
    for (args, left) in [
        (vec!["probe", "--config", &config], LeaseState::Creating),
        (vec!["destroy", "--config", &config, "--lease", lease_path], LeaseState::Destroying),
    ] {
        // Every DELETE is carried out, then its reply held past the test's end.
        sim.add_fault(FaultRule::new(
            "DELETE /v1/sandboxes/*",
            FaultTrigger::from_nth(1),
            FaultKind::DelayReply(Duration::from_secs(3600)),
        ));
        let deleted = || sim.ledger().sandboxes.iter().filter(|sandbox| sandbox.deleted).count();
        let deleted_before = deleted();
        let mut child = Command::new(env!("CARGO_BIN_EXE_host-harness"))
            .arg("--ledger")
            .arg(&ledger_path)
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        wait_until("the API deleted the sandbox", Duration::from_secs(60), || deleted() > deleted_before);
        child.kill().unwrap(); // SIGKILL, its DELETE's reply still in flight
        child.wait().unwrap();
        sim.clear_faults();
        let rows = Ledger::open(&ledger_path).unwrap().list().unwrap();
        let row =
            rows.iter().find(|row| row.state == left).unwrap_or_else(|| panic!("{args:?}: no {left} row"));
        let sandbox = row.provider_lease_id.clone().expect("the row names its sandbox");
        assert!(!sim.live_sandboxes().contains(&sandbox));

        let swept = harness(&ledger_path, &["sweep", "--config", &config, "--json"]);
        assert_eq!(swept.status.code(), Some(0), "{args:?}: {}", stderr(&swept));
        assert_eq!(stdout_json(&swept)["destroyed"], 1, "{args:?}");
        let row = Ledger::open(&ledger_path).unwrap().get(row.id).unwrap().unwrap();
        assert_eq!(row.state, LeaseState::Destroyed, "{args:?}");
        // The killed host's own DELETE is never recorded (its reply is still
        // held), so any DELETE of the sandbox on record is the sweep's.
        let deletes = sim.ledger().count("DELETE", &format!("/v1/sandboxes/{sandbox}"));
        assert_eq!(deletes, 0, "{args:?}: the sweep deleted {sandbox} again");
    }
}

/// A soak killed with SIGKILL while most of its lifecycles wait for the
/// pacer to admit their creation request: those requests never left, so
/// their rows (still `acquiring`) are closed by `sweep` without a word, and
/// the sweep speaks only of creations that may really exist.
#[test]
fn a_sweep_after_a_kill_closes_the_rows_whose_creation_never_left_without_a_word() {
    const CONCURRENCY: usize = 20;
    let sim = simulator();
    let dir = tempfile::tempdir().unwrap();
    // Two requests a minute: the first creation goes out, the others wait
    // for the pacer far longer than this test runs.
    let mut config = provider_config(&sim);
    config["requestsPerMinute"] = json!(2);
    config["timeoutMs"] = json!(5_000);
    let path = dir.path().join("config.json");
    std::fs::write(&path, json!({"companyId": "acme", "environmentId": "dev", "config": config}).to_string())
        .unwrap();
    let config = path.to_string_lossy().into_owned();
    let ledger_path = dir.path().join("ledger.sqlite3");
    let mut child = Command::new(env!("CARGO_BIN_EXE_host-harness"))
        .arg("--ledger")
        .arg(&ledger_path)
        .args(["soak", "--config", &config, "--leases", "40", "--concurrency", &CONCURRENCY.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Each lifecycle begins with a probe, whose row is written before its
    // creation request waits for the pacer.
    let begun = || Ledger::open(&ledger_path).and_then(|ledger| ledger.list()).map_or(0, |rows| rows.len());
    wait_until("every lifecycle in flight has begun its row", Duration::from_secs(30), || {
        begun() >= CONCURRENCY
    });
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();

    let rows = Ledger::open(&ledger_path).unwrap().list().unwrap();
    let never_sent = rows.iter().filter(|row| row.state == LeaseState::Acquiring).count();
    assert!(never_sent >= CONCURRENCY - 2, "most creations were waiting for the pacer: {rows:?}");
    let swept = harness(&ledger_path, &["sweep", "--config", &config, "--json"]);
    let summary = stdout_json(&swept);
    let in_flight =
        rows.iter().filter(|row| row.state == LeaseState::Creating && row.provider_lease_id.is_none());
    assert_eq!(summary["unresolvable"].as_u64(), Some(in_flight.count() as u64), "{summary}");
    // The sweep acts on the rows that name a sandbox (at the stored two
    // requests a minute, a destroy may not fit its deadline: that is
    // `failed`, and the row stays for the next sweep); it says nothing of
    // the rows never sent.
    let named = rows.iter().filter(|row| row.provider_lease_id.is_some()).count() as u64;
    let acted = summary["destroyed"].as_u64().unwrap() + summary["failed"].as_u64().unwrap();
    assert_eq!(acted, named, "{summary}");
    if summary["unresolvable"] == 0 {
        assert!(!stderr(&swept).contains("name no sandbox"), "{}", stderr(&swept));
    }
    let after = Ledger::open(&ledger_path).unwrap().list().unwrap();
    assert!(!after.iter().any(|row| row.state == LeaseState::Acquiring), "the rows never sent are closed");
}

/// Group commit under SIGKILL: a soak whose lifecycles write together is
/// killed while they do (every probe done and every creation recorded, ten
/// lifecycles destroyed, the pauses after the twentieth carried out but
/// their replies held, the lifecycles between still writing). Each sandbox
/// the API ever created is named by a row; each one the API deleted has its
/// row `destroying` or `destroyed` (a probe's: `destroyed`), since the
/// DELETE went out only once that record was committed; and `sweep` then
/// leaves no sandbox and no row it cannot resolve.
#[test]
fn a_sigkill_while_writes_commit_together_loses_no_write_a_hook_went_on_after() {
    const IN_FLIGHT: usize = 40;
    const DESTROYED: usize = 10;
    let sim = simulator();
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(&sim, dir.path());
    let ledger_path = dir.path().join("ledger.sqlite3");
    sim.add_fault(FaultRule::new(
        "POST /v1/sandboxes/*/pause",
        FaultTrigger::from_nth(2 * DESTROYED as u64 + 1),
        FaultKind::DelayReply(Duration::from_secs(3600)),
    ));
    let mut child = Command::new(env!("CARGO_BIN_EXE_host-harness"))
        .arg("--ledger")
        .arg(&ledger_path)
        .args(["soak", "--config", &config, "--leases", &IN_FLIGHT.to_string()])
        .args(["--concurrency", &IN_FLIGHT.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let rows = || Ledger::open_read_only(&ledger_path).ok().flatten().and_then(|ledger| ledger.list().ok());
    wait_until("every creation is recorded and ten lifecycles ended", Duration::from_secs(120), || {
        rows().is_some_and(|rows| {
            let (probes, leases): (Vec<_>, Vec<_>) = rows.iter().partition(|row| row.owner == Owner::Probe);
            probes.len() == IN_FLIGHT
                && probes.iter().all(|row| row.state == LeaseState::Destroyed)
                && leases.len() == IN_FLIGHT
                && leases.iter().all(|row| row.provider_lease_id.is_some())
                && leases.iter().filter(|row| row.state == LeaseState::Destroyed).count() >= DESTROYED
        })
    });
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    sim.clear_faults();

    let rows = Ledger::open(&ledger_path).unwrap().list().unwrap();
    let row_of = |sandbox: &str| rows.iter().find(|row| row.provider_lease_id.as_deref() == Some(sandbox));
    let seen = sim.ledger();
    assert_eq!(seen.sandboxes.len(), 2 * IN_FLIGHT, "a probe and a lease per lifecycle");
    for sandbox in &seen.sandboxes {
        let row = row_of(&sandbox.id).unwrap_or_else(|| panic!("no row names sandbox {}", sandbox.id));
        if sandbox.deleted {
            assert!(
                matches!(row.state, LeaseState::Destroying | LeaseState::Destroyed),
                "sandbox {} was deleted while its row said {}",
                sandbox.id,
                row.state
            );
        }
    }
    assert!(
        rows.iter().any(|row| row.state != LeaseState::Destroyed),
        "the kill came while lifecycles were in flight"
    );

    let swept = harness(&ledger_path, &["sweep", "--config", &config, "--json"]);
    let summary = stdout_json(&swept);
    assert_eq!(swept.status.code(), Some(0), "{summary} {}", stderr(&swept));
    assert_eq!(summary["unresolvable"], 0, "{summary}");
    assert_eq!(summary["failed"], 0, "{summary}");
    assert_eq!(sim.live_sandboxes(), Vec::<String>::new(), "{summary}");
    let rows = Ledger::open(&ledger_path).unwrap().list().unwrap();
    assert!(rows.iter().all(|row| row.state == LeaseState::Destroyed), "{rows:?}");
}
