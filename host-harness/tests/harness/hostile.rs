//! Hostile and careless inputs, each through the built binary against a
//! simulator this test process owns: held leases that must still be
//! sweepable, refused calls that must change nothing, credentials that must
//! never reach the ledger, oversized keys, dying workers and what a sandbox
//! may see of the machine.

use crate::common::{provider_config, write_config, ConfigDir};
use createos_sim::{FaultKind, FaultRule, FaultTrigger, SimConfig, Simulator};
use provider_host::{store::sqlite::Ledger, store::LeaseState, store::LeaseStore};
use serde_json::{json, Value};
use std::{
    path::PathBuf,
    process::{Command, Output, Stdio},
};

/// A simulator, a directory and a configuration file pointing at it.
struct Bed {
    sim: Simulator,
    dir: tempfile::TempDir,
    config: PathBuf,
}

impl Bed {
    fn new() -> Bed {
        Bed::with(SimConfig { rate_limit: None, ..Default::default() })
    }

    fn with(config: SimConfig) -> Bed {
        let sim = Simulator::start(config).expect("start the simulator");
        let ConfigDir { dir, config } = ConfigDir::new(&sim, |_| {});
        Bed { sim, dir, config }
    }

    fn ledger_path(&self) -> PathBuf {
        self.dir.path().join("ledger.sqlite3")
    }

    fn ledger(&self) -> Ledger {
        Ledger::open(&self.ledger_path()).unwrap()
    }

    fn config(&self) -> &str {
        self.config.to_str().unwrap()
    }

    /// Runs the harness with this bed's ledger.
    fn harness(&self, args: &[&str]) -> Output {
        self.command(args).output().expect("run host-harness")
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_host-harness"));
        command.arg("--ledger").arg(self.ledger_path()).args(args).stdin(Stdio::null());
        command
    }

    /// `acquire`: the lease as printed, written to `lease.json` too.
    fn acquire(&self) -> (Value, PathBuf) {
        let acquired = self.harness(&["acquire", "--config", self.config()]);
        assert_eq!(acquired.status.code(), Some(0), "{}", stderr(&acquired));
        let lease = stdout_json(&acquired);
        let path = self.dir.path().join("lease.json");
        std::fs::write(&path, lease.to_string()).unwrap();
        (lease, path)
    }
}

