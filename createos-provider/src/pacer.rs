//! The request budget shared by every lease talking to one CreateOS account.
//!
//! # Pacing rule
//!
//! One [`Pacer`] per (API origin, API key) in the process ([`Pacer::shared`];
//! the registry keys on a salted hash of the key, never the key). It is a
//! GCRA (a token bucket in "theoretical arrival time" form) with
//!
//! - emission interval `T = 60 s / (0.97 × limit)`, rounded *up* to the
//!   nanosecond, so the steady rate is 97 % of the limit (291/min of 300,
//!   one start every 206.2 ms, against the reference's 300 ms = 200/min);
//! - burst `B = clamp((limit − ⌊0.97 × limit⌋) / 3, 1, 8)` (3 for 300/min).
//!
//! GCRA admits at most `B + ⌊60 s / T⌋` request starts in any closed 60 s
//! window, whatever the timing of the callers: 3 + 290 = 293 for 300/min,
//! so the server's sliding window never sees more than the limit, and the
//! spare requests (7 of 300) absorb latency jitter between our clock and the
//! server's. Under sustained load the rate is ≥ 96.9 % of the limit.
//!
//! A 429's `Retry-After` calls [`Pacer::pause_until`]: no request starts before
//! that instant, whatever its priority.
//!
//! # Order
//!
//! Waiting requests are served strictly by [`Priority`] (cleanup, then
//! in-flight work, then new work), FIFO within a priority. Only the head of
//! the queue may start; a waiter whose future is dropped leaves the queue at
//! once and wakes the next head, so cancellation never blocks anybody.
//!
//! # Admission of new work
//!
//! [`Pacer::admit_new_work`] admits new work (e.g. a new lease) only while
//! `waiting requests + outstanding admissions < capacity`, where capacity is
//! what the budget serves within the caller's `horizon`, at least 1 (the
//! lease hooks pass a tenth of `timeoutMs`: 2 s, 9 requests, for a `timeoutMs`
//! of 20 s at 300/min). Admission waiters are served FIFO. The caller holds the
//! [`Admission`] guard while the new work issues its first requests (e.g.
//! until its sandbox is created) and then drops it. So new work never piles
//! up more backlog in front of work already in flight than the deadlines of
//! that work can absorb, which keeps in-flight and cleanup latency low.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

/// Share of the limit the pacer spends, in percent.
pub const RATE_PERCENT: u64 = 97;
/// Largest burst.
pub const MAX_BURST: u32 = 8;

/// A request's priority; lower variants are served first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Priority {
    /// Cleanup: killing process trees, deleting or pausing sandboxes.
    Cleanup,
    /// Work already under way: polls, output, uploads of a running command.
    InFlight,
    /// Starting new work: creating sandboxes or processes.
    NewWork,
}

/// The pacing parameters derived from a limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    /// The account limit (requests per minute).
    pub limit: u32,
    /// Time between request starts at the steady rate.
    pub interval: Duration,
    /// Requests that may start back to back after an idle period.
    pub burst: u32,
}

impl Rate {
    /// The rate for `limit` requests per minute (0 counts as 1).
    pub fn for_limit(limit: u32) -> Rate {
        let limit = limit.max(1);
        let nanos = 60_000_000_000u128 * 100;
        let denom = u128::from(RATE_PERCENT) * u128::from(limit);
        let interval = Duration::from_nanos(nanos.div_ceil(denom) as u64);
        let steady = u64::from(limit) * RATE_PERCENT / 100;
        let slack = u64::from(limit) - steady;
        let burst = (slack / 3).clamp(1, u64::from(MAX_BURST)) as u32;
        Rate { limit, interval, burst }
    }

    /// The most request starts in any closed 60 s window.
    pub fn max_per_minute(&self) -> u64 {
        u64::from(self.burst) + (60_000_000_000u128 / self.interval.as_nanos()) as u64
    }

    /// How many requests the budget serves within `horizon`, at least 1.
    pub fn capacity_within(&self, horizon: Duration) -> usize {
        ((horizon.as_nanos() / self.interval.as_nanos()) as usize).max(1)
    }

