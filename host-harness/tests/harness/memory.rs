//! What a provider learnt outlives the process, through the binary: the
//! harness hands a provider the memory the ledger keeps after `setup` and
//! saves what it exports when the command ends. The fixture provider's
//! memory counts the leases it made (`leases`; a lifecycle makes two, the
//! probe's and its own); a damaged or oversized
//! stored entry is a warning, never a failed command; a 2.0 provider
//! without the hooks runs as it always did. The CreateOS provider's memory
//! is its poll schedule: a second process polls each transition when the
//! first one learnt it completes, not on the reference's 250 ms cadence.

use createos_sim::{Ledger, SimConfig, Simulator};
use rusqlite::{params, Connection};
use std::{
    path::Path,
    process::{Command, Output},
    time::Duration,
};

/// `host-harness --plugin LIBRARY --ledger LEDGER ARGS...`, its state in `dir`.
fn harness(dir: &Path, library: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_host-harness"))
        .env("XDG_STATE_HOME", dir)
        .env_remove("RUST_LOG")
        .arg("--plugin")
        .arg(e2e::library(library))
        .arg("--ledger")
        .arg(dir.join("ledger.sqlite3"))
        .args(args)
        .output()
        .expect("run host-harness")
}

/// Runs a lifecycle, which must succeed; returns its standard error.
fn lifecycle(dir: &Path, library: &str) -> String {
    let output = harness(dir, library, &["lifecycle"]);
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_eq!(output.status.code(), Some(0), "{}{stderr}", String::from_utf8_lossy(&output.stdout));
    stderr
}

/// The memory the ledger keeps for `provider`, by key.
fn stored(dir: &Path, provider: &str) -> Vec<(String, Vec<u8>)> {
    let conn = Connection::open(dir.join("ledger.sqlite3")).unwrap();
    let mut statement =
        conn.prepare("SELECT key, value FROM provider_memory WHERE provider_id = ?1 ORDER BY key").unwrap();
    let rows = statement.query_map([provider], |row| Ok((row.get(0)?, row.get(1)?))).unwrap();
    rows.collect::<Result<_, _>>().unwrap()
}

/// Replaces (or adds) one stored entry of `provider`.
fn store(dir: &Path, provider: &str, key: &str, value: &[u8]) {
    let conn = Connection::open(dir.join("ledger.sqlite3")).unwrap();
    conn.execute(
        "INSERT INTO provider_memory (provider_id, key, value, saved_at_ms)
         VALUES (?1, ?2, ?3, CAST(strftime('%s', 'now') AS INTEGER) * 1000)
         ON CONFLICT (provider_id, key) DO UPDATE SET value = excluded.value",
        params![provider, key, value],
    )
    .unwrap();
}

/// The warning lines of a run's standard error.
fn warnings(stderr: &str) -> Vec<&str> {
    stderr.lines().filter(|line| line.contains("WARN")).collect()
}

#[test]
fn a_second_process_starts_with_what_the_first_one_learnt() {
    let dir = tempfile::tempdir().unwrap();
    let first = lifecycle(dir.path(), "fixture_provider");
    assert!(warnings(&first).is_empty(), "{first}");
    assert_eq!(stored(dir.path(), "fixture"), [("leases".to_owned(), b"2".to_vec())]);
    // The second process counts on from what the first one saved.
    lifecycle(dir.path(), "fixture_provider");
    assert_eq!(stored(dir.path(), "fixture"), [("leases".to_owned(), b"4".to_vec())]);
}

#[test]
fn a_damaged_stored_entry_is_a_warning_and_the_lifecycle_runs_as_without_memory() {
    let dir = tempfile::tempdir().unwrap();
    lifecycle(dir.path(), "fixture_provider");
    store(dir.path(), "fixture", "leases", b"\xff not a number");
    let stderr = lifecycle(dir.path(), "fixture_provider");
    let warned = warnings(&stderr);
    assert_eq!(warned.len(), 1, "{stderr}");
    assert!(warned[0].contains("the provider did not take its memory back"), "{stderr}");
    assert!(warned[0].contains("fixture cannot read its remembered `leases`"), "{stderr}");
    // It took nothing, so it counts its own leases alone.
    assert_eq!(stored(dir.path(), "fixture"), [("leases".to_owned(), b"2".to_vec())]);
}

#[test]
fn an_oversized_stored_entry_is_a_warning_and_never_reaches_the_provider() {
    let dir = tempfile::tempdir().unwrap();
    lifecycle(dir.path(), "fixture_provider");
    let huge = vec![b'x'; provider_abi::MEMORY_LIMIT + 1];
    store(dir.path(), "fixture", "huge", &huge);
    let stderr = lifecycle(dir.path(), "fixture_provider");
    let warned = warnings(&stderr);
    assert_eq!(warned.len(), 1, "{stderr}");
    assert!(warned[0].contains("a stored memory entry is over the limit: not handed back"), "{stderr}");
    assert!(warned[0].contains("huge"), "{stderr}");
    // The rest was handed back: the count goes on.
    let leases = stored(dir.path(), "fixture").into_iter().find(|(key, _)| key == "leases");
    assert_eq!(leases, Some(("leases".to_owned(), b"4".to_vec())));
}