fn stdout_json(output: &Output) -> Value {
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout.lines().last().unwrap_or_else(|| panic!("no output; stderr: {}", stderr(output)));
    serde_json::from_str(line).unwrap_or_else(|_| panic!("not JSON: {line}"))
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// `sweep --include-held` destroys a lease the user released for reuse
/// (paused) as well as an active one.
#[test]
fn sweep_include_held_destroys_a_paused_held_lease() {
    let bed = Bed::new();
    let (lease, lease_path) = bed.acquire();
    let id = lease["providerLeaseId"].as_str().unwrap().to_owned();
    let released =
        bed.harness(&["release", "--config", bed.config(), "--lease", lease_path.to_str().unwrap()]);
    assert_eq!(released.status.code(), Some(0), "{}", stderr(&released));
    assert_eq!(stdout_json(&released)["expired"], false, "paused for reuse");
    let row = bed.ledger().find(&id, "acme", "dev").unwrap().unwrap();
    assert_eq!(row.state, LeaseState::Paused);

    let plain = bed.harness(&["sweep", "--config", bed.config()]);
    assert_eq!(plain.status.code(), Some(0), "{}", stderr(&plain));
    assert_eq!(bed.sim.live_sandboxes(), std::slice::from_ref(&id), "a plain sweep keeps a held lease");

    let swept = bed.harness(&["sweep", "--include-held", "--config", bed.config(), "--json"]);
    assert_eq!(swept.status.code(), Some(0), "{}", stderr(&swept));
    assert_eq!(stdout_json(&swept)["destroyed"], 1, "{}", String::from_utf8_lossy(&swept.stdout));
    assert!(bed.sim.live_sandboxes().is_empty(), "the paused sandbox was destroyed");
    let row = bed.ledger().find(&id, "acme", "dev").unwrap().unwrap();
    assert_eq!(row.state, LeaseState::Destroyed);
}

/// A call the provider refuses before any request (here: a lease file whose
/// metadata was tampered with) changes nothing in the ledger: a destroyed
/// row stays destroyed, and no later sweep sends a DELETE for it.
#[test]
fn a_refused_call_never_changes_a_rows_state() {
    let bed = Bed::new();
    let (lease, lease_path) = bed.acquire();
    let id = lease["providerLeaseId"].as_str().unwrap().to_owned();
    let lease_arg = lease_path.to_str().unwrap();
    let destroyed = bed.harness(&["destroy", "--config", bed.config(), "--lease", lease_arg]);
    assert_eq!(destroyed.status.code(), Some(0), "{}", stderr(&destroyed));
    let before = bed.ledger().find(&id, "acme", "dev").unwrap().unwrap();
    assert_eq!(before.state, LeaseState::Destroyed);

    let mut tampered = lease.clone();
    tampered["metadata"]["provider"] = json!("other");
    std::fs::write(&lease_path, tampered.to_string()).unwrap();
    let requests = bed.sim.ledger().requests.len();
    for command in ["destroy", "release", "resume"] {
        let refused = bed.harness(&[command, "--config", bed.config(), "--lease", lease_arg]);
        assert_eq!(refused.status.code(), Some(1), "{command}: {}", stderr(&refused));
        assert_eq!(stderr(&refused).lines().count(), 1, "{command}: one line: {}", stderr(&refused));
        let row = bed.ledger().get(before.id).unwrap().unwrap();
        assert_eq!(row.state, LeaseState::Destroyed, "{command} changed the row: {}", row.to_json());
        assert_eq!(row.last_hook, before.last_hook, "{command}");
    }
    assert_eq!(bed.sim.ledger().requests.len(), requests, "the refusals sent nothing");

    let swept = bed.harness(&["sweep", "--config", bed.config(), "--json"]);
    assert_eq!(swept.status.code(), Some(0), "{}", stderr(&swept));
    assert_eq!(stdout_json(&swept)["destroyed"], 0);
    assert_eq!(bed.sim.ledger().count("DELETE", &format!("/v1/sandboxes/{id}")), 1, "deleted once only");
}

/// A configuration refused because its `apiUrl` carries credentials leaves
/// no row (so `leases --json` never shows the URL), whichever command it is
/// given to.
#[test]
fn a_configuration_refused_for_credentials_in_its_api_url_leaves_no_row() {
    let bed = Bed::new();
    let (_, lease_path) = bed.acquire();
    let rows_before = bed.ledger().list().unwrap().len();
    let origin = bed.sim.url();
    let hostile_key = "hostile-secret-in-url";
    let with_user = origin.replacen("http://", &format!("http://user:{hostile_key}@"), 1);
    let with_query = format!("{origin}/?k={hostile_key}");
    for url in [with_user, with_query] {
        let mut provider = provider_config(&bed.sim);
        provider["apiUrl"] = json!(url);
        let path = bed.dir.path().join("hostile-config.json");
        write_config(&path, provider);
        let config = path.to_str().unwrap();
        let lease = lease_path.to_str().unwrap();
        for args in [
            vec!["acquire", "--config", config],
            vec!["probe", "--config", config],
            vec!["resume", "--config", config, "--lease", lease],
            vec!["release", "--config", config, "--lease", lease],
            vec!["destroy", "--config", config, "--lease", lease],
        ] {
            let refused = bed.harness(&args);
            assert_eq!(refused.status.code(), Some(1), "{url} {args:?}: {}", stderr(&refused));
            assert_eq!(stderr(&refused).lines().count(), 1, "{args:?}: one line: {}", stderr(&refused));
            assert!(!stderr(&refused).contains(hostile_key), "{args:?}: {}", stderr(&refused));
        }
        let leases = bed.harness(&["leases", "--json"]);
        assert_eq!(leases.status.code(), Some(0), "{}", stderr(&leases));
        let listed = String::from_utf8_lossy(&leases.stdout);
        assert!(!listed.contains(hostile_key), "{url}: the ledger shows it: {listed}");
        let rows = bed.ledger().list().unwrap();
        assert_eq!(rows.len(), rows_before, "{url}: a row was left");
        assert_eq!(rows[0].state, LeaseState::Active, "{url}: the held lease's row is unchanged");
    }
}

/// An API key far longer than any real one is refused by `validate` in one
/// line, and `acquire` with it is refused before any request, leaving no row.
#[test]
fn an_oversized_api_key_is_refused_before_any_request() {
    let bed = Bed::new();
    let mut provider = provider_config(&bed.sim);
    provider["apiKey"] = json!("k".repeat(900_000));
    let path = bed.dir.path().join("long-key.json");
    write_config(&path, provider);
    let config = path.to_str().unwrap();

    let validated = bed.harness(&["validate", "--config", config]);
    assert_eq!(validated.status.code(), Some(1), "{}", String::from_utf8_lossy(&validated.stdout));
    let said = format!("{}{}", String::from_utf8_lossy(&validated.stdout), stderr(&validated));
    assert!(said.contains("apiKey") && said.contains("4096"), "{said}");
    assert!(said.len() < 1000, "no echo of the key: {} bytes", said.len());

    let acquired = bed.harness(&["acquire", "--config", config]);
    assert_eq!(acquired.status.code(), Some(1), "{}", stderr(&acquired));
    assert_eq!(stderr(&acquired).lines().count(), 1, "{}", stderr(&acquired));
    assert!(bed.sim.ledger().requests.is_empty(), "nothing was sent");
    assert!(bed.ledger().list().unwrap().is_empty(), "no row was left");
}

/// A creation the server rejects before acting (4xx) creates nothing, and
/// the acquire leaves no row a sweep cannot resolve.
#[test]
fn a_creation_rejected_with_a_client_error_leaves_no_unresolved_row() {
    let bed = Bed::new();
    for status in [400, 401, 403, 422, 431] {
        let fault = bed.sim.add_fault(FaultRule::new(
            "POST /v1/sandboxes",
            FaultTrigger::from_nth(1),
            FaultKind::Status(status),
        ));
        let acquired = bed.harness(&["acquire", "--config", bed.config()]);
        bed.sim.remove_fault(fault);
        assert_eq!(acquired.status.code(), Some(1), "{status}: {}", stderr(&acquired));
        assert!(!stderr(&acquired).contains("creation_unconfirmed"), "{status}: {}", stderr(&acquired));
        assert!(bed.sim.live_sandboxes().is_empty(), "{status}");
        let unresolved: Vec<_> = bed
            .ledger()
            .list()
            .unwrap()
            .into_iter()
            .filter(|row| row.state != LeaseState::Destroyed)
            .map(|row| row.to_json())
            .collect();
        assert!(unresolved.is_empty(), "{status}: {unresolved:?}");
    }
    let swept = bed.harness(&["sweep", "--config", bed.config(), "--json"]);
    assert_eq!(swept.status.code(), Some(0), "{}", stderr(&swept));
    assert_eq!(stdout_json(&swept)["unresolvable"], 0);
}

/// The shared library cargo built for fixture crate `name`.
fn fixture(name: &str) -> PathBuf {
    let deps = std::env::current_exe().unwrap().parent().unwrap().to_path_buf();
    let path = deps.join(provider_host::loader::library_file_name(name));
    assert!(path.exists(), "{} was not built", path.display());
    path
}

/// `lifecycle --isolate` whose worker dies once the creation is done (the
/// sandbox created, prepared and recorded, its reply never sent) fails,
/// and leaves no sandbox running: the host destroys the sandbox the ledger
/// recorded, as the provider in the process would have.
#[test]
fn an_isolated_lifecycle_whose_worker_dies_after_creating_leaves_no_sandbox() {
    let bed = Bed::new();
    let output = bed
        .command(&["--isolate", "--plugin"])
        .arg(fixture("crashy_createos"))
        .args(["lifecycle", "--config", bed.config(), "--json"])
        .env("CRASHY_CRASH_AFTER", "acquire_lease")
        .output()
        .unwrap();
    let log = stderr(&output);
    assert_eq!(output.status.code(), Some(1), "{log}");
    assert!(log.contains("crashy: aborting in `acquire_lease`"), "{log}");
    assert!(log.contains("destroyed the sandbox whose creation the provider could not finish"), "{log}");
    let seen = bed.sim.ledger();
    assert_eq!(seen.sandboxes.len(), 2, "the probe's sandbox and the acquire's");
    assert!(bed.sim.live_sandboxes().is_empty(), "left running: {:?}; {log}", bed.sim.live_sandboxes());
    let rows = bed.ledger().list().unwrap();
    assert!(
        rows.iter().all(|row| row.state == LeaseState::Destroyed),
        "{:?}",
        rows.iter().map(|row| row.to_json()).collect::<Vec<_>>()
    );
    let swept = bed.harness(&["sweep", "--config", bed.config(), "--json"]);
    assert_eq!(stdout_json(&swept)["destroyed"], 0, "nothing left for a sweep");
}

/// A command in a sandbox sees its sandbox's processes only, as in a real
/// sandbox, when the simulator gives each command its own PID namespace
/// (and a `/proc` of it), never the host's process table.
#[test]
fn a_sandbox_sees_only_its_own_processes() {
    let bed = Bed::with(SimConfig { rate_limit: None, pid_namespaces: true, ..Default::default() });
    let (_, lease_path) = bed.acquire();
    let lease = lease_path.to_str().unwrap();
    // A host process the sandbox must not see.
    let mut host_process = Command::new("sleep").arg("600").spawn().unwrap();
    let listed = bed.harness(&[
        "exec",
        "--config",
        bed.config(),
        "--lease",
        lease,
        "--",
        "/bin/sh",
        "-c",
        "ls /proc; echo ps; ps -e -o pid=,comm=",
    ]);
    host_process.kill().unwrap();
    host_process.wait().unwrap();
    assert_eq!(listed.status.code(), Some(0), "{}", stderr(&listed));
    let stdout = String::from_utf8_lossy(&listed.stdout);
    let (proc_listing, ps) = stdout.split_once("ps\n").expect("both listings");
    let pids: Vec<u32> = proc_listing.split_whitespace().filter_map(|name| name.parse().ok()).collect();
    assert!(!pids.is_empty(), "a /proc of its own: {stdout}");
    assert!(!pids.contains(&host_process.id()), "the host's sleep is visible: {stdout}");
    assert!(!pids.contains(&std::process::id()), "the test process is visible: {stdout}");
    assert!(pids.len() <= 4, "only the sandbox's own processes: {stdout}");
    assert!(ps.lines().any(|line| line.trim_end().ends_with("ps")), "{ps}");
    assert!(!ps.contains("sleep"), "ps shows the host's sleep: {ps}");
}
