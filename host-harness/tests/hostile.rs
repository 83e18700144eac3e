//! Hostile and careless inputs, each through the built binary against a
//! simulator this test process owns: held leases that must still be
//! sweepable, refused calls that must change nothing, credentials that must
//! never reach the ledger, oversized keys, dying workers and what a sandbox
//! may see of the machine.

mod common;

use createos_sim::{FaultKind, FaultRule, FaultTrigger, SimConfig, Simulator};
use host_harness::ledger::{LeaseState, Ledger};
use serde_json::{json, Value};
use std::{
    path::{Path, PathBuf},
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
        let sim = Simulator::start(SimConfig { rate_limit: None, ..Default::default() })
            .expect("start the simulator");
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("config.json");
        let bed = Bed { sim, dir, config };
        bed.write_config(&bed.config, bed.provider_config());
        bed
    }

    fn provider_config(&self) -> Value {
        let mut provider = self.sim.provider_config(true);
        provider["requestsPerMinute"] = json!(100_000);
        provider
    }

    /// Writes a harness configuration holding `provider` to `path`.
    fn write_config(&self, path: &Path, provider: Value) {
        let file = json!({"companyId": "acme", "environmentId": "dev", "config": provider});
        std::fs::write(path, file.to_string()).unwrap();
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
    assert_eq!(bed.sim.live_sandboxes(), [id.clone()], "a plain sweep keeps a held lease");

    let swept = bed.harness(&["sweep", "--include-held", "--config", bed.config(), "--json"]);
    assert_eq!(swept.status.code(), Some(0), "{}", stderr(&swept));
    assert_eq!(stdout_json(&swept)["destroyed"], 1, "{}", String::from_utf8_lossy(&swept.stdout));
    assert!(bed.sim.live_sandboxes().is_empty(), "the paused sandbox was destroyed");
    let row = bed.ledger().find(&id, "acme", "dev").unwrap().unwrap();
    assert_eq!(row.state, LeaseState::Destroyed);
}
