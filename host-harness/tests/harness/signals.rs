//! Ctrl-C and SIGTERM are graceful the first time: running commands are
//! cancelled (their process trees terminated), leases in flight are cleaned
//! up by the normal policy, and the harness exits 130 / 143. A second signal
//! exits at once and leaves the rest to `sweep`. Real signals, sent to the
//! real binary, against a simulator this test process owns.

use crate::common::{signal, wait_until, ConfigDir};
use createos_sim::{SimConfig, Simulator};
use provider_host::{store::sqlite::Ledger, store::LeaseState, store::LeaseStore};
use serde_json::Value;
use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    time::Duration,
};

fn simulator(create_delay: Duration) -> Simulator {
    Simulator::start(SimConfig { rate_limit: None, create_delay, ..Default::default() }).unwrap()
}

struct Bed {
    dir: tempfile::TempDir,
    config: PathBuf,
}

impl Bed {
    fn new(sim: &Simulator) -> Bed {
        let ConfigDir { dir, config } = ConfigDir::new(sim, |_| {});
        Bed { dir, config }
    }

    fn ledger(&self) -> PathBuf {
        self.dir.path().join("ledger.sqlite3")
    }

    /// `host-harness SUBCOMMAND --config FILE REST...`.
    fn command(&self, args: &[&str]) -> Command {
        let (subcommand, rest) = args.split_first().unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_host-harness"));
        command
            .arg("--ledger")
            .arg(self.ledger())
            .arg(subcommand)
            .arg("--config")
            .arg(&self.config)
            .args(rest);
        command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        command
    }

    fn spawn(&self, args: &[&str]) -> Child {
        self.command(args).spawn().unwrap()
    }
}

/// Waits for the child to exit (60 s at most); returns its status and output.
fn finish(mut child: Child) -> (ExitStatus, String, String) {
    wait_until("the harness exits", Duration::from_secs(60), || child.try_wait().unwrap().is_some());
    let output = child.wait_with_output().unwrap();
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    (output.status, text(&output.stdout), text(&output.stderr))
}

fn posted_sandboxes(sim: &Simulator) -> usize {
    sim.ledger().count("POST", "/v1/sandboxes")
}

/// Acquires a lease into the bed's `lease.json`; returns the lease and its path.
fn acquire(bed: &Bed) -> (Value, PathBuf) {
    let acquired = bed.command(&["acquire"]).output().unwrap();
    assert!(acquired.status.success(), "{}", String::from_utf8_lossy(&acquired.stderr));
    let lease: Value = serde_json::from_slice(&acquired.stdout).unwrap();
    let lease_path = bed.dir.path().join("lease.json");
    std::fs::write(&lease_path, lease.to_string()).unwrap();
    (lease, lease_path)
}

/// The process trees the simulator confirmed gone (`DELETE .../processes/*`
/// answered 200: `tree_exited`).
fn terminated_trees(sim: &Simulator) -> usize {
    let ledger = sim.ledger();
    let deletes = ledger.requests.iter().filter(|request| request.method == "DELETE");
    deletes.filter(|request| request.path.contains("/processes/") && request.status == 200).count()
}

/// Sends `signal` to `exec -- sleep 300` once the command runs; the harness
/// must exit 128 + `signal`, with the command's tree terminated and the held
/// lease kept.
fn signal_during_exec(signal_number: i32, name: &str) {
    let sim = simulator(Duration::from_millis(50));
    let bed = Bed::new(&sim);
    let (lease, lease_path) = acquire(&bed);
    let child = bed.spawn(&["exec", "--lease", lease_path.to_str().unwrap(), "--", "/bin/sleep", "300"]);
    wait_until("the command runs", Duration::from_secs(60), || !sim.ledger().processes.is_empty());
    signal(&child, signal_number);
    let (status, _, stderr) = finish(child);
    assert_eq!(status.code(), Some(128 + signal_number), "{stderr}");
    assert!(stderr.contains(name), "{stderr}");
    assert_eq!(terminated_trees(&sim), 1, "its tree was terminated");
    let id = lease["providerLeaseId"].as_str().unwrap();
    assert!(sim.live_sandboxes().iter().any(|live| live == id), "a held lease stays held");
}

#[test]
fn sigint_during_exec_terminates_the_command_and_keeps_the_held_lease() {
    signal_during_exec(libc::SIGINT, "SIGINT");
}

#[test]
fn a_hang_up_during_exec_terminates_the_command_and_exits_129() {
    signal_during_exec(libc::SIGHUP, "SIGHUP");
}

