//! A fleet of hosts on one PostgreSQL ledger: real `host-harness`
//! processes, a private PostgreSQL cluster and a simulator this test process
//! starts (its request log is the ground truth). Each harness process is a
//! host with its own heartbeat.

use crate::common::{wait_until, ConfigDir};
use createos_sim::{FaultKind, FaultRule, FaultTrigger, SimConfig, Simulator};
use pg_cluster::PgCluster;
use provider_host::{
    store::postgres::{PgLedger, PgOptions},
    store::LeaseState,
    store::LeaseStore,
};
use serde_json::Value;
use std::{
    collections::{BTreeMap, BTreeSet},
    path::PathBuf,
    process::{Child, Command, Output, Stdio},
    time::{Duration, Instant},
};

/// How long a host of these tests stays alive unrenewed: short, so a killed
/// host's leases are taken over within seconds.
const EXPIRY: &str = "4s";

struct Fleet {
    sim: Simulator,
    cluster: PgCluster,
    url: String,
    dir: tempfile::TempDir,
    config: PathBuf,
}

impl Fleet {
    fn start(test: &str, sim: SimConfig) -> Option<Fleet> {
        let cluster = PgCluster::for_test(test)?;
        let url = cluster.create_database("fleet");
        let sim = Simulator::start(sim).expect("start the simulator");
        let ConfigDir { dir, config } = ConfigDir::new(&sim, |_| {});
        Some(Fleet { sim, cluster, url, dir, config })
    }

    /// `host-harness --ledger URL --heartbeat-expiry EXPIRY SUBCOMMAND --config FILE REST...`.
    fn command(&self, args: &[&str]) -> Command {
        let (subcommand, rest) = args.split_first().unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_host-harness"));
        command
            .args(["--ledger", &self.url, "--heartbeat-expiry", EXPIRY])
            .arg(subcommand)
            .arg("--config")
            .arg(&self.config)
            .args(rest)
            .stdin(Stdio::null());
        command
    }

    fn run(&self, args: &[&str]) -> Output {
        self.command(args).output().unwrap()
    }

    /// A host of the test itself, on the same ledger.
    fn host(&self) -> PgLedger {
        PgLedger::open(&self.url, &PgOptions { heartbeat_expiry: Duration::from_secs(30), pool_size: 2 })
            .unwrap()
    }

