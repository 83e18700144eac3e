//! `lifecycle` and `soak`: whole lease lifecycles. Both sweep the leases
//! earlier runs left behind first.

use super::{read_config, Failure, Session};
use host_harness::{
    embedded,
    lifecycle::{self, StepReport},
    render, resources,
    soak::{self, Finished, Summary},
};
use provider_abi::Provider;
use provider_host::isolation::is_worker_failure_message;
use provider_host::{
    budget,
    environment::Environment,
    host::Host,
    hosted::HostedProvider,
    pin_file::LockFile,
    store::Owner,
    store::Whose,
    sweep::{self, Outcome, Scope, SweepSecrets},
};
use std::{
    io::IsTerminal,
    path::{Path, PathBuf},
    sync::atomic::{AtomicUsize, Ordering},
    time::Instant,
};

/// The environment of a run: an external API, or a simulator embedded in
/// this process (kept alive by holding it).
pub struct Target {
    pub config: Environment,
    pub sim: Option<embedded::Simulator>,
}

impl Target {
    /// The configuration at `config`, else `provider`'s offline target:
    /// the embedded simulator applies CreateOS's rate limit when
    /// `rate_limited`, and its provider gets the request budget `budget`
    /// (requests a minute) when one is given.
    pub fn new(
        provider: &(impl Provider + ?Sized),
        config: Option<&Path>,
        rate_limited: bool,
        budget: Option<u32>,
    ) -> Result<Target, Failure> {
        let (sim, config) = match config {
            Some(path) => (None, read_config(path, provider)?),
            None => embedded::offline_target(provider, rate_limited, budget).map_err(Failure::Usage)?,
        };
        Ok(Target { config, sim })
    }

    /// Lends this run's secrets to the leases a swap hands to a new
    /// version, and sweeps the leases of earlier dead runs (their secrets:
    /// this run's, for the same account); held leases are left alone.
    fn sweep_orphans(&self, session: &Session) -> Result<(), Failure> {
        let secrets = SweepSecrets::from_config(&session.provider, &self.config);
        session.swapper.lend_secrets(secrets.clone());
        let swept = sweep::sweep(&session.provider, session.ledger.as_ref(), Scope::DeadRuns, &secrets)
            .map_err(Failure::usage)?;
        let destroyed = swept.iter().filter(|item| item.outcome == Outcome::Destroyed).count();
        if destroyed > 0 {
            tracing::warn!(destroyed, "swept leases earlier runs left behind");
        }
        Ok(())
    }
}

/// `lifecycle`: one whole lifecycle, each step printed.
pub fn lifecycle(session: &Session, config: Option<&Path>) -> Result<(), Failure> {
    let target = Target::new(&session.provider, config, true, None)?;
    if let Some(sim) = target.sim.as_ref().filter(|_| !session.out.json) {
        println!("{}", embedded::banner(sim));
    }
    target.sweep_orphans(session)?;
    let (provider, ledger) = (&session.provider, session.ledger.as_ref());
    let host = Host::new(provider, ledger, &target.config, Owner::Lifecycle, "harness-lifecycle");
    // The provider's remarks (an unknown key...) once, before the steps.
    if let Ok(report) = host.validate() {
        for warning in report.warnings.iter() {
            tracing::warn!("configuration: {warning}");
        }
    }
    let mut print = |step: &StepReport| {
        session.out.value(&step.to_json(), || {
            let outcome = match &step.error {
                None => "ok".to_owned(),
                Some(error) => format!("FAILED: {}", render::error_line(error)),
            };
            let lease = step.lease_id.as_deref().map(|id| format!(" lease {id}")).unwrap_or_default();
            let note = if step.note.is_empty() { String::new() } else { format!(" ({})", step.note) };
            format!("{:<14} {:>9.1} ms  {outcome}{lease}{note}", step.step, step.duration.as_secs_f64() * 1e3)
        })
    };
    super::passed(lifecycle::run(&host, &mut print))
}

