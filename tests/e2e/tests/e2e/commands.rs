//! Commands on a lease as the registry tracks them, through the loaded
//! provider against the simulator's real processes: several commands at
//! once on one lease, release and shutdown stopping all of them (their
//! process trees gone before the lease is paused or the hook returns), a
//! destroyed lease that comes back, and the script size limit at Linux's
//! own number.

use crate::support::{lease_id, Bed};
use e2e::machine::UNHURRIED_TIMEOUT_MS;
use provider_abi::{
    ByteSink, ByteSource, ErrorKind, ExecuteParams, ExecuteResult, HookResult, OutputStream, Provider,
};
use provider_host::wait;
use serde_json::{json, Value};
use std::sync::mpsc;
use std::thread::{Scope, ScopedJoinHandle};
use std::time::Duration;

/// A process tree: the command starts a background child, prints its PID
/// namespace, its own pid and the child's (both as its namespace numbers
/// them), and waits for the child.
const TREE: &str = "sleep 300 & echo \"$(readlink /proc/self/ns/pid) $$ $!\"; wait";

/// The pid in this process's namespace of the process numbered `inner` in
/// PID namespace `namespace` (`pid:[INODE]`): a simulator with
/// `pid_namespaces` runs each command in a namespace of its own, nested in
/// the test's; without, the namespace is the test's own.
fn host_pid(namespace: &str, inner: u32) -> Option<u32> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|entry| {
        let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
        let ns = std::fs::read_link(entry.path().join("ns/pid")).ok()?;
        if ns.to_str() != Some(namespace) {
            return None;
        }
        let status = std::fs::read_to_string(entry.path().join("status")).ok()?;
        let nspid = status.lines().find_map(|line| line.strip_prefix("NSpid:"))?;
        (nspid.split_whitespace().last()?.parse::<u32>().ok()? == inner).then_some(pid)
    })
}

/// Whether process `pid` is still running (a zombie has finished).
fn running(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let state = stat.rsplit_once(") ").and_then(|(_, rest)| rest.chars().next());
    !matches!(state, Some('Z' | 'X'))
}

/// What a started command reports: the pids of its tree, or the error it
/// ended with before it printed them.
type Started = Result<Vec<u32>, String>;

/// Runs `params`, sending the pids (in this process's namespace) of those
/// the command names on its first line, or its error if it ends first.
fn run_reporting_pids(
    bed: &Bed,
    params: &ExecuteParams,
    pids: mpsc::Sender<Started>,
) -> HookResult<ExecuteResult> {
    let failed = pids.clone();
    let mut first_line = String::new();
    let mut reported = false;
    let sink = ByteSink::new(move |stream: OutputStream, chunk: &[u8]| {
        if stream != OutputStream::Stdout || reported {
            return;
        }
        first_line.push_str(&String::from_utf8_lossy(chunk));
        if let Some((line, _)) = first_line.split_once('\n') {
            let (namespace, inner) = line.split_once(' ').expect("a namespace and pids");
            let parsed = inner
                .split(' ')
                .map(|pid| host_pid(namespace, pid.parse().expect("a pid")).expect("the process runs"))
                .collect();
            pids.send(Ok(parsed)).expect("the test is waiting for the pids");
            reported = true;
        }
    });
    let result = wait(bed.provider.execute(params.clone(), ByteSource::empty(), sink));
    if let Err(error) = &result {
        // Read only if the command never started; the test has moved on otherwise.
        let _ = failed.send(Err(format!("{error:?}")));
    }
    result
}

type Running<'scope> = Vec<ScopedJoinHandle<'scope, HookResult<ExecuteResult>>>;

