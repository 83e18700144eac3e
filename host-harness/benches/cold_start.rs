//! The cold start of a one-shot command and what the ledger's memory saves
//! of it: a lone `host-harness lifecycle` in a fresh process, cold (a new
//! ledger: no memory) and restored (the second run on the same ledger: the
//! poll schedule the first one learnt), against a warm process (this one:
//! the provider loaded, the same lifecycle run again and again). The API
//! is a simulator in this process, independent of the processes measured,
//! whose transitions (create, pause, resume) last `TRANSITION_MS` (150).
//!
//! Per run: the lifecycle's own time (its steps' durations, as `--json`
//! prints them), the fresh process's wall time (start to exit: loading and
//! setup included), the API requests, and how late each transition was
//! detected (its first request after the simulator finished it).
//! Medians of `ROUNDS` (5) rounds, each a cold, a restored and a warm run in
//! turn; ratios to the warm run. `bash benches/cold-start.sh` builds and
//! runs it in release.

use createos_sim::{Ledger as SimLedger, SimConfig, Simulator};
use host_harness::{
    environment::Environment,
    host::Host,
    ledger::{Ledger, Owner},
    lifecycle::{self, StepReport},
    loader::LoadedProvider,
};
use provider_abi::{LogLevel, LogSink, Provider, SetupParams};
use serde_json::Value;
use std::{
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

/// One lifecycle's figures.
#[derive(Clone, Copy, Default)]
struct Run {
    /// The steps' durations, summed.
    lifecycle: Duration,
    /// Process start to exit (fresh processes only).
    wall: Duration,
    /// API requests sent.
    requests: usize,
    /// Mean delay from a transition's end to its first request after it.
    detection: Duration,
}

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|value| value.parse().ok()).unwrap_or(default)
}

/// The transitions and requests the simulator recorded since `before`.
fn measured(sim: &Simulator, before: &SimLedger) -> (usize, Duration) {
    let after = sim.ledger();
    let transitions = &after.transitions[before.transitions.len()..];
    let delays: Vec<Duration> = transitions
        .iter()
        .filter_map(|transition| {
            after
                .requests
                .iter()
                .filter(|request| request.path.contains(&transition.sandbox_id))
                .filter(|request| request.received_at >= transition.completed_at)
                .map(|request| request.received_at - transition.completed_at)
                .min()
        })
        .collect();
    let mean = delays.iter().sum::<Duration>() / delays.len().max(1) as u32;
    (after.requests.len() - before.requests.len(), mean)
}

/// `host-harness lifecycle` in a fresh process on the ledger in `dir`.
fn fresh_process(sim: &Simulator, library: &Path, dir: &Path, config: &Path) -> Run {
    let before = sim.ledger();
    let started = Instant::now();
    let output = Command::new(env!("CARGO_BIN_EXE_host-harness"))
        .env("XDG_STATE_HOME", dir)
        .arg("--plugin")
        .arg(library)
        .arg("--ledger")
        .arg(dir.join("ledger.sqlite3"))
        .args(["--json", "lifecycle", "--config"])
        .arg(config)
        .output()
        .expect("run host-harness");
    let wall = started.elapsed();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let lifecycle = String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter_map(|step| step["durationMs"].as_f64())
        .map(|ms| Duration::from_secs_f64(ms / 1e3))
        .sum();
    let (requests, detection) = measured(sim, &before);
    Run { lifecycle, wall, requests, detection }
}

fn median(runs: &[Run], field: impl Fn(&Run) -> Duration) -> Duration {
    let mut values: Vec<Duration> = runs.iter().map(field).collect();
    values.sort();
    values[values.len() / 2]
}

fn ms(duration: Duration) -> String {
    format!("{:.0} ms", duration.as_secs_f64() * 1e3)
}

fn main() {
    let transition = Duration::from_millis(env_or("TRANSITION_MS", 150));
    let rounds = env_or("ROUNDS", 5) as usize;
    let sim = Simulator::start(SimConfig {
        rate_limit: None,
        create_delay: transition,
        pause_delay: transition,
        resume_delay: transition,
        ..Default::default()
    })
    .unwrap();
    let library = e2e::library("createos_provider");
    let dir = tempfile::tempdir().unwrap();
    let environment = Environment::new("bench", "bench", sim.provider_config(true));
    let config = dir.path().join("config.json");
    let file = serde_json::json!({"companyId": "bench", "environmentId": "bench", "config": sim.provider_config(true)});
    std::fs::write(&config, file.to_string()).unwrap();

    // The warm process: this one, its schedule learnt over three lifecycles.
    let provider = LoadedProvider::load(&library).unwrap();
    let setup = SetupParams { host_name: "bench".into(), host_version: "0".into() };
    provider.setup(&setup, LogSink::new(|_| {}), LogLevel::Warn).unwrap();
    let ledger = Ledger::open(&dir.path().join("warm.sqlite3")).unwrap();
    let host = Host::new(&provider, &ledger, &environment, Owner::Lifecycle, "bench-warm");
    let warm_run = || {
        let before = sim.ledger();
        let mut total = Duration::ZERO;
        let mut sum = |step: &StepReport| total += step.duration;
        assert!(lifecycle::run(&host, &mut sum), "the warm lifecycle failed");
        let (requests, detection) = measured(&sim, &before);
        Run { lifecycle: total, wall: Duration::ZERO, requests, detection }
    };
    for _ in 0..3 {
        warm_run();
    }

    let (mut cold, mut restored, mut warm) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        let ledger_dir = dir.path().join(format!("round-{round}"));
        std::fs::create_dir_all(&ledger_dir).unwrap();
        cold.push(fresh_process(&sim, &library, &ledger_dir, &config));
        restored.push(fresh_process(&sim, &library, &ledger_dir, &config));
        warm.push(warm_run());
    }

    let base = median(&warm, |run| run.lifecycle).as_secs_f64();
    println!(
        "A lone lifecycle, {} transitions, median of {rounds} rounds (lifecycle = its steps; wall = process start to exit):",
        ms(transition)
    );
    println!("| run | lifecycle | ratio to warm | wall | requests | detection delay (mean) |");
    println!("|---|---|---|---|---|---|");
    for (name, runs) in
        [("warm process", &warm), ("fresh process, restored", &restored), ("fresh process, cold", &cold)]
    {
        let lifecycle = median(runs, |run| run.lifecycle);
        let wall = if runs[0].wall.is_zero() { "-".to_owned() } else { ms(median(runs, |run| run.wall)) };
        let mut requests: Vec<usize> = runs.iter().map(|run| run.requests).collect();
        requests.sort();
        println!(
            "| {name} | {} | {:.2}x | {wall} | {} | {} |",
            ms(lifecycle),
            lifecycle.as_secs_f64() / base,
            requests[requests.len() / 2],
            ms(median(runs, |run| run.detection)),
        );
    }
}
