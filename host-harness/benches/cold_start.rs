//! The cold start of a one-shot command and what the ledger's memory saves
//! of it: a lone `host-harness lifecycle` in a fresh process, cold (a new
//! ledger: no memory) and restored (the second run on the same ledger: the
//! poll schedule the first one learnt), against a warm process (this one:
//! the provider loaded, lifecycles run one after another), both in its
//! steady state and in its first `SEQUENCE` (3) lifecycles on an API, where
//! it knows what the fresh process of the same rank was handed. The APIs
//! are simulators in this process, independent of the processes measured,
//! new ones (new origins) each round, whose transitions (create, pause,
//! resume) last `TRANSITION_MS` (150).
//!
//! Per run: the lifecycle's own time (its steps' durations, as `--json`
//! prints them), the fresh process's wall time (start to exit: loading and
//! setup included), the API requests, and per phase how late its
//! transitions were detected (the first request after the simulator
//! finished one). Medians of `ROUNDS` (5) rounds; ratios to the warm
//! process's steady state and to its lifecycle of the same rank. `bash benches/cold-start.sh` builds and runs it
//! in release.

use createos_sim::{Ledger as SimLedger, SimConfig, Simulator};
use host_harness::lifecycle::{self, Reporter, StepReport};
use provider_abi::{LogLevel, LogSink, OutputStream, Provider, SetupParams};
use provider_host::{
    environment::Environment, host::Host, loader::LoadedProvider, store::sqlite::Ledger, store::Owner,
};
use serde_json::Value;
use std::{
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

/// One lifecycle's figures.
#[derive(Clone, Copy, Debug)]
struct Run {
    /// The steps' durations, summed.
    lifecycle: Duration,
    /// Process start to exit (fresh processes only).
    wall: Duration,
    /// API requests sent.
    requests: usize,
    /// Per phase ([`PHASES`]), the mean delay from a transition's end to the
    /// first request after it.
    detection: [Duration; 3],
}

/// Sums the steps' durations; the commands' output goes nowhere.
#[derive(Default)]
struct Steps(Duration);

impl Reporter for Steps {
    fn step(&mut self, report: &StepReport) {
        self.0 += report.duration;
    }

    fn output(&mut self, _stream: OutputStream, _chunk: &[u8]) {}
}

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|value| value.parse().ok()).unwrap_or(default)
}

/// The phases a lifecycle's transitions go through, in the table's order.
const PHASES: [&str; 3] = ["creating", "pausing", "resuming"];