/// Starts one [`TREE`] command per lease in `leases` (a lease may repeat)
/// and returns once every one of them runs, with the pids of their trees.
fn start_trees<'scope, 'env>(
    scope: &'scope Scope<'scope, 'env>,
    bed: &'env Bed,
    config: &'env Value,
    leases: &[&'env provider_abi::Lease],
) -> (Running<'scope>, Vec<u32>) {
    let (sender, receiver) = mpsc::channel();
    let commands = leases
        .iter()
        .map(|&lease| {
            let sender = sender.clone();
            let params = bed.command(config, lease, "/bin/sh", &["-c", TREE]);
            scope.spawn(move || run_reporting_pids(bed, &params, sender))
        })
        .collect();
    let pids: Vec<u32> = (0..leases.len())
        .flat_map(|_| {
            let started = receiver.recv_timeout(Duration::from_secs(300)).expect("every command started");
            started.unwrap_or_else(|error| panic!("a command failed before its tree ran: {error}"))
        })
        .collect();
    assert_eq!(pids.len(), 2 * leases.len());
    assert!(pids.iter().all(|pid| running(*pid)), "every tree runs: {pids:?}");
    (commands, pids)
}

/// Every command ended as cancelled.
fn assert_all_cancelled(commands: Running<'_>) {
    for command in commands {
        let error = command.join().expect("the command thread").unwrap_err();
        assert_eq!(
            (error.kind, error.message.as_str()),
            (ErrorKind::CANCELLED, "CreateOS command was cancelled.")
        );
    }
}

#[test]
fn release_stops_every_command_on_the_lease_and_their_trees_are_gone_before_the_pause() {
    for n in [2, 16] {
        let bed = Bed::new();
        let config = bed.config(json!({"reuseLease": true, "timeoutMs": UNHURRIED_TIMEOUT_MS}));
        let lease = bed.acquire(&config);
        std::thread::scope(|scope| {
            let (commands, pids) = start_trees(scope, &bed, &config, &vec![&lease; n]);
            // One more command on the lease finishes meanwhile: the others
            // stay registered.
            let (quick, _) = bed.execute(&bed.command(&config, &lease, "/bin/true", &[]));
            assert_eq!(quick.unwrap().exit_code.into_option(), Some(0));
            wait(bed.provider.release_lease(bed.lease_params(&config, &lease))).unwrap();
            let left: Vec<&u32> = pids.iter().filter(|pid| running(**pid)).collect();
            assert!(left.is_empty(), "{n} commands: processes {left:?} outlived the release");
            assert_all_cancelled(commands);
        });
        // The request log: every tree's termination was confirmed before the
        // pause was sent.
        let ledger = bed.ledger();
        let kills: Vec<usize> = (0..ledger.requests.len())
            .filter(|&i| {
                let request = &ledger.requests[i];
                request.method == "DELETE"
                    && createos_sim::path_matches("/v1/sandboxes/*/processes/*", &request.path)
            })
            .collect();
        assert_eq!(kills.len(), n, "one termination per running command");
        assert!(kills.iter().all(|&i| ledger.requests[i].status == 200));
        let pause = ledger
            .requests
            .iter()
            .position(|r| r.method == "POST" && createos_sim::path_matches("/v1/sandboxes/*/pause", &r.path))
            .expect("the lease was paused");
        assert!(kills.iter().all(|&kill| kill < pause), "{n} commands: a tree outlived the pause");
        assert_eq!(bed.status(&lease_id(&lease)), "paused");
    }
}

#[test]
fn shutdown_stops_the_commands_of_every_lease_and_returns_once_their_trees_are_gone() {
    let bed = Bed::new();
    let config = bed.config(json!({"timeoutMs": UNHURRIED_TIMEOUT_MS}));
    let (first, second) = (bed.acquire(&config), bed.acquire(&config));
    std::thread::scope(|scope| {
        let (commands, pids) = start_trees(scope, &bed, &config, &[&first, &first, &second]);
        bed.provider.shutdown().unwrap();
        // When shutdown returns, every termination was confirmed.
        let ledger = bed.ledger();
        let kills: Vec<u16> = ledger
            .requests
            .iter()
            .filter(|r| {
                r.method == "DELETE" && createos_sim::path_matches("/v1/sandboxes/*/processes/*", &r.path)
            })
            .map(|r| r.status)
            .collect();
        assert_eq!(kills, [200, 200, 200]);
        let left: Vec<&u32> = pids.iter().filter(|pid| running(**pid)).collect();
        assert!(left.is_empty(), "processes {left:?} outlived the shutdown");
        assert_all_cancelled(commands);
    });
}

#[test]
fn a_destroyed_lease_that_comes_back_is_expired_not_unconfirmed() {
    let bed = Bed::new();
    let config = bed.config(json!({"reuseLease": true}));
    let lease = bed.acquire(&config);
    let params = bed.lease_params(&config, &lease);
    // Process creation fails ambiguously: the lease becomes unconfirmed.
    bed.sim.add_fault(createos_sim::FaultRule::new(
        "POST /v1/sandboxes/*/processes",
        createos_sim::FaultTrigger::nth(1),
        createos_sim::FaultKind::Status(503),
    ));
    let error = bed.execute(&bed.command(&config, &lease, "/bin/true", &[])).0.unwrap_err();
    assert_eq!(error.kind, ErrorKind::CREATION_UNCONFIRMED);
    assert!(wait(bed.provider.inspect_lease(params.clone())).unwrap().unconfirmed);
    // The confirmed delete clears the flag for that lease.
    wait(bed.provider.destroy_lease(params.clone())).unwrap();
    let status = wait(bed.provider.inspect_lease(params.clone())).unwrap();
    assert!(!status.exists && !status.unconfirmed, "{status:?}");
    // The same lease record comes back (a host retrying from its ledger):
    // resume reports it expired instead of refusing it, and a release for
    // reuse finds nothing to pause instead of failing with the release rule's error.
    let resumed = wait(bed.provider.resume_lease(params.clone())).unwrap();
    assert!(resumed.expired && resumed.provider_lease_id.is_none());
    wait(bed.provider.release_lease(params.clone())).unwrap();
    assert_eq!(bed.ledger().count("POST", "/v1/sandboxes/*/pause"), 0);
}

/// Linux's `MAX_ARG_STRLEN`: the longest single `execve` argument, its NUL
/// included. The simulator runs `/bin/bash -lc SCRIPT` with a real `execve`.
const LINUX_MAX_ARG_STRLEN: usize = 131_072;

#[test]
fn the_longest_script_linux_takes_runs_and_one_byte_more_is_refused_before_any_request() {
    let bed = Bed::new();
    let config = bed.config(json!({}));
    let lease = bed.acquire(&config);
    // The script's shape without its argument (`createos-api.md`).
    let overhead = "cd -- '/paperclip-workspace' || exit\nexec env -- '/bin/echo' '' < '/dev/null'".len();
    for (script_len, fits) in [(LINUX_MAX_ARG_STRLEN - 1, true), (LINUX_MAX_ARG_STRLEN, false)] {
        let filler = "a".repeat(script_len - overhead);
        let before = bed.ledger().requests.len();
        let (result, _) = bed.execute(&bed.command(&config, &lease, "/bin/echo", &[&filler]));
        if fits {
            let result = result.unwrap();
            assert_eq!(result.exit_code.into_option(), Some(0), "{}", result.stderr);
            assert_eq!(result.stdout.len(), filler.len() + 1);
            let ledger = bed.ledger();
            let body: Value = serde_json::from_str(&ledger.processes.last().unwrap().request_body).unwrap();
            assert_eq!(body["args"][1].as_str().map(str::len), Some(script_len), "the script sent");
        } else {
            let error = result.unwrap_err();
            assert_eq!(error.kind, ErrorKind::INVALID_INPUT, "{error}");
            assert_eq!(bed.ledger().requests.len(), before, "no request for a script Linux refuses");
        }
    }
}