/// `soak` options.
#[derive(clap::Args)]
pub struct SoakArgs {
    /// Number of lifecycles.
    #[arg(long, default_value_t = 20)]
    leases: usize,
    /// Lifecycles in flight at once.
    #[arg(long, default_value_t = 4)]
    concurrency: usize,
    /// Fault profile of the embedded simulator: none, flaky, hostile, or a JSON rules file.
    #[arg(long, default_value = "none", value_name = "PROFILE")]
    faults: String,
    /// Seed of the fault profile.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Turn the embedded simulator's rate limit (300 requests a minute) off.
    #[arg(long)]
    no_rate_limit: bool,
    /// The embedded simulator's provider's request budget in requests a
    /// minute (default: 100000 with --no-rate-limit, else the provider's);
    /// with --config, the configuration says it.
    #[arg(long, value_name = "N")]
    requests_per_minute: Option<u32>,
    /// Run against this API instead of the embedded simulator (no faults injected).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Swap the provider to this library every --swap-every lifecycles, then
    /// back to the one the run started with, and so on; given twice,
    /// alternate between the two. Each is checked (and pinned, with
    /// --locked) before the first lifecycle.
    #[arg(long, value_name = "PATH")]
    swap_to: Vec<PathBuf>,
    /// Completed lifecycles between two swaps (with --swap-to).
    #[arg(long, value_name = "N", default_value_t = 100, requires = "swap_to")]
    swap_every: usize,
}