#[test]
fn a_reader_closing_execs_output_terminates_the_command_and_exits_141() {
    let sim = simulator(Duration::from_millis(50));
    let bed = Bed::new(&sim);
    let (_, lease_path) = acquire(&bed);
    let mut child = bed.spawn(&[
        "exec",
        "--lease",
        lease_path.to_str().unwrap(),
        "--",
        "sh",
        "-c",
        "while echo y; do :; done",
    ]);
    let mut output = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    output.read_line(&mut line).unwrap();
    assert_eq!(line, "y\n");
    drop(output);
    let (status, _, stderr) = finish(child);
    assert_eq!(status.code(), Some(141), "a shell's code for a closed pipe: {stderr}");
    assert_eq!(terminated_trees(&sim), 1, "the command's tree was terminated: {stderr}");
}

#[test]
fn sigterm_during_lifecycle_destroys_the_lease_in_flight() {
    // Creation takes long enough for the signal to land during `acquire`.
    let sim = simulator(Duration::from_millis(1500));
    let bed = Bed::new(&sim);
    let child = bed.spawn(&["lifecycle", "--json"]);
    wait_until("the lifecycle acquires", Duration::from_secs(60), || posted_sandboxes(&sim) == 2); // probe, then acquire
    signal(&child, libc::SIGTERM);
    let (status, stdout, stderr) = finish(child);
    assert_eq!(status.code(), Some(143), "{stdout}{stderr}");
    let steps: Vec<Value> = stdout.lines().filter_map(|line| serde_json::from_str(line).ok()).collect();
    let cleanup = steps.iter().find(|step| step["step"] == "destroy").expect("a clean-up step");
    assert_eq!(cleanup["ok"], true, "{steps:?}");
    assert!(sim.live_sandboxes().is_empty(), "nothing left running");
    let rows = Ledger::open(Path::new(&bed.ledger())).unwrap().list().unwrap();
    assert!(rows.iter().all(|row| row.state == LeaseState::Destroyed), "{rows:?}");
}

#[test]
fn sigint_during_soak_stops_admitting_and_cleans_up_what_is_in_flight() {
    let sim = simulator(Duration::from_millis(300));
    let bed = Bed::new(&sim);
    let child = bed.spawn(&["soak", "--leases", "400", "--concurrency", "4", "--json"]);
    wait_until("lifecycles are in flight", Duration::from_secs(60), || posted_sandboxes(&sim) >= 8);
    signal(&child, libc::SIGINT);
    let (status, stdout, stderr) = finish(child);
    assert_eq!(status.code(), Some(130), "{stderr}");
    assert!(posted_sandboxes(&sim) < 400, "no new lifecycle was admitted");
    assert!(sim.live_sandboxes().is_empty(), "every lease in flight was cleaned up");
    assert!(stdout.lines().any(|line| line.contains("\"leases\"")), "the summary was printed: {stdout}");
}

#[test]
fn a_second_signal_exits_at_once_and_sweep_cleans_up() {
    let sim = simulator(Duration::from_secs(5));
    let bed = Bed::new(&sim);
    let mut child = bed.spawn(&["lifecycle"]);
    // The probe's sandbox is recorded the moment its creation reply arrives
    // (write-ahead): wait for that record, not only for the request, which a
    // loaded machine may take a while to answer and record.
    wait_until("the probe's sandbox is recorded", Duration::from_secs(60), || {
        Ledger::open_read_only(Path::new(&bed.ledger()))
            .ok()
            .flatten()
            .and_then(|ledger| ledger.list().ok())
            .is_some_and(|rows| rows.iter().any(|row| row.provider_lease_id.is_some()))
    });
    // Signals of one kind do not queue: send the second once the harness has
    // taken the first (it says so on stderr).
    let (lines, stderr_lines) = std::sync::mpsc::channel();
    let stderr = BufReader::new(child.stderr.take().unwrap());
    std::thread::spawn(move || stderr.lines().map_while(Result::ok).for_each(|line| drop(lines.send(line))));
    signal(&child, libc::SIGINT);
    let mut seen = String::new();
    while !seen.contains("stopping") {
        seen.push_str(
            &stderr_lines.recv_timeout(Duration::from_secs(60)).expect("the harness took the signal"),
        );
    }
    signal(&child, libc::SIGINT);
    let (status, _, _) = finish(child);
    let stderr: String = seen + &stderr_lines.iter().collect::<Vec<_>>().join("\n");
    assert_eq!(status.code(), Some(130), "{stderr}");
    assert!(stderr.contains("exiting at once"), "{stderr}");
    let swept = bed.command(&["sweep"]).output().unwrap();
    assert!(swept.status.success(), "{}", String::from_utf8_lossy(&swept.stderr));
    wait_until("the sandbox is gone", Duration::from_secs(60), || sim.live_sandboxes().is_empty());
}
