//! One request budget shared by the processes of one machine: HOSTS
//! `host-harness soak` processes on one SQLite ledger, against one simulator
//! with CreateOS's rate limit on (300 requests per minute per caller, a
//! sliding window), for SECONDS; then each is interrupted (no new
//! lifecycle; those in flight finish and are swept).
//!
//! Prints, from the simulator's own request log: the requests of each full
//! minute since the first request, the most in any 60 s window, the 429s,
//! and the settled minutes' (all but the first) average as a share of the
//! budget; then each host's summary line (failed lifecycles, leaks, the
//! request shares its provider was granted).
//!
//! Usage: `cargo bench -p host-harness --bench shared_budget --profile dev
//! [-- HOSTS SECONDS CONCURRENCY]` (defaults 4, 180, 6). Pacing is timed by
//! the clock, not by the CPU, so the debug build measures the same.

use createos_sim::{RateLimit, SimConfig, Simulator};
use serde_json::{json, Value};
use std::{
    io::{BufRead, BufReader},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

const BUDGET: usize = 300;
const MINUTE: Duration = Duration::from_secs(60);

fn arg(index: usize, default: u64) -> u64 {
    std::env::args()
        .filter(|arg| !arg.starts_with('-'))
        .nth(index)
        .and_then(|n| n.parse().ok())
        .unwrap_or(default)
}

/// The most of `times` (sorted) in any window of `width`.
fn max_in_any_window(times: &[Duration], width: Duration) -> usize {
    let mut start = 0;
    let mut best = 0;
    for (end, time) in times.iter().enumerate() {
        while *time - times[start] >= width {
            start += 1;
        }
        best = best.max(end + 1 - start);
    }
    best
}

fn main() {
    let (hosts, seconds, concurrency) = (arg(1, 4) as usize, arg(2, 180), arg(3, 6));
    let sim =
        Simulator::start(SimConfig { rate_limit: Some(RateLimit::createos_default()), ..Default::default() })
            .expect("start the simulator");
    let dir = tempfile::tempdir().unwrap();
    let mut provider = sim.provider_config(true);
    provider["requestsPerMinute"] = json!(BUDGET);
    let config = dir.path().join("config.json");
    std::fs::write(
        &config,
        json!({"companyId": "acme", "environmentId": "dev", "config": provider}).to_string(),
    )
    .unwrap();
    let ledger = dir.path().join("ledger.sqlite3");
    let started = Instant::now();
    let mut children: Vec<_> = (0..hosts)
        .map(|_| {
            Command::new(env!("CARGO_BIN_EXE_host-harness"))
                .arg("--ledger")
                .arg(&ledger)
                .args(["soak", "--leases", "1000000", "--concurrency", &concurrency.to_string(), "--json"])
                .arg("--config")
                .arg(&config)
                .env("RUST_LOG", "warn")
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .expect("run host-harness")
        })
        .collect();
    std::thread::sleep(Duration::from_secs(seconds).saturating_sub(started.elapsed()));
    for child in &children {
        // SAFETY: signalling a child this process spawned and has not reaped.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) };
    }
    let summaries: Vec<Value> = children
        .iter_mut()
        .map(|child| {
            let lines: Vec<String> =
                BufReader::new(child.stdout.take().unwrap()).lines().map_while(Result::ok).collect();
            child.wait().unwrap();
            lines.last().and_then(|line| serde_json::from_str(line).ok()).unwrap_or(Value::Null)
        })
        .collect();

    let log = sim.ledger().requests;
    let first = log.iter().map(|request| request.received_at).min().expect("requests were sent");
    let mut times: Vec<Duration> = log.iter().map(|request| request.received_at - first).collect();
    times.sort();
    let minutes = (seconds as usize * 1000 / 60_000).max(1);
    let per_minute: Vec<usize> = (0..minutes)
        .map(|minute| times.iter().filter(|t| t.as_secs() / MINUTE.as_secs() == minute as u64).count())
        .collect();
    let settled = &per_minute[1.min(per_minute.len() - 1)..];
    let settled_mean = settled.iter().sum::<usize>() as f64 / settled.len() as f64;
    let limited = log.iter().filter(|request| request.status == 429).count();
    println!(
        "{hosts} hosts on one SQLite ledger, one simulator at {BUDGET}/min (sliding window), {seconds} s"
    );
    println!("requests: {} in all; per full minute since the first: {per_minute:?}", times.len());
    println!("most in any 60 s window: {}", max_in_any_window(&times, MINUTE));
    println!("429 answers: {limited}");
    println!(
        "settled minutes (2 to {minutes}): {settled_mean:.1} requests/min, {:.1} % of the budget",
        settled_mean * 100.0 / BUDGET as f64
    );
    for (index, summary) in summaries.iter().enumerate() {
        println!(
            "host {}: {} lifecycles succeeded, failed {}, leaked {}, unswept {}, request share {}",
            index + 1,
            summary["succeeded"],
            summary["failed"],
            summary["leaked"],
            summary["unswept"],
            summary["requestShare"]
        );
    }
    println!("live sandboxes left: {}", sim.live_sandboxes().len());
}
