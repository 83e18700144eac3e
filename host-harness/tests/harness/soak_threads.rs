//! `soak`: every lifecycle is a future on one thread, so the harness's
//! threads stay bounded however many lifecycles are in flight. The
//! simulator runs as its own process (`host-harness sim`), so the harness's
//! figures are its own and the provider's.

use serde_json::{json, Value};
use std::{
    io::{BufRead, BufReader, Read},
    path::Path,
    process::{Child, ChildStdout, Command, Stdio},
};

/// The simulator in a process of its own, and its output after the first line.
struct Sim {
    child: Child,
    stdout: BufReader<ChildStdout>,
}

impl Sim {
    /// Starts it and writes a harness configuration for it to `config`.
    fn start(config: &Path) -> Sim {
        let mut child = Command::new(env!("CARGO_BIN_EXE_host-harness"))
            .args(["--json", "sim", "--no-rate-limit"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut first = String::new();
        stdout.read_line(&mut first).unwrap();
        let sim: Value = serde_json::from_str(&first).unwrap_or_else(|_| panic!("not JSON: {first}"));
        let harness_config = json!({"companyId": "acme", "environmentId": "dev", "config": {
            "apiUrl": sim["url"], "apiKey": sim["apiKey"], "shape": "s-1vcpu-1gb", "reuseLease": true,
            "requestsPerMinute": 100_000}});
        std::fs::write(config, harness_config.to_string()).unwrap();
        Sim { child, stdout }
    }

    /// Stops it (SIGTERM) and returns its last report: what was left live.
    fn stop(mut self) -> Value {
        // SAFETY: `kill` only sends a signal to our own child process.
        assert_eq!(unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) }, 0);
        let mut rest = String::new();
        self.stdout.read_to_string(&mut rest).unwrap();
        let last = rest.lines().last().unwrap_or_else(|| panic!("the simulator reported nothing"));
        serde_json::from_str(last).unwrap_or_else(|_| panic!("not JSON: {last}"))
    }
}

impl Drop for Sim {
    /// Also when a test fails before `stop`: no simulator outlives its test.
    fn drop(&mut self) {
        // SAFETY: as in `stop`; the child may have exited already.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
    }
}

/// Runs `in_flight` lifecycles, all at once; returns the summary.
fn soak(dir: &Path, in_flight: usize) -> Value {
    soak_of(dir, in_flight, in_flight)
}

/// Runs `leases` lifecycles, `in_flight` at a time; returns the summary.
fn soak_of(dir: &Path, leases: usize, in_flight: usize) -> Value {
    let output = Command::new(env!("CARGO_BIN_EXE_host-harness"))
        .arg("--json")
        .arg("--ledger")
        .arg(dir.join("ledger.sqlite3"))
        .args(["soak", "--leases", &leases.to_string(), "--concurrency", &in_flight.to_string()])
        .arg("--config")
        .arg(dir.join("config.json"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let summary: Value = serde_json::from_str(stdout.lines().last().expect("a summary")).unwrap();
    assert_eq!(output.status.code(), Some(0), "{summary}\n{}", String::from_utf8_lossy(&output.stderr));
    summary
}

#[test]
fn a_soak_holds_a_bounded_number_of_threads_however_many_lifecycles_are_in_flight() {
    const IN_FLIGHT: usize = 64;
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start(&dir.path().join("config.json"));
    let summary = soak(dir.path(), IN_FLIGHT);
    let left = sim.stop();

    assert_eq!(summary["succeeded"], IN_FLIGHT, "{summary}");
    assert_eq!(summary["invariantsHeld"], true, "{summary}");
    assert_eq!(summary["unswept"], 0, "{summary}");
    // The bound: at most 16 threads in the harness process, with
    // the provider's runtime, the ledger's heartbeat, the sweep patrol and
    // the resource monitor among them.
    let threads = summary["peakThreads"].as_u64().unwrap();
    assert!(threads <= 16, "{threads} threads for {IN_FLIGHT} lifecycles in flight: {summary}");
    assert_eq!(left["liveSandboxes"], 0, "{left}");
    assert_eq!(left["stopped"], true, "{left}");
}

/// Group commit: a hundred lifecycles in flight share the ledger's
/// transactions (how many commits they save depends on how the machine
/// schedules them: benches/group-commit.sh measures it); one lifecycle at a
/// time never waits for company: each of its writes commits alone, but for
/// a begin (queued, not awaited) that may share its commit with the write
/// after it.
#[test]
fn lifecycles_in_flight_share_the_ledgers_commits_and_a_lone_one_commits_each_write() {
    const IN_FLIGHT: u64 = 100;
    const ALONE: u64 = 2;
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::start(&dir.path().join("config.json"));
    let crowd = soak(dir.path(), IN_FLIGHT as usize);
    let alone = soak_of(dir.path(), ALONE as usize, 1);
    let left = sim.stop();

    let counts = |summary: &Value| {
        let ledger = &summary["ledger"];
        let commits = ledger["commits"].as_u64().unwrap_or_else(|| panic!("no ledger counts: {summary}"));
        (commits, ledger["writes"].as_u64().unwrap())
    };
    let (commits, writes) = counts(&crowd);
    assert!(writes >= 9 * IN_FLIGHT, "at least nine writes a lifecycle: {crowd}");
    // At least two writes a commit on average (a hundred lifecycles in
    // flight share far more on a quiet machine: benches/group-commit.sh).
    assert!(2 * commits <= writes, "{IN_FLIGHT} lifecycles in flight: {commits} commits: {crowd}");
    let (commits, writes) = counts(&alone);
    assert!(writes >= 9 * ALONE, "{alone}");
    // Two begins a lifecycle: its probe's row and its lease's.
    assert!(
        commits <= writes && commits + 2 * ALONE >= writes,
        "a lone lifecycle waited for company: {alone}"
    );
    assert_eq!(left["liveSandboxes"], 0, "{left}");
}
