//! `soak`: many lifecycles at once under injected faults, and the invariants
//! that must hold anyway.
//!
//! Each lifecycle is [`crate::lifecycle::run_with`] (without the sync steps)
//! with a quiet [`Reporter`] that feeds a shared [`Tally`]. At the end: lifecycles succeeded and failed (by
//! the kind of their first error), latency percentiles per hook, API requests
//! and 429s and leaked sandboxes (when the simulator is embedded), and the
//! invariants: no sandbox leaked that the host could name, no unconfirmed
//! lease paused or resumed, the API key in no output, no panic.

use crate::{
    lifecycle::{self, Reporter, StepReport},
    resources::ResourceFigures,
    swap::SwapFigures,
};
use provider_abi::{ErrorKind, OutputStream, ProviderError};
use provider_host::hosted::HookSupport;
use provider_host::{
    environment::Environment, host::Host, secrets::SecretFields, store::LeaseStore, store::Owner,
};
use serde_json::{json, Value};
use std::{
    collections::BTreeMap,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Mutex, MutexGuard,
    },
    time::{Duration, Instant},
};

/// One finished lifecycle, for progress output.
#[derive(Debug, Clone)]
pub struct Finished {
    /// 1-based number of lifecycles finished so far.
    pub done: usize,
    /// The first error (its step and the error); `None` when every step
    /// succeeded.
    pub first_error: Option<(&'static str, ProviderError)>,
    /// How long the lifecycle took.
    pub duration: Duration,
}

/// Counts gathered while the lifecycles run.
#[derive(Debug, Default)]
pub struct Tally {
    /// Lifecycles where every step succeeded.
    pub succeeded: usize,
    /// Failed lifecycles by the kind of their first error.
    pub failed: BTreeMap<String, usize>,
    /// Hook latencies by step name.
    pub latencies: BTreeMap<&'static str, Vec<Duration>>,
    /// Resumes or pause-releases attempted on a lease known to be unconfirmed.
    pub unconfirmed_reused: usize,
    /// Texts (output, errors, metadata, ledger rows) containing the API key.
    pub secrets_seen: usize,
    /// Internal errors mentioning a panic.
    pub panics: usize,
    /// Provider log lines scanned for secrets.
    pub log_lines_scanned: usize,
}

/// The per-lifecycle reporter: checks every step and every output chunk,
/// counting into the soak's tally.
struct Watcher<'a> {
    ledger: &'a dyn LeaseStore,
    config: &'a Environment,
    secrets: &'a [&'a str],
    tally: &'a Mutex<Tally>,
    /// The first failed step and its error.
    first_error: Option<(&'static str, ProviderError)>,
    unconfirmed_known: bool,
}

impl Watcher<'_> {
    fn tally(&self) -> MutexGuard<'_, Tally> {
        self.tally.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn scan(&mut self, text: &str) {
        if self.secrets.iter().any(|secret| text.contains(secret)) {
            self.tally().secrets_seen += 1;
        }
    }

    /// Whether the ledger's latest row for the lease of `report` records it
    /// as unconfirmed.
    fn ledger_says_unconfirmed(&self, report: &StepReport) -> bool {
        let Some(id) = &report.lease_id else { return false };
        let found = self.ledger.find(id, &self.config.company_id, &self.config.environment_id);
        found
            .ok()
            .flatten()
            .is_some_and(|record| record.state == provider_host::store::LeaseState::Unconfirmed)
    }

    /// Counts this lifecycle's outcome (a lifecycle fails with its first
    /// error); returns its first error (its step and the error), if any.
    fn finish(self) -> Option<(&'static str, ProviderError)> {
        let mut tally = self.tally();
        match &self.first_error {
            None => tally.succeeded += 1,
            Some((_, error)) => *tally.failed.entry(error.kind.to_string()).or_default() += 1,
        }
        drop(tally);
        self.first_error
    }
}