#[test]
fn a_provider_without_the_memory_hooks_runs_unchanged_and_leaves_no_memory() {
    // The frozen 2.0 library has no optional hook (nor `probe`, which a
    // lifecycle needs): a lease acquired by one process, destroyed by the next.
    let dir = tempfile::tempdir().unwrap();
    let (config, lease) = (dir.path().join("config.json"), dir.path().join("lease.json"));
    std::fs::write(&config, "{}").unwrap();
    let config = config.to_str().unwrap();
    let acquired = harness(dir.path(), "fixture_frozen", &["acquire", "--config", config]);
    assert_eq!(acquired.status.code(), Some(0), "{}", String::from_utf8_lossy(&acquired.stderr));
    std::fs::write(&lease, &acquired.stdout).unwrap();
    let destroyed = harness(
        dir.path(),
        "fixture_frozen",
        &["destroy", "--config", config, "--lease", lease.to_str().unwrap()],
    );
    assert_eq!(destroyed.status.code(), Some(0), "{}", String::from_utf8_lossy(&destroyed.stderr));
    for output in [acquired, destroyed] {
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(warnings(&stderr).is_empty(), "{stderr}");
    }
    assert!(stored(dir.path(), "fixture").is_empty());
}

/// How long each CreateOS transition lasts in the simulator: the reference
/// cadence polls it at 250 and 500 ms (both too early) and 750 ms, and
/// learns that it ends about 625 ms after it began.
const TRANSITION: Duration = Duration::from_millis(600);

/// Each transition of the sandboxes of `ledger`'s transitions from index
/// `from` on: its phase and how long after it began its first poll (any
/// request naming the sandbox) was received.
fn first_polls(ledger: &Ledger, from: usize) -> Vec<(&'static str, Duration)> {
    ledger.transitions[from..]
        .iter()
        .map(|transition| {
            let earlier = ledger.transitions.iter().filter(|other| other.sandbox_id == transition.sandbox_id);
            let phase = match transition.to.as_str() {
                "paused" => "pausing",
                _ if earlier.take_while(|other| *other != transition).count() == 0 => "creating",
                _ => "resuming",
            };
            let first = ledger
                .requests
                .iter()
                .filter(|request| request.path.contains(&transition.sandbox_id))
                .filter(|request| request.received_at > transition.began_at)
                .map(|request| request.received_at - transition.began_at)
                .min()
                .expect("every transition is polled");
            (phase, first)
        })
        .collect()
}

#[test]
fn a_second_createos_process_polls_each_transition_when_the_first_one_learnt_it_ends() {
    let sim = Simulator::start(SimConfig {
        rate_limit: None,
        create_delay: TRANSITION,
        pause_delay: TRANSITION,
        resume_delay: TRANSITION,
        ..Default::default()
    })
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.json");
    let harness_config = serde_json::json!({"driverKey": "createos", "config": sim.provider_config(true)});
    std::fs::write(&config, harness_config.to_string()).unwrap();
    let run = || {
        let output =
            harness(dir.path(), "createos_provider", &["lifecycle", "--config", config.to_str().unwrap()]);
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        assert_eq!(output.status.code(), Some(0), "{}{stderr}", String::from_utf8_lossy(&output.stdout));
        assert!(warnings(&stderr).is_empty(), "{stderr}");
    };
    run();
    let cold = sim.ledger();
    let keys: Vec<String> = stored(dir.path(), "createos").into_iter().map(|(key, _)| key).collect();
    assert_eq!(keys, [format!("schedule {}", sim.url().trim_end_matches('/'))], "one origin, never the key");
    run();
    let warm = sim.ledger();
    let (cold, warm) = (first_polls(&cold, 0), first_polls(&warm, cold.transitions.len()));
    let phases =
        |polls: &[(&'static str, Duration)]| polls.iter().map(|(phase, _)| *phase).collect::<Vec<_>>();
    // Probe (create, delete), then acquire, release (pause), resume.
    assert_eq!(phases(&cold), ["creating", "creating", "pausing", "resuming"]);
    assert_eq!(phases(&warm), phases(&cold));
    // The first process meets pausing and resuming cold: its first poll
    // comes on the reference cadence, 250 ms in.
    for (phase, first) in &cold[2..] {
        assert!(*first < Duration::from_millis(500), "cold {phase}: first poll {first:?} after it began");
    }
    // The second one knows them all from the first: no poll before the
    // learnt end (timers never fire early, so this holds however slow the
    // machine is).
    for (phase, first) in &warm {
        assert!(*first >= Duration::from_millis(500), "{phase}: first poll {first:?} after it began");
    }
}