    fn tolerance(&self) -> Duration {
        self.interval * (self.burst - 1)
    }
}

#[derive(Debug)]
struct State {
    rate: Rate,
    /// GCRA theoretical arrival time.
    tat: Option<Instant>,
    paused_until: Option<Instant>,
    queue: BTreeMap<(Priority, u64), Arc<Notify>>,
    admissions: VecDeque<(u64, Arc<Notify>)>,
    admitted: usize,
    next_seq: u64,
}

impl State {
    fn earliest_start(&self) -> Option<Instant> {
        let tolerance = self.rate.tolerance();
        let budget = self.tat.map(|tat| tat.checked_sub(tolerance).unwrap_or(tat));
        match (budget, self.paused_until) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        }
    }

    fn wake_head(&self) {
        if let Some(notify) = self.queue.values().next() {
            notify.notify_one();
        }
    }

    fn wake_admission(&self) {
        if let Some((_, notify)) = self.admissions.front() {
            notify.notify_one();
        }
    }
}

/// A request budget. See the module documentation for the rules.
#[derive(Debug)]
pub struct Pacer {
    state: Mutex<State>,
}

type Registry = Mutex<HashMap<(String, u64), Arc<Pacer>>>;

fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(Default::default)
}

/// A salted (per process) hash of an API key, for registry keys.
pub fn key_fingerprint(key: &str) -> u64 {
    static SALT: OnceLock<std::collections::hash_map::RandomState> = OnceLock::new();
    SALT.get_or_init(Default::default).hash_one(key)
}

impl Pacer {
    /// A new, unshared budget of `requests_per_minute`.
    pub fn new(requests_per_minute: u32) -> Pacer {
        Pacer {
            state: Mutex::new(State {
                rate: Rate::for_limit(requests_per_minute),
                tat: None,
                paused_until: None,
                queue: BTreeMap::new(),
                admissions: VecDeque::new(),
                admitted: 0,
                next_seq: 0,
            }),
        }
    }

    /// The process-wide budget for (`origin`, key). If the limit differs from
    /// the one the budget was created with, the latest configuration wins.
    pub fn shared(origin: &str, key_fingerprint: u64, requests_per_minute: u32) -> Arc<Pacer> {
        let mut map = registry().lock().unwrap_or_else(|e| e.into_inner());
        let pacer = map
            .entry((origin.to_string(), key_fingerprint))
            .or_insert_with(|| Arc::new(Pacer::new(requests_per_minute)))
            .clone();
        drop(map);
        pacer.set_limit(requests_per_minute);
        pacer
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Changes the limit; waiters are re-evaluated.
    pub fn set_limit(&self, requests_per_minute: u32) {
        let mut state = self.lock();
        let rate = Rate::for_limit(requests_per_minute);
        if state.rate != rate {
            state.rate = rate;
            state.wake_head();
            state.wake_admission();
        }
    }

    /// The current pacing parameters.
    pub fn rate(&self) -> Rate {
        self.lock().rate
    }

    /// Requests waiting for a permit.
    pub fn waiting(&self) -> usize {
        self.lock().queue.len()
    }

    /// The end of the current 429 pause, if any was ever set.
    pub fn paused_until(&self) -> Option<Instant> {
        self.lock().paused_until
    }

    /// Delays every request start until `until` (a 429's `Retry-After`).
    /// A pause never shortens an earlier one.
    pub fn pause_until(&self, until: Instant) {
        let mut state = self.lock();
        state.paused_until = Some(state.paused_until.map_or(until, |p| p.max(until)));
        // Waiters re-check when they wake; a longer pause needs no wake-up.
    }

    /// Waits for the right to start one request now. Cancel by dropping the
    /// future: its place is released at once.
    pub async fn acquire(&self, priority: Priority) {
        let notify = Arc::new(Notify::new());
        let key = {
            let mut state = self.lock();
            let key = (priority, state.next_seq);
            state.next_seq += 1;
            state.queue.insert(key, notify.clone());
            key
        };
        let mut place = QueuePlace { pacer: self, key, done: false };
        loop {
            let wait_until = {
                let mut state = self.lock();
                let is_head = state.queue.keys().next() == Some(&key);
                if !is_head {
                    None
                } else {
                    let now = Instant::now();
                    match state.earliest_start() {
                        Some(t) if t > now => Some(t),
                        _ => {
                            let interval = state.rate.interval;
                            state.tat = Some(state.tat.map_or(now, |tat| tat.max(now)) + interval);
                            state.queue.remove(&key);
                            place.done = true;
                            state.wake_head();
                            state.wake_admission();
                            return;
                        }
                    }
                }
            };
            match wait_until {
                None => notify.notified().await,
                Some(t) => {
                    tokio::select! {
                        _ = tokio::time::sleep_until(t) => {}
                        _ = notify.notified() => {}
                    }
                }
            }
        }
    }

    /// Waits until new work may start: until the backlog of waiting requests
    /// plus outstanding admissions is below what the budget serves within
    /// `horizon` (see the module documentation). Returns a guard that counts
    /// against that capacity until dropped. Cancel by dropping the future.
    pub async fn admit_new_work(self: &Arc<Self>, horizon: Duration) -> Admission {
        let notify = Arc::new(Notify::new());
        let seq = {
            let mut state = self.lock();
            let seq = state.next_seq;
            state.next_seq += 1;
            state.admissions.push_back((seq, notify.clone()));
            seq
        };
        let mut place = AdmissionPlace { pacer: self, seq, done: false };
        loop {
            {
                let mut state = self.lock();
                let is_front = state.admissions.front().map(|(s, _)| *s) == Some(seq);
                let capacity = state.rate.capacity_within(horizon);
                if is_front && state.queue.len() + state.admitted < capacity {
                    state.admissions.pop_front();
                    state.admitted += 1;
                    place.done = true;
                    state.wake_admission();
                    return Admission { pacer: self.clone() };
                }
            }
            notify.notified().await;
        }
    }
}

/// A waiting request's place in the queue; dropping it (cancellation)
/// releases the place and wakes the next head.
struct QueuePlace<'a> {
    pacer: &'a Pacer,
    key: (Priority, u64),
    done: bool,
}