    fn sql(&self) -> postgres::Client {
        postgres::Client::connect(&self.url, postgres::NoTls).unwrap()
    }
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn last_json(stdout: &[u8]) -> Value {
    let stdout = String::from_utf8_lossy(stdout);
    let line = stdout.lines().last().unwrap_or_else(|| panic!("no output"));
    serde_json::from_str(line).unwrap_or_else(|_| panic!("not JSON: {line}"))
}

/// A lease that one host records as unconfirmed is never resumed or
/// released for reuse by another: the other host finds the flag in the
/// shared ledger and destroys the lease instead.
#[test]
fn a_lease_unconfirmed_on_one_host_is_destroyed_never_reused_by_another() {
    let Some(fleet) =
        Fleet::start("a_lease_unconfirmed_on_one_host", SimConfig { rate_limit: None, ..Default::default() })
    else {
        return;
    };
    for command in ["release", "resume"] {
        let acquired = fleet.run(&["acquire"]);
        assert_eq!(acquired.status.code(), Some(0), "{}", stderr(&acquired));
        let lease = last_json(&acquired.stdout);
        let id = lease["providerLeaseId"].as_str().unwrap().to_owned();
        let lease_path = fleet.dir.path().join("lease.json");
        std::fs::write(&lease_path, lease.to_string()).unwrap();

        // Host A (alive throughout) takes the lease and finds its cleanup unconfirmed.
        let host_a = fleet.host();
        let row = host_a.find(&id, "acme", "dev").unwrap().expect("the acquire was recorded");
        assert_eq!(row.state, LeaseState::Active);
        host_a.adopt(row.id).unwrap();
        host_a.set_state(row.id, LeaseState::Unconfirmed, "execute", None).unwrap();

        // Host B, another process, is asked to reuse it.
        let output = fleet.run(&[command, "--lease", lease_path.to_str().unwrap()]);
        assert_eq!(output.status.code(), Some(0), "{command}: {}", stderr(&output));
        let after = last_json(&output.stdout);
        assert_eq!(after["expired"], true, "{command}: the lease is gone");
        let row = host_a.get(row.id).unwrap().unwrap();
        assert_eq!(row.state, LeaseState::Destroyed, "{command}");
        assert_ne!(row.host_id.as_deref(), Some(host_a.host_id()), "host B took the row over to destroy it");
    }
    let seen = fleet.sim.ledger();
    assert_eq!(seen.count("POST", "/v1/sandboxes/*/pause"), 0, "never released for reuse");
    assert_eq!(seen.count("POST", "/v1/sandboxes/*/resume"), 0, "never resumed");
    assert!(fleet.sim.live_sandboxes().is_empty());
}

#[test]
fn leases_lists_the_fleet_ledger_and_a_bad_url_is_one_line_without_its_password() {
    let Some(fleet) = Fleet::start("leases_lists_the_fleet_ledger", SimConfig::default()) else { return };
    let acquired = fleet.run(&["acquire"]);
    assert_eq!(acquired.status.code(), Some(0), "{}", stderr(&acquired));
    let listed = Command::new(env!("CARGO_BIN_EXE_host-harness"))
        .args(["--ledger", &fleet.url, "leases", "--json"])
        .output()
        .unwrap();
    assert_eq!(listed.status.code(), Some(0), "{}", stderr(&listed));
    let row = last_json(&listed.stdout);
    assert_eq!(row["state"], "active");
    assert!(row["hostId"].as_str().is_some_and(|host| !host.is_empty()), "{row}");

    let wrong =
        format!("postgresql://postgres:s3cret@/nosuchdb?host={}", fleet.cluster.socket_dir().display());
    for args in [vec!["leases"], vec!["acquire", "--config", fleet.config.to_str().unwrap()]] {
        let output = Command::new(env!("CARGO_BIN_EXE_host-harness"))
            .args(["--ledger", &wrong])
            .args(&args)
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        let message = stderr(&output);
        assert_eq!(message.trim_end().lines().count(), 1, "{message}");
        assert!(message.contains("nosuchdb") && !message.contains("s3cret"), "{message}");
    }
}

/// The chaos target: three `soak` processes on one simulator and one
/// PostgreSQL ledger; one is killed with SIGKILL mid-run. Within its
/// heartbeat's expiry and a sweep, the survivors take over every lease it
/// held and destroy each exactly once. A share of process creations fails
/// with 500, so some leases are unconfirmed: none is ever paused or resumed
/// after that.
#[test]
fn survivors_destroy_every_lease_of_a_killed_host_exactly_once() {
    let sim = SimConfig { rate_limit: None, create_delay: Duration::from_millis(300), ..Default::default() };
    let Some(fleet) = Fleet::start("survivors_destroy_every_lease_of_a_killed_host", sim) else { return };
    fleet.sim.add_fault(FaultRule::new(
        "POST /v1/sandboxes/*/processes",
        FaultTrigger::probability(0.05, 17),
        FaultKind::Status(500),
    ));
    let spawn = || -> Child {
        fleet
            .command(&["soak", "--leases", "100000", "--concurrency", "4", "--json"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    };
    // The test's own host migrates the ledger before the soaks start.
    let observer = fleet.host();
    let mut hosts: Vec<Child> = (0..3).map(|_| spawn()).collect();
    let mut sql = fleet.sql();
    let host_of = |sql: &mut postgres::Client, pid: u32| -> Option<String> {
        sql.query_opt("SELECT host_id FROM hosts WHERE pid = $1", &[&(pid as i32)])
            .unwrap()
            .map(|row| row.get(0))
    };
    let victim = hosts.remove(0);
    let mut victim_id = None;
    wait_until("the victim holds leases in flight", Duration::from_secs(120), || {
        victim_id = victim_id.clone().or_else(|| host_of(&mut sql, victim.id()));
        let Some(id) = &victim_id else { return false };
        let held: i64 = sql
            .query_one(
                "SELECT count(*) FROM leases WHERE host_id = $1 AND state <> 'destroyed'
                   AND provider_lease_id IS NOT NULL",
                &[id],
            )
            .unwrap()
            .get(0);
        let done: i64 =
            sql.query_one("SELECT count(*) FROM leases WHERE state = 'destroyed'", &[]).unwrap().get(0);
        held >= 2 && done >= 10
    });
    let victim_id = victim_id.unwrap();
    let mut victim = victim;
    victim.kill().unwrap(); // SIGKILL
    let killed = Instant::now();
    victim.wait().unwrap();

    // What the victim held at the kill (nobody may touch it before its expiry).
    let held: BTreeMap<i64, (Option<String>, String)> = sql
        .query(
            "SELECT id, provider_lease_id, state FROM leases WHERE host_id = $1 AND state <> 'destroyed'",
            &[&victim_id],
        )
        .unwrap()
        .iter()
        .map(|row| (row.get(0), (row.get(1), row.get(2))))
        .collect();
    let named: Vec<i64> =
        held.iter().filter(|(_, (lease, _))| lease.is_some()).map(|(row, _)| *row).collect();
    assert!(!named.is_empty());
    wait_until("the survivors destroyed every lease the victim held", Duration::from_secs(120), || {
        let destroyed: i64 = sql
            .query_one("SELECT count(*) FROM leases WHERE id = ANY($1) AND state = 'destroyed'", &[&named])
            .unwrap()
            .get(0);
        destroyed as usize == named.len()
    });
    let took = killed.elapsed();
    eprintln!(
        "the victim's {} leases were destroyed {:.1} s after the kill (expiry {EXPIRY}, a sweep every half of it)",
        named.len(),
        took.as_secs_f64()
    );
    let takers: BTreeSet<String> = sql
        .query("SELECT host_id FROM leases WHERE id = ANY($1)", &[&named])
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert!(!takers.contains(&victim_id), "every row changed hands: {takers:?}");
    // The fault fires on a given call (the seed fixes which), and before the
    // kill the hosts are mostly probing: how many process creations the
    // survivors have sent by now depends on the machine's speed. They run
    // until stopped, so wait for the fault rather than hope it came.
    wait_until("a process creation was answered 500", Duration::from_secs(120), || {
        fleet.sim.ledger().requests.iter().any(|request| {
            request.method == "POST"
                && request.status == 500
                && createos_sim::path_matches("/v1/sandboxes/*/processes", &request.path)
        })
    });

    // The survivors stop (SIGTERM: in-flight lifecycles end by the normal
    // policy, then each prints its summary).
    let mut taken_over = 0;
    for survivor in hosts {
        // SAFETY: kill only signals our own child.
        assert_eq!(unsafe { libc::kill(survivor.id() as i32, libc::SIGTERM) }, 0);
        let output = survivor.wait_with_output().unwrap();
        let summary = last_json(&output.stdout);
        assert_eq!(summary["summary"], true, "{summary}");
        assert_eq!(summary["unconfirmedReused"], 0, "{summary}");
        assert_eq!(summary["panics"], 0, "{summary}");
        assert_eq!(summary["secretsSeen"], 0, "{summary}");
        // A survivor's own rows stayed its own: no ledger write of it was
        // refused (that would fail a lifecycle as `internal`).
        assert!(summary["failed"].get("internal").is_none(), "{summary}");
        taken_over += summary["takenOver"].as_u64().unwrap() as usize;
    }
    assert_eq!(taken_over, named.len(), "the survivors' summaries count each taken-over lease once");

    let seen = fleet.sim.ledger();
    // 0 double destroys: one DELETE per sandbox. Where the victim may have
    // sent one before the kill (its row `destroying`, or `acquiring` in a
    // probe or a failed acquire, both of which delete their sandbox), the
    // survivor asks first whether the sandbox still exists.
    let mut deletes: BTreeMap<&str, usize> = BTreeMap::new();
    for request in seen.requests.iter().filter(|request| request.method == "DELETE") {
        if let Some(id) = request.path.strip_prefix("/v1/sandboxes/").filter(|id| !id.contains('/')) {
            *deletes.entry(id).or_default() += 1;
        }
    }
    for (sandbox, count) in &deletes {
        assert!(
            *count == 1,
            "sandbox {sandbox} deleted {count} times; at the kill the victim held {:?}; its requests: {}",
            held.values().find(|(lease, _)| lease.as_deref() == Some(sandbox)),
            history_of(&seen, sandbox, killed)
        );
    }
    // 0 unconfirmed leases reused: after a process creation answered 500 (its
    // outcome unknown), the sandbox is never paused or resumed.
    let mut poisoned = BTreeSet::new();
    for request in &seen.requests {
        let mut parts = request.path.trim_start_matches("/v1/sandboxes/").split('/');
        let (Some(sandbox), Some(what)) = (parts.next(), parts.next()) else { continue };
        if what == "processes" && request.method == "POST" && request.status == 500 {
            poisoned.insert(sandbox.to_owned());
        } else if matches!(what, "pause" | "resume") {
            assert!(!poisoned.contains(sandbox), "unconfirmed sandbox {sandbox} was {what}d");
        }
    }
    assert!(!poisoned.is_empty(), "the fault made some leases unconfirmed");
    // 0 leaked sandboxes, but for creations whose reply was in flight at the
    // kill: the API has no idempotency key, so nobody can name those. Each
    // such creation is a row of the victim's without a lease id, and makes
    // at most one sandbox; every sandbox a row names was destroyed.
    let unnamed_in_flight = held.values().filter(|(lease, _)| lease.is_none()).count();
    let rows = observer.list().unwrap();
    let leaked: Vec<&str> =
        seen.sandboxes.iter().filter(|sandbox| !sandbox.deleted).map(|sandbox| sandbox.id.as_str()).collect();
    for sandbox in &leaked {
        let named = rows.iter().any(|row| row.provider_lease_id.as_deref() == Some(*sandbox));
        assert!(!named, "sandbox {sandbox} leaked although the ledger names it");
    }
    assert!(
        leaked.len() <= unnamed_in_flight,
        "sandboxes {leaked:?} leaked; the victim had only {unnamed_in_flight} creations in flight at the kill"
    );
}

/// `sandbox`'s requests, each with its time relative to `kill` (negative:
/// before it): what a failed assertion about that sandbox prints.
fn history_of(seen: &createos_sim::Ledger, sandbox: &str, kill: Instant) -> String {
    let prefix = format!("/v1/sandboxes/{sandbox}");
    seen.requests
        .iter()
        .filter(|request| request.path == prefix || request.path.starts_with(&format!("{prefix}/")))
        .map(|request| {
            let at = match request.received_at.checked_duration_since(kill) {
                Some(after) => after.as_secs_f64(),
                None => -kill.duration_since(request.received_at).as_secs_f64(),
            };
            format!("{at:+.3}s {} {} {}", request.method, &request.path[prefix.len()..], request.status)
        })
        .collect::<Vec<_>>()
        .join(", ")
}
