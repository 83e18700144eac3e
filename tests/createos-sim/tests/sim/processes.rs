use std::time::{Duration, Instant};

use serde_json::json;

use crate::common::*;

#[test]
fn exec_reports_output_and_status() {
    let _g = shared();
    let api = Api::start(fast_config());
    let id = api.create_running();
    let r = api.exec(&id, "echo out; echo err >&2; pwd; exit 7");
    assert_eq!(r["exit_code"], 7);
    assert_eq!(r["stdout"], "out\n/paperclip-workspace\n");
    assert_eq!(r["stderr"], "err\n");
    let r = api.exec(&id, "kill -KILL $$");
    assert_eq!(r["exit_code"], 137);
    // background leftovers of an exec are killed when it returns
    let r = api.exec(&id, "sleep 4242 & echo started");
    assert_eq!(r["stdout"], "started\n");
    assert!(wait_until(Duration::from_secs(5), || pids_with_cmdline("sleep 4242").is_empty()));
    let (s, _) = api.post(&format!("/sandboxes/{id}/exec"), json!({"cmd": "/no/such/binary", "args": []}));
    assert_eq!(s, 400);
}

#[test]
fn journal_replay_and_exit() {
    let _g = shared();
    let api = Api::start(fast_config());
    let id = api.create_running();
    let pid =
        api.spawn(&id, "for i in 1 2 3; do echo o$i; sleep 0.02; echo e$i >&2; sleep 0.02; done; exit 3");
    let (frames, clean) = read_frames(api.connect(&id, &pid, 0));
    assert!(clean);
    let data: Vec<_> = frames.iter().filter(|f| f["type"] == "data").collect();
    for (i, f) in data.iter().enumerate() {
        assert_eq!(f["seq"], i as u64 + 1);
    }
    assert_eq!(data_of(&frames, "stdout"), "o1\no2\no3\n");
    assert_eq!(data_of(&frames, "stderr"), "e1\ne2\ne3\n");
    let last = frames.last().unwrap();
    assert_eq!(last["type"], "exit");
    assert_eq!(last["exit_code"], 3);
    // replay from a cursor
    let n = data.len() as u64;
    let (again, _) = read_frames(api.connect(&id, &pid, 2));
    let seqs: Vec<u64> =
        again.iter().filter(|f| f["type"] == "data").map(|f| f["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, (3..=n).collect::<Vec<_>>());
    let (tail, _) = read_frames(api.connect(&id, &pid, n));
    assert_eq!(tail.len(), 1);
    assert_eq!(tail[0]["exit_code"], 3);
    // stdin close: once, then 409
    let path = format!("/sandboxes/{id}/processes/{pid}/stdin/close");
    assert_eq!(api.post(&path, json!({})).0, 200);
    assert_eq!(api.post(&path, json!({})).0, 409);
}

#[test]
fn heartbeat_while_idle_then_live_data() {
    let _g = shared();
    let api = Api::start(fast_config());
    let id = api.create_running();
    let pid = api.spawn(&id, "sleep 1.3; printf late");
    let (frames, _) = read_frames(api.connect(&id, &pid, 0));
    assert_eq!(frames[0]["type"], "heartbeat", "{frames:?}");
    assert_eq!(data_of(&frames, "stdout"), "late");
    assert_eq!(frames.last().unwrap()["exit_code"], 0);
}

#[test]
fn journal_eviction_answers_410() {
    let _g = shared();
    let mut cfg = fast_config();
    cfg.journal_bytes = 64;
    let api = Api::start(cfg);
    let id = api.create_running();
    let pid = api.spawn(&id, "for i in $(seq 1 20); do printf '%015d\\n' $i; sleep 0.01; done");
    // wait for the exit so the journal is final
    let (frames, _) = read_frames(api.connect(&id, &pid, 1_000));
    assert_eq!(frames.last().unwrap()["type"], "exit");
    let r = api.connect(&id, &pid, 0);
    assert_eq!(r.status().as_u16(), 410);
    // the last few frames are still there
    let first_kept = (1..=40u64).find(|n| api.connect(&id, &pid, *n).status().as_u16() == 200).unwrap();
    let (tail, _) = read_frames(api.connect(&id, &pid, first_kept));
    let bytes: usize = data_of(&tail, "stdout").len();
    assert!(bytes <= 64, "{bytes}");
    assert!(bytes > 0);
}

#[test]
fn a_paced_journal_holds_the_command_until_its_reader_took_the_output() {
    let _g = shared();
    let mut cfg = fast_config();
    cfg.journal_bytes = 64;
    cfg.pace_output = true;
    let api = Api::start(cfg);
    let id = api.create_running();
    // 8,893 bytes through 64: the command cannot finish before a reader
    // connects, however late that is.
    let pid = api.spawn(&id, "seq 1 2000");
    let (frames, _) = read_frames(api.connect(&id, &pid, 0));
    let expected: String = (1..=2000).map(|n| format!("{n}\n")).collect();
    assert_eq!(data_of(&frames, "stdout"), expected);
    assert_eq!(frames.last().unwrap()["exit_code"], 0, "{:?}", frames.last());
}

#[test]
fn delete_process_kills_tree_ignoring_sigterm() {
    let _g = shared();
    let api = Api::start(fast_config());
    let id = api.create_running();
    let pid = api.spawn(
        &id,
        "trap '' TERM; (trap '' TERM; exec -a sim-child-5151 sleep 600) & \
         (setsid sleep 5152 &) ; echo ready; wait",
    );
    // wait until the children are running
    assert!(wait_until(Duration::from_secs(5), || {
        !pids_with_cmdline("sim-child-5151").is_empty() && !pids_with_cmdline("sleep 5152").is_empty()
    }));
    let t = Instant::now();
    let (s, v) = api.delete(&format!("/sandboxes/{id}/processes/{pid}?grace_ms=300"));
    assert_eq!(s, 200);
    assert_eq!(v["data"]["tree_exited"], true, "{v}");
    assert!(t.elapsed() >= Duration::from_millis(300));
    assert!(pids_with_cmdline("sim-child-5151").is_empty());
    assert!(pids_with_cmdline("sleep 5152").is_empty(), "setsid escapee survived");
    let (frames, _) = read_frames(api.connect(&id, &pid, 0));
    assert_eq!(frames.last().unwrap()["signal"], "SIGKILL", "{frames:?}");
    // a second delete is a no-op that still confirms
    let (_, v) = api.delete(&format!("/sandboxes/{id}/processes/{pid}?grace_ms=0"));
    assert_eq!(v["data"]["tree_exited"], true);
}

#[test]
fn sigterm_exit_is_reported_and_pause_stops_processes() {
    let _g = shared();
    let api = Api::start(fast_config());
    let id = api.create_running();
    let pid = api.spawn(&id, "exec -a sim-pausable-6161 sleep 600");
    let found = || pids_with_cmdline("sim-pausable-6161");
    assert!(wait_until(Duration::from_secs(5), || found().len() == 1));
    let os_pid = found()[0];
    let state = || {
        let s = std::fs::read_to_string(format!("/proc/{os_pid}/stat")).unwrap();
        s[s.rfind(')').unwrap() + 2..].chars().next().unwrap()
    };
    assert_eq!(api.post(&format!("/sandboxes/{id}/pause"), json!({})).0, 200);
    api.wait_status(&id, "paused");
    // SIGSTOP takes effect when the kernel next schedules the process.
    assert!(wait_until(Duration::from_secs(5), || state() == 'T'), "{}", state());
    assert_eq!(api.post(&format!("/sandboxes/{id}/resume"), json!({})).0, 200);
    api.wait_status(&id, "running");
    // Continued: running or back asleep in `sleep`, no longer stopped.
    assert!(matches!(state(), 'R' | 'S'), "{}", state());
    let (_, v) = api.delete(&format!("/sandboxes/{id}/processes/{pid}?grace_ms=2000"));
    assert_eq!(v["data"]["tree_exited"], true);
    let (frames, _) = read_frames(api.connect(&id, &pid, 0));
    assert_eq!(frames.last().unwrap()["signal"], "SIGTERM");
}

#[test]
fn sandbox_delete_kills_processes() {
    let _g = shared();
    let api = Api::start(fast_config());
    let id = api.create_running();
    api.spawn(&id, "exec -a sim-orphan-7171 sleep 600");
    assert!(wait_until(Duration::from_secs(5), || pids_with_cmdline("sim-orphan-7171").len() == 1));
    assert_eq!(api.delete(&format!("/sandboxes/{id}")).0, 200);
    assert!(pids_with_cmdline("sim-orphan-7171").is_empty());
}

/// Commands one after another in one sandbox each run in a PID namespace of
/// their own (`$$` is 2: the namespace's init is 1) and exit 0. Prints the
/// wall time of one `/exec` of `true` (median and 90th percentile of 200,
/// after 20 warm-up), the figure in docs/benchmarks.md ("The simulator"):
/// `cargo test -p createos-sim --test sim spawn_cost -- --nocapture`.
#[test]
fn sequential_commands_each_get_a_pid_namespace_and_print_the_spawn_cost() {
    // Alone: neither slowed by the other tests' commands nor slowing them.
    let _g = exclusive();
    let api = Api::start(createos_sim::SimConfig { pid_namespaces: true, ..fast_config() });
    let id = api.create_running();
    for _ in 0..20 {
        api.exec(&id, "true");
    }
    let mut times: Vec<f64> = (0..200)
        .map(|_| {
            let started = Instant::now();
            let result = api.exec(&id, "echo $$");
            assert_eq!((result["exit_code"].as_i64(), result["stdout"].as_str()), (Some(0), Some("2\n")));
            started.elapsed().as_secs_f64() * 1000.0
        })
        .collect();
    times.sort_by(f64::total_cmp);
    eprintln!("spawn_cost: one /exec, median {:.2} ms, p90 {:.2} ms", times[100], times[180]);
}
