//! One request budget for the processes that share a ledger: each `soak`
//! grants its provider `1 / n` of its budget, `n` the running processes
//! registered on the ledger, itself counted from before its first request.

use serde_json::Value;
use std::{
    io::{BufRead, BufReader},
    path::Path,
    process::{Command, Output, Stdio},
};

/// `host-harness --ledger LEDGER soak --leases LEASES --concurrency 1
/// --no-rate-limit --json` against the embedded simulator.
fn soak(ledger: &Path, leases: &str) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_host-harness"));
    command
        .arg("--ledger")
        .arg(ledger)
        .args(["soak", "--leases", leases, "--concurrency", "1", "--no-rate-limit", "--json"])
        .stdin(Stdio::null());
    command
}

fn summary(output: &Output) -> Value {
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout.lines().last().unwrap_or_else(|| panic!("no output"));
    let summary: Value = serde_json::from_str(line).unwrap_or_else(|_| panic!("not JSON: {line}"));
    assert_eq!(output.status.code(), Some(0), "{summary}");
    summary
}

#[test]
fn a_lone_host_keeps_its_whole_budget_and_two_hosts_sharing_a_ledger_get_half_each() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("ledger.sqlite3");

    let alone = summary(&soak(&ledger, "2").output().unwrap());
    assert_eq!(alone["requestShare"]["firstPpm"], 1_000_000, "{alone}");
    assert_eq!(alone["requestShare"]["lowestPpm"], 1_000_000, "{alone}");

    // A long soak on the same ledger: once it reports its first lifecycle,
    // it is registered, and it stays alive until interrupted.
    let mut long = soak(&ledger, "1000000").stdout(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap();
    let mut lines = BufReader::new(long.stdout.take().unwrap()).lines();
    let first: Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    assert_eq!(first["lifecycle"], 1, "{first}");

    let shared = summary(&soak(&ledger, "2").output().unwrap());
    assert_eq!(shared["requestShare"]["firstPpm"], 500_000, "{shared}");
    assert_eq!(shared["requestShare"]["lowestPpm"], 500_000, "{shared}");

    // SAFETY: signalling a child this test spawned and has not yet reaped.
    assert_eq!(unsafe { libc::kill(long.id() as libc::pid_t, libc::SIGINT) }, 0);
    let rest: Vec<String> = lines.map(Result::unwrap).collect();
    long.wait().unwrap();
    let last: Value = serde_json::from_str(rest.last().expect("a summary")).unwrap();
    assert_eq!(last["requestShare"]["firstPpm"], 1_000_000, "{last}");

    // The long soak has exited: a host alone again has the whole budget.
    let again = summary(&soak(&ledger, "2").output().unwrap());
    assert_eq!(again["requestShare"]["firstPpm"], 1_000_000, "{again}");
}