impl Reporter for Watcher<'_> {
    fn step(&mut self, report: &StepReport) {
        self.scan(&report.to_json().to_string());
        let reuse = matches!(report.step, "resume" | "execute-again")
            || (report.step == "release" && report.note.is_empty());
        if reuse && self.unconfirmed_known {
            self.tally().unconfirmed_reused += 1;
        }
        let unconfirmed =
            report.error.as_ref().is_some_and(|error| error.kind == ErrorKind::CLEANUP_UNCONFIRMED);
        if unconfirmed || (report.error.is_some() && self.ledger_says_unconfirmed(report)) {
            self.unconfirmed_known = true;
        }
        // Kept as counts, not reports: a lifecycle in flight holds little.
        if report.duration > Duration::ZERO {
            self.tally().latencies.entry(report.step).or_default().push(report.duration);
        }
        if let Some(error) = &report.error {
            if error.kind == ErrorKind::INTERNAL && error.message.to_lowercase().contains("panic") {
                self.tally().panics += 1;
            }
            self.first_error.get_or_insert_with(|| (report.step, error.clone()));
        }
    }

    fn output(&mut self, _stream: OutputStream, chunk: &[u8]) {
        self.scan(&String::from_utf8_lossy(chunk));
    }
}

/// Runs `leases` lifecycles in `config`, `concurrency` at a time;
/// `progress` is called after each. They all run on this thread, each
/// lifecycle a future awaiting the provider's hooks.
pub fn run(
    provider: &dyn HookSupport,
    ledger: &dyn LeaseStore,
    config: &Environment,
    leases: usize,
    concurrency: usize,
    progress: &(dyn Fn(&Finished) + Sync),
) -> Tally {
    let tally = Arc::new(Mutex::new(Tally::default()));
    let done = AtomicUsize::new(0);
    // The configuration's secrets, by the provider's own schema.
    let secrets = SecretFields::of(&provider.manifest()).values(&config.config);
    // The provider's log lines are output too.
    let owned: Vec<String> = secrets.iter().map(|secret| (*secret).to_owned()).collect();
    let logged = Arc::clone(&tally);
    crate::provider_log::observe(Some(Box::new(move |line: &str| {
        let mut tally = logged.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        tally.log_lines_scanned += 1;
        tally.secrets_seen += usize::from(owned.iter().any(|secret| line.contains(secret.as_str())));
    })));
    // Taken off again however this function ends (a panic unwinding too).
    let observing = scopeguard::guard((), |()| crate::provider_log::observe(None));
    // One lifecycle, tallied and reported.
    let lifecycle = |index: usize| {
        let (tally, done, secrets) = (&tally, &done, &secrets);
        async move {
            let run_id = format!("soak-{index}");
            let host = Host::new(provider, ledger, config, Owner::Lifecycle, &run_id);
            let mut watcher =
                Watcher { ledger, config, secrets, tally, first_error: None, unconfirmed_known: false };
            let started = Instant::now();
            lifecycle::run_with(&host, &mut watcher, false).await;
            let duration = started.elapsed();
            let first_error = watcher.finish();
            progress(&Finished { done: done.fetch_add(1, Ordering::SeqCst) + 1, first_error, duration });
        }
    };
    let in_flight = concurrency.clamp(1, leases.max(1));
    use futures_util::StreamExt;
    // The lifecycles are futures polled on this thread alone, woken by the
    // provider's runtime; no async runtime of the host's is entered, so
    // blocking code the host calls meanwhile (the PostgreSQL driver runs its
    // own) stays usable.
    provider_host::wait(
        futures_util::stream::iter(0..leases)
            // No new lifecycle after an interruption.
            .take_while(|_| std::future::ready(crate::interrupt::requested().is_none()))
            .for_each_concurrent(in_flight, lifecycle),
    );
    drop(observing);
    let mut tally = std::mem::take(&mut *tally.lock().unwrap_or_else(|poisoned| poisoned.into_inner()));
    // The ledger is output too: no row may hold the key.
    for record in ledger.list().unwrap_or_default() {
        let row = record.to_json().to_string();
        tally.secrets_seen += secrets.iter().filter(|secret| row.contains(*secret)).count();
    }
    tally
}

/// What the embedded simulator saw, after the final sweep.
#[derive(Debug, Clone, Default)]
pub struct SimFigures {
    /// Requests answered.
    pub requests: usize,
    /// Requests answered 429.
    pub rate_limited: usize,
    /// Live sandboxes whose creation reply reached the provider intact: a
    /// leak of the provider or the host.
    pub leaked: Vec<String>,
    /// Live sandboxes whose creation reply a fault lost or falsified: nobody
    /// can name them, since the API has no idempotency key.
    pub leaked_unnameable: Vec<String>,
}