/// `soak`: many lifecycles, a progress report, a summary; exit 1 when an
/// invariant broke.
/// `lock` pins the libraries of `--swap-to` (with `--locked`).
pub fn soak(session: &Session, options: &SoakArgs, lock: Option<&LockFile>) -> Result<(), Failure> {
    if options.leases == 0 || options.concurrency == 0 {
        return Err(Failure::Usage("--leases and --concurrency must be at least 1".into()));
    }
    if options.swap_to.len() > 2 || options.swap_every == 0 {
        return Err(Failure::Usage("--swap-to takes one or two libraries, --swap-every at least 1".into()));
    }
    let swap_set = session.provider.provider_set().filter(|_| !options.swap_to.is_empty());
    if swap_set.is_none() && !options.swap_to.is_empty() {
        return Err(Failure::Usage("--swap-to needs the provider in this process (drop --isolate)".into()));
    }
    // The libraries swapped to in turn: the two given, or the one given and
    // the library the run started with. Each is checked before the first
    // lifecycle.
    let mut swap_turns = options.swap_to.clone();
    if let Some(set) = swap_set {
        for library in &options.swap_to {
            let refused = |reason| Failure::Usage(format!("--swap-to {}: {reason}", library.display()));
            session.swapper.check(set, library, lock).map_err(refused)?;
        }
        if swap_turns.len() == 1 {
            swap_turns.push(set.active().path().to_path_buf());
        }
    }
    let faults = embedded::fault_profile(&options.faults, options.seed).map_err(Failure::Usage)?;
    let faults_injected = !faults.is_empty();
    if options.config.is_some() && faults_injected {
        return Err(Failure::Usage("--faults applies to the embedded simulator only (drop --config)".into()));
    }
    if options.config.is_some() && options.requests_per_minute.is_some() {
        return Err(Failure::Usage(
            "--requests-per-minute sets the embedded simulator's budget only: with --config, the provider's configuration says its budget".into(),
        ));
    }
    let budget =
        options.requests_per_minute.or(options.no_rate_limit.then_some(embedded::UNLIMITED_REQUEST_BUDGET));
    let target = Target::new(&session.provider, options.config.as_deref(), !options.no_rate_limit, budget)?;
    if target.sim.is_none() && options.requests_per_minute.is_some() {
        return Err(Failure::Usage(format!(
            "--requests-per-minute sets the embedded simulator's budget only, and provider `{}` runs without it: give its budget in its configuration (--config FILE)",
            session.provider.manifest().id
        )));
    }
    if let Some(sim) = &target.sim {
        sim.add_faults(faults);
    }
    target.sweep_orphans(session)?;

    let out = session.out;
    let bar = (!out.json && std::io::stdout().is_terminal()).then(|| {
        let style =
            indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} lifecycles, {msg} [{elapsed}]");
        indicatif::ProgressBar::new(options.leases as u64)
            .with_style(style.unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()))
    });
    let failures = AtomicUsize::new(0);
    let progress = |finished: &Finished| {
        if let Some(set) = swap_set.filter(|_| finished.done.is_multiple_of(options.swap_every)) {
            let turn = finished.done / options.swap_every - 1;
            let library = &swap_turns[turn % swap_turns.len()];
            session.swapper.swap("--swap-to", set, library, lock, session.ledger.as_ref());
        }
        if finished.first_error.is_some() {
            failures.fetch_add(1, Ordering::Relaxed);
        }
        match &bar {
            Some(bar) => {
                bar.set_message(format!("{} failed", failures.load(Ordering::Relaxed)));
                bar.inc(1);
            }
            None => out.value(
                &serde_json::json!({
                    "lifecycle": finished.done,
                    "ok": finished.first_error.is_none(),
                    "failedStep": finished.first_error.as_ref().map(|(step, _)| step),
                    "error": finished.first_error.as_ref().map(|(_, error)| render::error(error)),
                    "durationMs": finished.duration.as_secs_f64() * 1e3,
                }),
                || {
                    let outcome = finished.first_error.as_ref().map_or("ok".to_owned(), |(step, error)| {
                        format!("failed at {step}: {}", render::error_line(error))
                    });
                    format!(
                        "[{:>5}/{}] {outcome} ({:.1} s)",
                        finished.done,
                        options.leases,
                        finished.duration.as_secs_f64()
                    )
                },
            ),
        }
    };
    let started = Instant::now();
    let provider_threads = resources::provider_thread_prefix(&session.provider.manifest().id);
    let secrets = SweepSecrets::from_config(&session.provider, &target.config);
    // The provider's share of the request budget, with this host counted,
    // before its first request; then again every second, as hosts come and go.
    let first_share = budget::grant(&session.provider, session.ledger.as_ref());
    // Meanwhile, the leases of hosts that are gone (killed, or their
    // heartbeat expired) are taken over and destroyed, and the process's
    // resources sampled.
    let (stop_patrol, patrol_stopped) = std::sync::mpsc::channel::<()>();
    let (stop_granting, granting_stopped) = std::sync::mpsc::channel::<()>();
    let (stop_monitor, monitor_stopped) = std::sync::mpsc::channel::<()>();
    let (tally, patrolled, request_share, resources) = std::thread::scope(|scope| {
        let (provider, ledger, secrets) = (&session.provider, session.ledger.as_ref(), &secrets);
        let prefix = &provider_threads;
        let monitor = std::thread::Builder::new()
            .name("soak-monitor".into())
            .spawn_scoped(scope, move || resources::monitor(prefix, &monitor_stopped))
            .expect("failed to spawn thread");
        let patrol = scope.spawn(move || sweep::patrol(provider, ledger, secrets, &patrol_stopped));
        let granting =
            scope.spawn(move || budget::keep_granting(provider, ledger, first_share, &granting_stopped));
        let (leases, concurrency) = (options.leases, options.concurrency);
        let tally = soak::run(provider, ledger, &target.config, leases, concurrency, &progress);
        drop((stop_patrol, stop_granting, stop_monitor));
        let (patrolled, share) = (patrol.join().unwrap_or_default(), granting.join().unwrap_or_default());
        (tally, patrolled, share, monitor.join().unwrap_or_default())
    });
    let ledger_commits = session.ledger.commit_counts();
    if let Some(bar) = &bar {
        bar.finish_and_clear();
    }

    // The fault phase is over: the final sweep models the later clean-up run.
    if let Some(sim) = &target.sim {
        sim.clear_faults();
    }
    for _ in 0..3 {
        let swept = sweep::sweep(&session.provider, session.ledger.as_ref(), Scope::ThisProcess, &secrets)
            .map_err(Failure::usage)?;
        if !swept.iter().any(|item| matches!(item.outcome, Outcome::Failed(_))) {
            break;
        }
    }
    let left_behind = session.ledger.left_behind(Whose::ThisHost).map_err(Failure::usage)?;
    let cut_short_by_crash = left_behind
        .iter()
        .filter(|record| record.provider_lease_id.is_none())
        .filter(|record| {
            let message = record.last_error.as_ref().and_then(|error| error["message"].as_str());
            message.is_some_and(is_worker_failure_message)
        })
        .count();
    // A worker that crashed is a fault too: lifecycles it cut short are expected to fail.
    let worker_crashed =
        matches!(&session.provider, HostedProvider::Isolated(provider) if provider.crashes() > 0);
    let summary = Summary {
        leases: options.leases,
        elapsed: started.elapsed(),
        tally,
        sim: target.sim.as_ref().map(embedded::figures),
        unswept: left_behind.len(),
        taken_over: patrolled.iter().filter(|item| item.outcome == Outcome::Destroyed).count(),
        cut_short_by_crash,
        resources,
        concurrency: options.concurrency,
        faults_injected: faults_injected || worker_crashed,
        swaps: session.swapper.figures(),
        request_share,
        ledger_commits,
    };
    out.value(&summary.to_json(), || summary.to_text());
    super::passed(summary.broken().is_empty())
}