impl Drop for QueuePlace<'_> {
    fn drop(&mut self) {
        if !self.done {
            let mut state = self.pacer.lock();
            state.queue.remove(&self.key);
            state.wake_head();
            state.wake_admission();
        }
    }
}

struct AdmissionPlace<'a> {
    pacer: &'a Pacer,
    seq: u64,
    done: bool,
}

impl Drop for AdmissionPlace<'_> {
    fn drop(&mut self) {
        if !self.done {
            let mut state = self.pacer.lock();
            state.admissions.retain(|(s, _)| *s != self.seq);
            state.wake_admission();
        }
    }
}

/// Admission of one piece of new work; drop it once the work is under way.
#[derive(Debug)]
pub struct Admission {
    pacer: Arc<Pacer>,
}

impl Drop for Admission {
    fn drop(&mut self) {
        let mut state = self.pacer.lock();
        state.admitted -= 1;
        state.wake_admission();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::task::yield_now;

    async fn until_waiting(pacer: &Pacer, n: usize) {
        while pacer.waiting() != n {
            yield_now().await;
        }
    }

    #[test]
    fn rate_parameters() {
        let r = Rate::for_limit(300);
        assert_eq!(r.burst, 3);
        assert_eq!(r.interval, Duration::from_nanos(206_185_568));
        assert_eq!(r.max_per_minute(), 293);
        assert_eq!(r.capacity_within(Duration::from_secs(2)), 9);
        for limit in [1, 2, 7, 33, 34, 60, 100, 299, 300, 301, 1000, 5000, 100_000] {
            let r = Rate::for_limit(limit);
            assert!(r.max_per_minute() <= u64::from(limit), "{limit}: {r:?}");
            assert!(
                (60_000_000_000u128 / r.interval.as_nanos()) as f64 >= 0.95 * f64::from(limit) - 1.0,
                "{limit}: {r:?}"
            );
        }
    }

    /// Saturates the pacer from `tasks` loops for `minutes` simulated minutes
    /// and returns the grant times, relative to the start.
    async fn saturate(limit: u32, tasks: usize, minutes: u64) -> Vec<Duration> {
        let pacer = Arc::new(Pacer::new(limit));
        let start = Instant::now();
        let grants = Arc::new(Mutex::new(Vec::new()));
        let handles: Vec<_> = (0..tasks)
            .map(|i| {
                let (pacer, grants) = (pacer.clone(), grants.clone());
                tokio::spawn(async move {
                    let priority = [Priority::Cleanup, Priority::InFlight, Priority::NewWork][i % 3];
                    loop {
                        pacer.acquire(priority).await;
                        grants.lock().unwrap().push(start.elapsed());
                        // Some callers pause between requests, like real leases.
                        if i % 2 == 0 {
                            tokio::time::sleep(Duration::from_millis(37 * i as u64)).await;
                        }
                    }
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_secs(60 * minutes)).await;
        for h in &handles {
            h.abort();
        }
        let grants = grants.lock().unwrap().clone();
        grants
    }

    fn max_in_any_window(times: &[Duration], window: Duration) -> usize {
        let mut max = 0;
        let mut lo = 0;
        for hi in 0..times.len() {
            while times[hi] - times[lo] > window {
                lo += 1;
            }
            max = max.max(hi - lo + 1);
        }
        max
    }

    #[tokio::test(start_paused = true)]
    async fn rate_is_exact_over_simulated_minutes() {
        for limit in [300u32, 60, 1000] {
            let times = saturate(limit, 12, 5).await;
            assert!(times.windows(2).all(|w| w[0] <= w[1]));
            let max = max_in_any_window(&times, Duration::from_secs(60));
            assert!(max <= limit as usize, "{limit}: {max} in a 60 s window");
            eprintln!("limit {limit}: {} starts in 5 min, at most {max} in any 60 s window", times.len());
            for minute in 0..5u64 {
                let lo = Duration::from_secs(60 * minute);
                let hi = lo + Duration::from_secs(60);
                let n = times.iter().filter(|t| **t >= lo && **t < hi).count();
                assert!(n as f64 >= 0.95 * f64::from(limit), "{limit}: minute {minute} used {n}");
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn bursts_after_idle_stay_within_the_window() {
        // Alternate idle periods and bursts; the limit holds in every window.
        let limit = 300;
        let pacer = Arc::new(Pacer::new(limit));
        let start = Instant::now();
        let mut times = Vec::new();
        for round in 0..40u64 {
            for _ in 0..(round % 7) * 20 {
                pacer.acquire(Priority::NewWork).await;
                times.push(start.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(round * 731 % 5000)).await;
        }
        assert!(max_in_any_window(&times, Duration::from_secs(60)) <= limit as usize);
    }

    #[tokio::test(start_paused = true)]
    async fn priority_then_fifo() {
        let pacer = Arc::new(Pacer::new(60));
        pacer.acquire(Priority::NewWork).await; // spend the burst (1)
        let order = Arc::new(Mutex::new(Vec::new()));
        let plan = [
            ("new-1", Priority::NewWork),
            ("inflight-1", Priority::InFlight),
            ("cleanup-1", Priority::Cleanup),
            ("new-2", Priority::NewWork),
            ("cleanup-2", Priority::Cleanup),
            ("inflight-2", Priority::InFlight),
        ];
        let mut handles = Vec::new();
        for (i, (name, priority)) in plan.into_iter().enumerate() {
            let (p, order) = (pacer.clone(), order.clone());
            handles.push(tokio::spawn(async move {
                p.acquire(priority).await;
                order.lock().unwrap().push(name);
            }));
            until_waiting(&pacer, i + 1).await;
        }
        for h in handles {
            h.await.unwrap();
        }
        assert_eq!(
            *order.lock().unwrap(),
            ["cleanup-1", "cleanup-2", "inflight-1", "inflight-2", "new-1", "new-2"]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn cancelled_waiters_release_their_place() {
        let pacer = Arc::new(Pacer::new(60));
        let interval = pacer.rate().interval;
        let start = Instant::now();
        pacer.acquire(Priority::NewWork).await;
        // The head (a cleanup request) and a middle waiter are cancelled.
        let head = tokio::spawn({
            let p = pacer.clone();
            async move { p.acquire(Priority::Cleanup).await }
        });
        until_waiting(&pacer, 1).await;
        let middle = tokio::spawn({
            let p = pacer.clone();
            async move { p.acquire(Priority::InFlight).await }
        });
        until_waiting(&pacer, 2).await;
        let last = tokio::spawn({
            let p = pacer.clone();
            async move {
                p.acquire(Priority::NewWork).await;
                Instant::now()
            }
        });
        until_waiting(&pacer, 3).await;
        head.abort();
        middle.abort();
        assert!(head.await.unwrap_err().is_cancelled());
        assert!(middle.await.unwrap_err().is_cancelled());
        assert_eq!(pacer.waiting(), 1);
        let granted = last.await.unwrap();
        // Served at the first free slot, as if the others never existed.
        assert!(granted - start <= interval + Duration::from_millis(1));
        assert_eq!(pacer.waiting(), 0);
        // A future dropped before it is ever polled leaves no trace either.
        drop(pacer.acquire(Priority::Cleanup));
        assert_eq!(pacer.waiting(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn retry_after_delays_every_waiter() {
        let pacer = Arc::new(Pacer::new(300));
        let start = Instant::now();
        pacer.pause_until(start + Duration::from_secs(10));
        // A shorter pause never shortens the longer one.
        pacer.pause_until(start + Duration::from_secs(1));
        let handles: Vec<_> = [Priority::Cleanup, Priority::InFlight, Priority::NewWork]
            .into_iter()
            .map(|priority| {
                let p = pacer.clone();
                tokio::spawn(async move {
                    p.acquire(priority).await;
                    Instant::now()
                })
            })
            .collect();
        for h in handles {
            let at = h.await.unwrap();
            assert!(at - start >= Duration::from_secs(10));
            assert!(at - start <= Duration::from_secs(11));
        }
    }

    const HORIZON: Duration = Duration::from_secs(2);

    #[tokio::test(start_paused = true)]
    async fn admission_follows_the_backlog() {
        let pacer = Arc::new(Pacer::new(300));
        let capacity = pacer.rate().capacity_within(HORIZON);
        assert_eq!(capacity, 9);
        for _ in 0..3 {
            pacer.acquire(Priority::InFlight).await; // spend the burst
        }
        // A backlog of `capacity` waiting requests blocks admission.
        let waiters: Vec<_> = (0..capacity)
            .map(|_| {
                let p = pacer.clone();
                tokio::spawn(async move { p.acquire(Priority::InFlight).await })
            })
            .collect();
        until_waiting(&pacer, capacity).await;
        let start = Instant::now();
        let admission = pacer.admit_new_work(HORIZON).await;
        // One request had to start before new work was admitted.
        assert!(Instant::now() > start);
        assert_eq!(pacer.waiting(), capacity - 1);
        // The guard counts: the next admission needs another start.
        let t1 = Instant::now();
        let second = pacer.admit_new_work(HORIZON).await;
        assert!(Instant::now() > t1);
        drop(admission);
        drop(second);
        for w in waiters {
            w.await.unwrap();
        }
        // Idle: admission is immediate; a cancelled admission frees its place.
        drop(pacer.admit_new_work(HORIZON));
        let t2 = Instant::now();
        let _a = pacer.admit_new_work(HORIZON).await;
        assert_eq!(Instant::now(), t2);
    }

    #[test]
    fn shared_pacers_are_per_origin_and_key() {
        let a = Pacer::shared("https://a.test", key_fingerprint("k1"), 300);
        let b = Pacer::shared("https://a.test", key_fingerprint("k1"), 600);
        let c = Pacer::shared("https://a.test", key_fingerprint("k2"), 300);
        let d = Pacer::shared("https://b.test", key_fingerprint("k1"), 300);
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(a.rate().limit, 600);
        assert!(!Arc::ptr_eq(&a, &c));
        assert!(!Arc::ptr_eq(&a, &d));
        assert_ne!(key_fingerprint("k1"), key_fingerprint("k2"));
    }
}