/// The requests the simulator answered since `before`, and per phase of
/// [`PHASES`] the mean delay from a transition's end to the first request
/// naming its sandbox after it.
fn measured(sim: &Simulator, before: &SimLedger) -> (usize, [Duration; 3]) {
    let after = sim.ledger();
    let mut delays: [Vec<Duration>; 3] = Default::default();
    for (index, transition) in after.transitions.iter().enumerate().skip(before.transitions.len()) {
        let first_of_its_sandbox =
            !after.transitions[..index].iter().any(|other| other.sandbox_id == transition.sandbox_id);
        let phase = match transition.to.as_str() {
            "paused" => 1,
            _ if first_of_its_sandbox => 0,
            _ => 2,
        };
        let detected = after
            .requests
            .iter()
            .filter(|request| request.path.contains(&transition.sandbox_id))
            .filter(|request| request.received_at >= transition.completed_at)
            .map(|request| request.received_at - transition.completed_at)
            .min();
        delays[phase].extend(detected);
    }
    let mean = |values: &Vec<Duration>| values.iter().sum::<Duration>() / values.len().max(1) as u32;
    (after.requests.len() - before.requests.len(), [&delays[0], &delays[1], &delays[2]].map(mean))
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

/// A simulator whose transitions last `transition` (a new API origin each),
/// and a provider configuration for it.
fn simulator(transition: Duration) -> (Simulator, Value) {
    let sim = Simulator::start(SimConfig {
        rate_limit: None,
        create_delay: transition,
        pause_delay: transition,
        resume_delay: transition,
        ..Default::default()
    })
    .unwrap();
    // A request budget far above what the runs send: the provider paces
    // requests per process, and a warm process that has sent many would
    // otherwise be measured waiting for its budget, not for transitions.
    let mut config = sim.provider_config(true);
    config["requestsPerMinute"] = 100_000.into();
    (sim, config)
}

/// One lifecycle in this process (the warm one) against `sim`.
fn warm_lifecycle(provider: &LoadedProvider, ledger: &Ledger, sim: &Simulator, config: &Value) -> Run {
    let environment = Environment::new("bench", "bench", config.clone());
    let host = Host::new(provider, ledger, &environment, Owner::Lifecycle, "bench-warm");
    let before = sim.ledger();
    let mut steps = Steps::default();
    assert!(lifecycle::run(&host, &mut steps), "the warm lifecycle failed");
    let (requests, detection) = measured(sim, &before);
    Run { lifecycle: steps.0, wall: Duration::ZERO, requests, detection }
}

fn main() {
    let transition = Duration::from_millis(env_or("TRANSITION_MS", 150));
    let rounds = env_or("ROUNDS", 5) as usize;
    let library = e2e::library("createos_provider");
    let dir = tempfile::tempdir().unwrap();

    // The warm process: this one. Its steady state runs against an API of
    // its own, learnt over three lifecycles first.
    let provider = LoadedProvider::load(&library).unwrap();
    let setup = SetupParams { host_name: "bench".into(), host_version: "0".into() };
    provider.setup(&setup, LogSink::new(|_| {}), LogLevel::Warn).unwrap();
    let ledger = Ledger::open(&dir.path().join("warm.sqlite3")).unwrap();
    let (steady_sim, steady_config) = simulator(transition);
    for _ in 0..3 {
        warm_lifecycle(&provider, &ledger, &steady_sim, &steady_config);
    }

    // Each round against two new API origins: on one, `SEQUENCE` fresh
    // processes one after another on one ledger (the first cold, each next
    // restored from the ones before); on the other, the warm process's
    // first `SEQUENCE` lifecycles there (what it learnt, in memory), in
    // turn; and one more steady lifecycle.
    let sequence = env_or("SEQUENCE", 3).max(2) as usize;
    let mut fresh: Vec<Vec<Run>> = vec![Vec::new(); sequence];
    let mut warm: Vec<Vec<Run>> = vec![Vec::new(); sequence];
    let mut steady = Vec::new();
    for round in 0..rounds {
        let round_dir = dir.path().join(format!("round-{round}"));
        std::fs::create_dir_all(&round_dir).unwrap();
        let (sim, config) = simulator(transition);
        let file = round_dir.join("config.json");
        let harness_config =
            serde_json::json!({"companyId": "bench", "environmentId": "bench", "config": config});
        std::fs::write(&file, harness_config.to_string()).unwrap();
        let (warm_sim, warm_config) = simulator(transition);
        for index in 0..sequence {
            fresh[index].push(fresh_process(&sim, &library, &round_dir, &file));
            warm[index].push(warm_lifecycle(&provider, &ledger, &warm_sim, &warm_config));
        }
        steady.push(warm_lifecycle(&provider, &ledger, &steady_sim, &steady_config));
    }

    let base = median(&steady, |run| run.lifecycle).as_secs_f64();
    println!(
        "A lone lifecycle, {} transitions, median of {rounds} rounds (lifecycle = its steps; wall = process start to exit):",
        ms(transition)
    );
    println!(
        "| run | lifecycle | ratio to warm (steady) | ratio to the warm process's same lifecycle | wall | requests | detected after: {} |",
        PHASES.join(" / ")
    );
    println!("|---|---|---|---|---|---|---|");
    let row = |name: String, runs: &[Run], same: Option<&[Run]>| {
        let lifecycle = median(runs, |run| run.lifecycle);
        let wall = if runs[0].wall.is_zero() { "-".to_owned() } else { ms(median(runs, |run| run.wall)) };
        let same = same.map_or("-".to_owned(), |same| {
            format!("{:.2}x", lifecycle.as_secs_f64() / median(same, |run| run.lifecycle).as_secs_f64())
        });
        let mut requests: Vec<usize> = runs.iter().map(|run| run.requests).collect();
        requests.sort();
        println!(
            "| {name} | {} | {:.2}x | {same} | {wall} | {} | {} |",
            ms(lifecycle),
            lifecycle.as_secs_f64() / base,
            requests[requests.len() / 2],
            (0..PHASES.len())
                .map(|phase| ms(median(runs, |run| run.detection[phase])))
                .collect::<Vec<_>>()
                .join(" / "),
        );
    };
    row("warm process, steady".into(), &steady, None);
    for index in 0..sequence {
        let nth = index + 1;
        row(format!("warm process, lifecycle {nth} on an API"), &warm[index], None);
        let how = if index == 0 { "cold".to_owned() } else { format!("restored from {index} before") };
        row(format!("fresh process {nth} ({how})"), &fresh[index], Some(&warm[index]));
    }
}