/// The final summary.
#[derive(Debug)]
pub struct Summary {
    /// Lifecycles run.
    pub leases: usize,
    /// Wall-clock time.
    pub elapsed: Duration,
    /// Counts from the lifecycles.
    pub tally: Tally,
    /// The simulator's figures, when it was embedded.
    pub sim: Option<SimFigures>,
    /// Rows the final sweep could not resolve (no lease id) or destroy.
    pub unswept: usize,
    /// Leases of gone hosts (killed, or their heartbeat expired) this run
    /// took over and destroyed meanwhile.
    pub taken_over: usize,
    /// Of those, creations a provider worker's crash cut short before the
    /// creation reply was recorded (`--isolate`; each creation runs in a
    /// worker of its own, so only a crash inside the creating hook itself):
    /// the API has no idempotency key, so their sandboxes, if the request got
    /// through, cannot be named, as after a `SIGKILL` of an in-process host.
    /// At most this many leaked sandboxes are accounted for.
    pub cut_short_by_crash: usize,
    /// Memory, threads and CPU of this process during the lifecycles.
    pub resources: ResourceFigures,
    /// Lifecycles in flight at once.
    pub concurrency: usize,
    /// True when a fault profile injected failures (else any failed
    /// lifecycle fails the soak).
    pub faults_injected: bool,
    /// What the swaps of the provider during the soak did.
    pub swaps: SwapFigures,
    /// The shares of the request budget granted to the provider (`None`:
    /// it lacks `grant_request_share` and keeps its whole budget).
    pub request_share: Option<provider_host::budget::Granted>,
    /// The ledger's transactions and the writes they held while the
    /// lifecycles ran, for a store that counts them (SQLite's group commit).
    pub ledger_commits: Option<provider_host::store::CommitCounts>,
}

