//! The reference's overload: 20 lifecycle loops at once for 60 s with
//! `timeoutMs` 20 s against a 300/min budget completed 5 lifecycles and
//! failed 41. [`run`] plays it ten times faster (3,000/min, 2 s, 6 s); the
//! test asserts what it must never do (fail, meet a 429, leak), the
//! `lease_economics` benchmark reports how much of the budget it used.

use crate::bed::Bed;
use createos_sim::{Ledger, RateLimit, SimConfig};
use provider_abi::{CreationRecorder, Provider};
use provider_host::wait;
use serde_json::json;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Lifecycle loops at once.
pub const LOOPS: usize = 20;
/// How long each loop starts new lifecycles.
pub const RUN: Duration = Duration::from_secs(6);
/// The budget: requests per minute.
pub const PER_MINUTE: f64 = 3_000.0;

/// What a run did.
pub struct Overload {
    /// Lifecycles completed (acquire, release, resume, destroy).
    pub completed: usize,
    /// The first error of each loop that failed.
    pub failures: Vec<String>,
    /// From the first lifecycle's start to the last one's end.
    pub elapsed: Duration,
    /// The slowest resume, of its 2 s.
    pub slowest_resume: Duration,
    /// The simulator's record.
    pub ledger: Ledger,
}

impl Overload {
    /// Requests per lifecycle, as the simulator counted them.
    pub fn per_lifecycle(&self) -> f64 {
        self.ledger.requests.len() as f64 / self.ledger.sandboxes.len().max(1) as f64
    }

    /// Lifecycles the budget's steady rate affords over the run.
    pub fn affordable(&self) -> f64 {
        PER_MINUTE / 60.0 * self.elapsed.as_secs_f64() / self.per_lifecycle()
    }

    /// The run in one line.
    pub fn summary(&self) -> String {
        format!(
            "completed {} lifecycles in {:?}; {} requests, {:.1} per lifecycle; the budget affords {:.1} \
             ({:.0} % of it done); the slowest resume took {:?} of its 2 s",
            self.completed,
            self.elapsed,
            self.ledger.requests.len(),
            self.per_lifecycle(),
            self.affordable(),
            100.0 * self.completed as f64 / self.affordable(),
            self.slowest_resume
        )
    }
}

/// [`LOOPS`] loops of acquire, release for reuse, resume and destroy for
/// [`RUN`] against a [`PER_MINUTE`] sliding window, `timeoutMs` 2 s.
pub fn run() -> Overload {
    let limit = RateLimit::sliding_window(PER_MINUTE as u32, Duration::from_secs(60));
    let bed = Bed::with(SimConfig { rate_limit: Some(limit), ..SimConfig::default() });
    let config =
        bed.config(json!({"requestsPerMinute": PER_MINUTE as u32, "timeoutMs": 2_000, "reuseLease": true}));
    let started = Instant::now();
    let slowest_resume_nanos = AtomicU64::new(0);
    let outcomes: Vec<Result<usize, String>> = std::thread::scope(|scope| {
        let loops: Vec<_> = (0..LOOPS)
            .map(|_| {
                scope.spawn(|| {
                    let mut completed = 0;
                    while started.elapsed() < RUN {
                        let acquiring = bed
                            .provider
                            .acquire_lease(bed.acquire_params(&config), CreationRecorder::discard());
                        let lease = wait(acquiring).map_err(|e| format!("acquire: {e:?}"))?;
                        let params = bed.lease_params(&config, &lease);
                        wait(bed.provider.release_lease(params.clone()))
                            .map_err(|e| format!("release: {e:?}"))?;
                        let resume_started = Instant::now();
                        let resumed = wait(bed.provider.resume_lease(params.clone()))
                            .map_err(|e| format!("resume: {e:?}"))?;
                        let took = resume_started.elapsed().as_nanos() as u64;
                        slowest_resume_nanos.fetch_max(took, Ordering::Relaxed);
                        if resumed.expired {
                            return Err("resume: the lease expired".to_owned());
                        }
                        wait(bed.provider.destroy_lease(params.clone()))
                            .map_err(|e| format!("destroy: {e:?}"))?;
                        completed += 1;
                    }
                    Ok(completed)
                })
            })
            .collect();
        loops.into_iter().map(|handle| handle.join().unwrap()).collect()
    });
    let elapsed = started.elapsed();
    Overload {
        completed: outcomes.iter().filter_map(|outcome| outcome.as_ref().ok()).sum(),
        failures: outcomes.into_iter().filter_map(Result::err).collect(),
        elapsed,
        slowest_resume: Duration::from_nanos(slowest_resume_nanos.into_inner()),
        ledger: bed.ledger(),
    }
}