/// The `p`-th percentile (0..=100) of `values` (nearest rank).
pub fn percentile(values: &[Duration], p: f64) -> Duration {
    if values.is_empty() {
        return Duration::ZERO;
    }
    let mut sorted = values.to_vec();
    sorted.sort();
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

impl Summary {
    /// The broken invariants, empty when all held.
    pub fn broken(&self) -> Vec<String> {
        let tally = &self.tally;
        let leaked =
            self.sim.as_ref().map_or(0, |sim| sim.leaked.len().saturating_sub(self.cut_short_by_crash));
        let counted = [
            (leaked, format!("{leaked} sandboxes leaked")),
            (tally.unconfirmed_reused, format!("{} unconfirmed leases reused", tally.unconfirmed_reused)),
            (
                tally.secrets_seen,
                format!("a secret of the configuration appeared {} times in output", tally.secrets_seen),
            ),
            (tally.panics, format!("{} panics", tally.panics)),
        ];
        let mut broken: Vec<String> =
            counted.into_iter().filter(|(count, _)| *count > 0).map(|(_, problem)| problem).collect();
        let failed: usize = tally.failed.values().sum();
        if tally.succeeded == 0 && self.leases > 0 {
            broken.push("no lifecycle succeeded".to_owned());
        } else if failed > 0 && !self.faults_injected {
            broken.push(format!("{failed} lifecycles failed without a fault profile"));
        }
        broken
    }

    fn millis(duration: Duration) -> f64 {
        (duration.as_secs_f64() * 1e4).round() / 10.0
    }

    /// Each step's calls, and its p50 and p99 latency in milliseconds.
    fn latencies(&self) -> impl Iterator<Item = (&'static str, usize, f64, f64)> + '_ {
        self.tally.latencies.iter().map(|(step, values)| {
            (
                *step,
                values.len(),
                Self::millis(percentile(values, 50.0)),
                Self::millis(percentile(values, 99.0)),
            )
        })
    }

    /// The summary as JSON.
    pub fn to_json(&self) -> Value {
        let latency: BTreeMap<_, _> = self
            .latencies()
            .map(|(step, count, p50, p99)| (step, json!({"count": count, "p50Ms": p50, "p99Ms": p99})))
            .collect();
        json!({
            "summary": true,
            "leases": self.leases,
            "elapsedS": self.elapsed.as_secs_f64(),
            "succeeded": self.tally.succeeded,
            "failed": self.tally.failed,
            "apiRequests": self.sim.as_ref().map(|sim| sim.requests),
            "rateLimited": self.sim.as_ref().map(|sim| sim.rate_limited),
            "latency": latency,
            "leaked": self.sim.as_ref().map(|sim| sim.leaked.len()),
            "leakedIds": self.sim.as_ref().map(|sim| sim.leaked.clone()),
            "leakedUnnameable": self.sim.as_ref().map(|sim| sim.leaked_unnameable.len()),
            "unswept": self.unswept,
            "takenOver": self.taken_over,
            "cutShortByCrash": self.cut_short_by_crash,
            "unconfirmedReused": self.tally.unconfirmed_reused,
            "secretsSeen": self.tally.secrets_seen,
            "logLinesScanned": self.tally.log_lines_scanned,
            "panics": self.tally.panics,
            "lifecyclesPerS": self.lifecycles_per_second(),
            "peakRssBytes": self.resources.peak_rss,
            "rssPerInFlightLifecycleBytes": self.rss_per_in_flight(),
            "peakThreads": self.resources.peak_threads,
            "peakProviderThreads": self.resources.peak_provider_threads,
            "cpuPerLifecycleMs": self.cpu_per_lifecycle_ms(),
            "monitorCpuMs": Self::millis(self.resources.monitor_cpu),
            "swaps": self.swaps.done,
            "swapsRefused": self.swaps.refused,
            "drainedPerSwap": self.swaps.drained,
            "longestSwapWaitMs": self.swaps.longest_wait.as_secs_f64() * 1e3,
            "requestShare": self.request_share.map(|share| json!({
                "firstPpm": share.first,
                "lowestPpm": share.lowest,
                "lastPpm": share.last,
            })),
            "ledger": self.ledger_commits.map(|counts| json!({
                "commits": counts.commits,
                "writes": counts.writes,
            })),
            "invariantsHeld": self.broken().is_empty(),
            "broken": self.broken(),
        })
    }

    /// Lifecycles finished per second of wall-clock time.
    pub fn lifecycles_per_second(&self) -> f64 {
        self.leases as f64 / self.elapsed.as_secs_f64().max(f64::EPSILON)
    }

    /// Resident memory above the starting point at the peak, per lifecycle
    /// in flight.
    pub fn rss_per_in_flight(&self) -> u64 {
        let in_flight = self.concurrency.clamp(1, self.leases.max(1)) as u64;
        self.resources.peak_rss.saturating_sub(self.resources.baseline_rss) / in_flight
    }

    /// CPU time of the process (harness, provider and any embedded
    /// simulator; not the resource monitor's sampling) per lifecycle.
    pub fn cpu_per_lifecycle_ms(&self) -> f64 {
        Self::millis(self.resources.cpu) / self.leases.max(1) as f64
    }

    /// The summary as text.
    pub fn to_text(&self) -> String {
        let tally = &self.tally;
        let mut lines = vec![format!(
            "{} lifecycles in {:.1} s: {} succeeded, {} failed",
            self.leases,
            self.elapsed.as_secs_f64(),
            tally.succeeded,
            tally.failed.values().sum::<usize>()
        )];
        for (kind, count) in &tally.failed {
            lines.push(format!("  failed with {kind:<22} {count}"));
        }
        let na = |value: Option<usize>| value.map_or("n/a (external API)".to_owned(), |n| n.to_string());
        lines.push(format!("API requests: {}", na(self.sim.as_ref().map(|sim| sim.requests))));
        lines.push(format!("429 answers:  {}", na(self.sim.as_ref().map(|sim| sim.rate_limited))));
        lines.push("latency per hook (p50 / p99):".into());
        for (step, count, p50, p99) in self.latencies() {
            lines.push(format!("  {step:<14} {p50:>9.1} ms / {p99:>9.1} ms  ({count} calls)"));
        }
        match &self.sim {
            Some(sim) => lines.push(format!(
                "sandboxes leaked: {} (and {} whose creation reply a fault lost: no idempotency key, nobody can name them)",
                sim.leaked.len(),
                sim.leaked_unnameable.len(),
            )),
            None => lines.push("sandboxes leaked: n/a (external API; see `leases`)".into()),
        }
        lines.push(format!(
            "throughput: {:.1} lifecycles/s; CPU {:.1} ms per lifecycle",
            self.lifecycles_per_second(),
            self.cpu_per_lifecycle_ms()
        ));
        lines.push(format!(
            "memory: peak {:.1} MiB resident, {:.1} KiB per lifecycle in flight; threads: peak {} ({} the provider's)",
            self.resources.peak_rss as f64 / 1048576.0,
            self.rss_per_in_flight() as f64 / 1024.0,
            self.resources.peak_threads,
            self.resources.peak_provider_threads,
        ));
        if let Some(counts) = self.ledger_commits {
            lines.push(format!(
                "ledger: {} writes in {} transactions ({:.2} commits per lifecycle)",
                counts.writes,
                counts.commits,
                counts.commits as f64 / self.leases.max(1) as f64
            ));
        }
        lines.push(format!("ledger rows the final sweep left: {}", self.unswept));
        if self.taken_over > 0 {
            lines.push(format!("leases of gone hosts taken over and destroyed: {}", self.taken_over));
        }
        if self.cut_short_by_crash > 0 {
            lines.push(format!(
                "  of them, creations a worker crash cut short before their reply was recorded: {}",
                self.cut_short_by_crash
            ));
        }
        if self.swaps.done + self.swaps.refused > 0 {
            lines.push(format!(
                "swaps: {} done, {} refused; calls drained per swap: {:?}; longest wait of a new call: {:.1} µs",
                self.swaps.done,
                self.swaps.refused,
                self.swaps.drained,
                self.swaps.longest_wait.as_secs_f64() * 1e6
            ));
        }
        if let Some(share) = self.request_share {
            lines.push(format!(
                "request share (ppm of the provider's budget): first {}, lowest {}, last {}",
                share.first, share.lowest, share.last
            ));
        }
        lines.push(format!("unconfirmed leases reused: {}", tally.unconfirmed_reused));
        lines.push(format!(
            "secrets seen in output, the ledger and {} provider log lines: {}",
            tally.log_lines_scanned, tally.secrets_seen
        ));
        lines.push(format!("panics: {}", tally.panics));
        let broken = self.broken();
        lines.push(if broken.is_empty() {
            "invariants: all held".into()
        } else {
            format!("invariants BROKEN: {}", broken.join("; "))
        });
        lines.join("\n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_the_nearest_rank() {
        let values: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile(&values, 50.0), Duration::from_millis(50));
        assert_eq!(percentile(&values, 99.0), Duration::from_millis(99));
        assert_eq!(percentile(&[Duration::from_millis(7)], 99.0), Duration::from_millis(7));
        assert_eq!(percentile(&[], 50.0), Duration::ZERO);
    }

    #[test]
    fn failed_lifecycles_break_the_soak_unless_faults_were_injected() {
        let summary = |succeeded: usize, failed: usize, faults_injected: bool| {
            let mut tally = Tally { succeeded, ..Default::default() };
            if failed > 0 {
                tally.failed.insert("api".into(), failed);
            }
            let summary = Summary {
                leases: succeeded + failed,
                elapsed: Duration::from_secs(1),
                tally,
                sim: None,
                unswept: 0,
                taken_over: 0,
                resources: Default::default(),
                concurrency: 1,
                faults_injected,
                cut_short_by_crash: 0,
                swaps: Default::default(),
                request_share: None,
                ledger_commits: None,
            };
            summary.broken()
        };
        assert!(summary(10, 0, false).is_empty());
        assert!(summary(9, 1, true).is_empty(), "faults make some failures expected");
        assert_eq!(summary(9, 1, false), ["1 lifecycles failed without a fault profile"]);
        assert_eq!(summary(0, 5, true), ["no lifecycle succeeded"]);
        assert_eq!(summary(0, 5, false), ["no lifecycle succeeded"]);
    }

    #[test]
    fn fault_profiles_by_name() {
        use crate::embedded::fault_profile;
        assert!(fault_profile("none", 1).unwrap().is_empty());
        assert!(fault_profile("hostile", 1).unwrap().len() > fault_profile("flaky", 1).unwrap().len());
        assert!(fault_profile("/nonexistent/rules.json", 1).is_err());
    }
}
