//! The request budget shared by every lease talking to one CreateOS account.
//!
//! One [`Pacer`] per (API origin, API key) in the process ([`Pacer::shared`];
//! the registry keys on a salted hash of the key, never the key). CreateOS
//! allows `limit` requests per minute per caller (300); the pacer decides
//! when each request may start.
//!
//! # Window pacing (the default)
//!
//! The pacer keeps a log of its own request starts of the last 60 s (a
//! sliding-window log, the same rule as a sliding-window limiter on the
//! server) and starts a request when
//!
//! - the window holds fewer than the **cap** `C = ⌊0.97 × limit⌋` starts
//!   (291 of 300): never more than that in any 60 s, whatever the callers do;
//!   the 9 spare requests absorb the difference between our start times and
//!   the server's arrival times (a request that took 1.8 s longer than one
//!   sent 60 s earlier), and
//! - either the window holds fewer than the **free share** `F = ⌊C / 4⌋`
//!   starts (72): the budget is mostly unused, so the request starts at once
//!   (a lone lease's ~14 requests go at network speed), or the last start
//!   was at least `60 s / (C − b)` ago, where `b` counts the free starts
//!   still in the window: under load, starts are spaced smoothly, and what
//!   free starts took is paid back evenly until they leave the window.
//!
//! So under sustained load, every 60 s window holds at most `C` starts and,
//! once the free starts of the first minute have left the window, exactly
//! `C` (97 % of the limit), spaced `60 s / C` (206 ms) apart: a stall never
//! happens, because the spacing never lets the window fill before its oldest
//! starts expire. A start that comes late (nobody was waiting when it was
//! due, as between a lease's requests) is counted as due, up to one spacing
//! late, so gaps in the demand do not pull the settled rate below `C`. The first minute after an idle period runs at
//! `(C − b) / C` of that rate after its free burst (at least 75 %).
//!
//! Memory: starts are logged in 50 ms slots ([`SLOT`]), a slot keeping its
//! latest start (so a slot expires no earlier than any start in it): at most
//! 1,201 slots whatever the limit.
//!
//! # Smooth pacing (the fallback)
//!
//! If the server answers 429 while the window had room (it always has: a
//! start is only granted below the cap), its limiter is not a 60 s sliding
//! window over our requests (a token bucket with a small burst, a fixed
//! window, another client on the same address). The client then switches
//! this pacer to smooth pacing ([`Pacer::pace_smoothly`]) for good, and says
//! so in a `debug` log. Smooth pacing is a GCRA (a token bucket in
//! "theoretical arrival time" form) with emission interval
//! `T = 60 s / (0.97 × limit)` rounded up to the nanosecond (206.2 ms at
//! 300/min) and burst `B = clamp((limit − ⌊0.97 × limit⌋) / 3, 1, 8)` (3):
//! at most `B + ⌊60 s / T⌋` (293) starts in any 60 s, never more than `B`
//! back to back.
//!
//! # A share of the budget
//!
//! When several hosts send requests to one account from one caller, each is
//! granted a share of the budget ([`Pacer::grant_share`], in parts per
//! million; the host's `grant_request_share` hook sets it for every pacer of
//! the process through [`grant_share_to_all`]). A share below the whole
//! budget scales the cap (`⌊C × share⌋`, at least 1) and the smooth interval
//! alike, and gives no free starts: a host joining others that already spend
//! the budget must not burst. A lower share applies at once: the window
//! already holds what it holds, and no request starts until it holds fewer
//! than the new cap. A higher share applies one window (60 s) after it was
//! granted, when the requests of the host that left (or whose share fell)
//! no longer count on the server.
//!
//! In both modes a 429's `Retry-After` calls [`Pacer::pause_until`]: no
//! request starts before that instant, whatever its priority.
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
//! `waiting requests + outstanding admissions + recent admissions <
//! capacity` (recent: granted within the last horizon while other work was
//! being admitted or waiting, so never the sequential admissions of a lone
//! lease), where capacity is what the budget serves within the
//! caller's `horizon` at its *sustained* rate (the current spacing, never the
//! free share), at least 1 (the lease hooks pass a tenth of `timeoutMs`: 2 s,
//! 9 requests, for a `timeoutMs` of 20 s at 300/min). Admission waiters are
//! served FIFO. The caller holds the admission guard while the new work
//! issues its first requests (e.g. until its sandbox is created) and then
//! drops it. Counting recent admissions matters when the free share lets
//! the first requests of a crowd start at once (nothing waits): without it a
//! crowd would be admitted whole and then share the sustained rate, past its
//! deadlines. So new work never piles up more backlog in front of work
//! already in flight than the deadlines of that work can absorb.

use std::collections::{BTreeMap, VecDeque};
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use scopeguard::ScopeGuard;
use tokio::sync::Notify;
use tokio::time::Instant;

/// Share of the limit the pacer spends, in percent.
pub const RATE_PERCENT: u64 = 97;
/// Largest burst of smooth pacing.
pub const MAX_BURST: u32 = 8;
/// The window CreateOS counts requests in.
pub const WINDOW: Duration = Duration::from_secs(60);
/// The free share is the cap divided by this.
pub const FREE_DIVISOR: u32 = 4;
/// Starts within one slot of the window log share an entry.
pub const SLOT: Duration = Duration::from_millis(50);
/// The whole budget, as a share in parts per million.
pub const FULL_SHARE: u32 = 1_000_000;
/// Admissions remembered for the "admissions of the last horizon" count.
const RECENT_ADMISSIONS: usize = 256;

/// How the pacer spaces request starts (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pacing {
    /// Count the starts of the last 60 s; free starts while the window is
    /// mostly unused.
    Window,
    /// GCRA at 97 % of the limit with a small burst.
    Smooth,
}

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
    /// Time between request starts at the steady rate of smooth pacing.
    pub interval: Duration,
    /// Requests that may start back to back after an idle period (smooth).
    pub burst: u32,
    /// Most starts in any 60 s window (window pacing): ⌊0.97 × limit⌋.
    pub cap: u32,
    /// Starts that need no spacing while the window holds fewer (window
    /// pacing): ⌊cap / 4⌋.
    pub free: u32,
}

impl Rate {
    /// The rate for `limit` requests per minute (0 counts as 1).
    pub fn for_limit(limit: u32) -> Rate {
        let limit = limit.max(1);
        let interval = Rate::interval(limit, FULL_SHARE);
        let steady = u64::from(limit) * RATE_PERCENT / 100;
        let slack = u64::from(limit) - steady;
        let burst = (slack / 3).clamp(1, u64::from(MAX_BURST)) as u32;
        let cap = (steady as u32).max(1);
        Rate { limit, interval, burst, cap, free: cap / FREE_DIVISOR }
    }

    /// The rate of `share` (parts per million, 1 to [`FULL_SHARE`]) of the
    /// budget of `limit` requests per minute: the cap and the smooth interval
    /// scaled, at least one start per minute; below the whole budget no free
    /// starts and no burst beyond one.
    pub fn for_share(limit: u32, share: u32) -> Rate {
        let whole = Rate::for_limit(limit);
        let share = share.clamp(1, FULL_SHARE);
        if share == FULL_SHARE {
            return whole;
        }
        let cap = ((u64::from(whole.cap) * u64::from(share) / u64::from(FULL_SHARE)) as u32).max(1);
        Rate { limit: whole.limit, interval: Rate::interval(whole.limit, share), burst: 1, cap, free: 0 }
    }

    /// `60 s / (0.97 × limit × share)`, rounded up to the nanosecond.
    fn interval(limit: u32, share: u32) -> Duration {
        let nanos = WINDOW.as_nanos() * 100 * u128::from(FULL_SHARE);
        let denom = u128::from(RATE_PERCENT) * u128::from(limit) * u128::from(share);
        Duration::from_nanos(nanos.div_ceil(denom) as u64)
    }

    /// The most request starts smooth pacing allows in any closed 60 s window.
    pub fn max_per_minute(&self) -> u64 {
        u64::from(self.burst) + (WINDOW.as_nanos() / self.interval.as_nanos()) as u64
    }

    /// The spacing of window pacing once the window holds the free share,
    /// with `free_in_window` free starts still in it: `60 s / (cap − b)`.
    pub fn window_spacing(&self, free_in_window: u32) -> Duration {
        let paced = self.cap.saturating_sub(free_in_window).max(1);
        WINDOW / paced
    }

    fn tolerance(&self) -> Duration {
        self.interval * (self.burst - 1)
    }
}

/// Starts logged in one [`SLOT`].
#[derive(Debug, Clone, Copy)]
struct Slot {
    index: u128,
    /// The latest start in the slot: the slot leaves the window 60 s after.
    last: Instant,
    starts: u32,
    free: u32,
}

/// The sliding-window log of our own starts.
#[derive(Debug)]
struct Window {
    epoch: Instant,
    slots: VecDeque<Slot>,
    starts: u32,
    free: u32,
}

impl Window {
    fn new() -> Window {
        Window { epoch: Instant::now(), slots: VecDeque::new(), starts: 0, free: 0 }
    }

    /// Forgets the starts that left the window by `now`.
    fn prune(&mut self, now: Instant) {
        while let Some(slot) = self.slots.front() {
            if slot.last + WINDOW > now {
                break;
            }
            self.starts -= slot.starts;
            self.free -= slot.free;
            self.slots.pop_front();
        }
    }

    fn record(&mut self, now: Instant, free: bool) {
        let index = now.saturating_duration_since(self.epoch).as_nanos() / SLOT.as_nanos();
        match self.slots.back_mut() {
            Some(slot) if slot.index == index => {
                slot.last = slot.last.max(now);
                slot.starts += 1;
                slot.free += u32::from(free);
            }
            _ => self.slots.push_back(Slot { index, last: now, starts: 1, free: u32::from(free) }),
        }
        self.starts += 1;
        self.free += u32::from(free);
    }

    /// When the window will hold fewer than `cap` starts (it holds `cap` or
    /// more now).
    fn below(&self, cap: u32) -> Instant {
        let mut remaining = self.starts;
        for slot in &self.slots {
            remaining -= slot.starts;
            if remaining < cap {
                return slot.last + WINDOW;
            }
        }
        self.slots.back().map_or(self.epoch, |slot| slot.last + WINDOW)
    }
}

#[derive(Debug)]
struct State {
    rate: Rate,
    /// The share of the budget granted (ppm), which `rate` is computed for.
    share: u32,
    /// A higher share granted, and when it applies.
    raise: Option<(Instant, u32)>,
    pacing: Pacing,
    window: Window,
    last_start: Option<Instant>,
    /// GCRA theoretical arrival time (smooth pacing).
    tat: Option<Instant>,
    paused_until: Option<Instant>,
    queue: BTreeMap<(Priority, u64), Arc<Notify>>,
    admissions: BTreeMap<u64, Arc<Notify>>,
    admitted: usize,
    recent_admissions: VecDeque<Instant>,
    next_seq: u64,
}

impl State {
    /// The earliest instant the head may start (`None`: any time), and
    /// whether a start now would be a free one. The instant may be past.
    fn earliest_start(&mut self, now: Instant) -> (Option<Instant>, bool) {
        self.apply_raise(now);
        let (budget, free) = match self.pacing {
            Pacing::Smooth => {
                let tolerance = self.rate.tolerance();
                (self.tat.map(|tat| tat.checked_sub(tolerance).unwrap_or(tat)), false)
            }
            Pacing::Window => {
                self.window.prune(now);
                if self.window.starts >= self.rate.cap {
                    (Some(self.window.below(self.rate.cap)), false)
                } else if self.window.starts < self.rate.free {
                    (None, true)
                } else {
                    let spacing = self.rate.window_spacing(self.window.free);
                    (self.last_start.map(|last| last + spacing), false)
                }
            }
        };
        // A pending raise may let the head start sooner: look again then.
        let budget = budget.map(|at| self.raise.map_or(at, |(raise, _)| at.min(raise)));
        // `None < Some(_)`: a pause, if any, delays whatever the budget says.
        let at = budget.max(self.paused_until);
        (at, free && at.is_none_or(|t| t <= now))
    }

    /// Grants a start at `now`, which was `due` (`None`: a free start, or
    /// one with no spacing to keep). The window logs `now`; the next
    /// spacing counts from `due` when the start is late by less than one
    /// spacing, else from one spacing before `now`. A start is late because
    /// waking up is (the timer's millisecond, the scheduler's delay on a
    /// loaded machine), or because nobody was waiting when it was due (a
    /// lease between two of its requests): counting from `now` would lose
    /// that much per start (a millisecond is 0.5 % of the budget), and under
    /// load with gaps the settled rate would fall below the cap. The credit
    /// is bounded by one spacing, so at most two starts come closer than the
    /// spacing; the cap still counts real start times, so this never lets
    /// more than the cap start in 60 s.
    fn grant(&mut self, now: Instant, free: bool, due: Option<Instant>) {
        let spacing = self.rate.window_spacing(self.window.free);
        self.window.record(now, free);
        let credited = now.checked_sub(spacing).unwrap_or(now);
        self.last_start = Some(due.map_or(now, |due| due.max(credited)));
        let interval = self.rate.interval;
        self.tat = Some(self.tat.map_or(now, |tat| tat.max(now)) + interval);
    }

    /// Applies a pending higher share once it is due.
    fn apply_raise(&mut self, now: Instant) {
        if let Some((_, share)) = self.raise.filter(|(at, _)| *at <= now) {
            self.raise = None;
            self.share = share;
            self.rate = Rate::for_share(self.rate.limit, share);
        }
    }

    /// What the budget serves within `horizon` at its sustained rate.
    fn capacity_within(&self, horizon: Duration) -> usize {
        let spacing = match self.pacing {
            Pacing::Smooth => self.rate.interval,
            Pacing::Window => self.rate.window_spacing(self.window.free),
        };
        ((horizon.as_nanos() / spacing.as_nanos().max(1)) as usize).max(1)
    }

    fn admissions_within(&self, horizon: Duration, now: Instant) -> usize {
        self.recent_admissions
            .iter()
            .rev()
            .take_while(|at| now.saturating_duration_since(**at) < horizon)
            .count()
    }

    /// Grants a start now if the budget allows one (waking the admissions,
    /// which count waiting requests), else returns when to look again.
    fn try_start(&mut self) -> Result<(), Option<Instant>> {
        let now = Instant::now();
        match self.earliest_start(now) {
            (Some(t), _) if t > now => Err(Some(t)),
            (due, free) => {
                self.grant(now, free, due);
                self.wake_admission();
                Ok(())
            }
        }
    }

    /// Admits new work now if the backlog leaves room within `horizon`,
    /// else returns when recent admissions age out (if any do).
    fn try_admit(&mut self, horizon: Duration) -> Result<(), Option<Instant>> {
        let now = Instant::now();
        let recent = self.admissions_within(horizon, now);
        if self.queue.len() + self.admitted + recent >= self.capacity_within(horizon) {
            // Recent admissions age out without anybody waking us.
            let oldest = self.recent_admissions.len() - recent;
            return Err(self.recent_admissions.get(oldest).filter(|_| recent > 0).map(|at| *at + horizon));
        }
        // Counted as recent only if other work was starting or waiting: a
        // lone lease's admissions, one after the other, are never a crowd.
        if self.admitted > 0 || !self.queue.is_empty() {
            if self.recent_admissions.len() == RECENT_ADMISSIONS {
                self.recent_admissions.pop_front();
            }
            self.recent_admissions.push_back(now);
        }
        self.admitted += 1;
        Ok(())
    }

    /// Wakes the head of the request queue and of the admission queue.
    fn wake(&self) {
        if let Some(notify) = self.queue.values().next() {
            notify.notify_one();
        }
        self.wake_admission();
    }

    /// A fresh sequence number for a queue place.
    fn take_seq(&mut self) -> u64 {
        self.next_seq += 1;
        self.next_seq
    }

    fn wake_admission(&self) {
        if let Some(notify) = self.admissions.values().next() {
            notify.notify_one();
        }
    }
}

/// A request budget. See the module documentation for the rules.
#[derive(Debug)]
pub struct Pacer {
    state: Mutex<State>,
}

/// The shared pacers, by (API origin, key fingerprint).
static REGISTRY: Mutex<BTreeMap<(String, u64), Arc<Pacer>>> = Mutex::new(BTreeMap::new());

/// The share of the budget granted to this process (ppm), which every pacer
/// created from now on starts with.
static PROCESS_SHARE: AtomicU32 = AtomicU32::new(FULL_SHARE);

/// Grants `share` (parts per million) of its budget to every shared pacer
/// of this process, and to those created later.
pub fn grant_share_to_all(share: u32) {
    PROCESS_SHARE.store(share.clamp(1, FULL_SHARE), Ordering::Relaxed);
    let pacers: Vec<Arc<Pacer>> = crate::lock(&REGISTRY).values().cloned().collect();
    for pacer in pacers {
        pacer.grant_share(share);
    }
}

/// A salted (per process) hash of an API key, for registry keys.
pub fn key_fingerprint(key: &str) -> u64 {
    static SALT: OnceLock<std::collections::hash_map::RandomState> = OnceLock::new();
    SALT.get_or_init(Default::default).hash_one(key)
}

impl Pacer {
    /// A new, unshared budget of `requests_per_minute`, pacing by the window.
    pub fn new(requests_per_minute: u32) -> Pacer {
        Pacer {
            state: Mutex::new(State {
                rate: Rate::for_limit(requests_per_minute),
                share: FULL_SHARE,
                raise: None,
                pacing: Pacing::Window,
                window: Window::new(),
                last_start: None,
                tat: None,
                paused_until: None,
                queue: BTreeMap::new(),
                admissions: BTreeMap::new(),
                admitted: 0,
                recent_admissions: VecDeque::new(),
                next_seq: 0,
            }),
        }
    }

    /// The process-wide budget for (`origin`, key). If the limit differs from
    /// the one the budget was created with, the latest configuration wins.
    pub fn shared(origin: &str, key_fingerprint: u64, requests_per_minute: u32) -> Arc<Pacer> {
        let pacer = crate::lock(&REGISTRY)
            .entry((origin.to_string(), key_fingerprint))
            .or_insert_with(|| {
                let pacer = Pacer::new(requests_per_minute);
                pacer.grant_share(PROCESS_SHARE.load(Ordering::Relaxed));
                Arc::new(pacer)
            })
            .clone();
        pacer.set_limit(requests_per_minute);
        pacer
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        crate::lock(&self.state)
    }

    /// Changes the limit; waiters are re-evaluated.
    pub fn set_limit(&self, requests_per_minute: u32) {
        let mut state = self.lock();
        let rate = Rate::for_share(requests_per_minute, state.share);
        if state.rate != rate {
            state.rate = rate;
            state.wake();
        }
    }

    /// Grants `share` of the budget (parts per million, clamped to 1 to
    /// [`FULL_SHARE`]): a lower share at once, a higher one a window later
    /// (see the module documentation). Waiters are re-evaluated.
    pub fn grant_share(&self, share: u32) {
        let share = share.clamp(1, FULL_SHARE);
        let mut state = self.lock();
        let now = Instant::now();
        state.apply_raise(now);
        if share <= state.share {
            state.raise = None;
            state.share = share;
            state.rate = Rate::for_share(state.rate.limit, share);
        } else if state.raise.is_none_or(|(_, pending)| pending != share) {
            state.raise = Some((now + WINDOW, share));
        }
        state.wake();
    }

    /// The share of the budget in force now (parts per million).
    pub fn share(&self) -> u32 {
        let mut state = self.lock();
        state.apply_raise(Instant::now());
        state.share
    }

    /// The current pacing parameters.
    pub fn rate(&self) -> Rate {
        self.lock().rate
    }

    /// How request starts are spaced now.
    pub fn pacing(&self) -> Pacing {
        self.lock().pacing
    }

    /// Switches to smooth pacing for good (the server's limiter is not a
    /// sliding window). Returns whether the pacer was pacing by the window.
    /// The GCRA starts with no burst credit: the next start is one interval
    /// after the last one.
    pub fn pace_smoothly(&self) -> bool {
        let mut state = self.lock();
        if state.pacing == Pacing::Smooth {
            return false;
        }
        state.pacing = Pacing::Smooth;
        let (interval, burst) = (state.rate.interval, state.rate.burst);
        state.tat = state.last_start.map(|last| last + interval * burst);
        state.wake();
        true
    }

    /// The end of the current 429 pause, if any was ever set.
    pub fn paused_until(&self) -> Option<Instant> {
        self.lock().paused_until
    }

    /// Delays every request start until `until` (a 429's `Retry-After`).
    /// A pause never shortens an earlier one.
    pub fn pause_until(&self, until: Instant) {
        let mut state = self.lock();
        state.paused_until = state.paused_until.max(Some(until));
        // Waiters re-check when they wake; a longer pause needs no wake-up.
    }

    /// Waits for the right to start one request now. Cancel by dropping the
    /// future: its place is released at once.
    pub async fn acquire(&self, priority: Priority) {
        if self.start_now_if_nobody_waits() {
            return;
        }
        let key = (priority, self.lock().take_seq());
        self.wait_turn(|state| &mut state.queue, key, State::try_start).await;
    }

    /// Grants a start at once when no request waits and the budget allows
    /// one now: what [`Self::acquire`] would do on its first look, without
    /// taking a place in the queue (no allocation, no wakers).
    fn start_now_if_nobody_waits(&self) -> bool {
        let mut state = self.lock();
        state.queue.is_empty() && state.try_start().is_ok()
    }

    /// Waits until new work may start: until the backlog of waiting requests
    /// plus outstanding admissions plus the admissions of the last `horizon`
    /// is below what the budget serves within `horizon` (see the module
    /// documentation). Returns the admission: a guard that counts against
    /// that capacity until dropped (once the work is under way). Cancel by
    /// dropping the future.
    pub async fn admit_new_work(self: &Arc<Self>, horizon: Duration) -> impl Sized + Send {
        let key = self.lock().take_seq();
        self.wait_turn(|state| &mut state.admissions, key, |state| state.try_admit(horizon)).await;
        let pacer = self.clone();
        scopeguard::guard((), move |()| {
            let mut state = pacer.lock();
            state.admitted -= 1;
            state.wake_admission();
        })
    }

    /// Waits at `key` in the queue `line` picks until `take`, asked each
    /// time this waiter is the queue's head, succeeds (`Err`: when to ask
    /// again without a wake-up, if ever). Dropped while waiting
    /// (cancellation), the place is released and the next heads woken.
    async fn wait_turn<K: Ord + Copy>(
        &self,
        line: fn(&mut State) -> &mut BTreeMap<K, Arc<Notify>>,
        key: K,
        mut take: impl FnMut(&mut State) -> Result<(), Option<Instant>>,
    ) {
        let notify = Arc::new(Notify::new());
        line(&mut self.lock()).insert(key, notify.clone());
        let place = scopeguard::guard((), |()| {
            let mut state = self.lock();
            line(&mut state).remove(&key);
            state.wake();
        });
        loop {
            let retry_at = {
                let mut state = self.lock();
                if line(&mut state).keys().next() != Some(&key) {
                    None
                } else if let Err(at) = take(&mut state) {
                    at
                } else {
                    ScopeGuard::into_inner(place);
                    line(&mut state).remove(&key);
                    state.wake();
                    return;
                }
            };
            // Woken, or time to look again.
            match retry_at {
                Some(at) => {
                    let _woken_or_timed_out = tokio::time::timeout_at(at, notify.notified()).await;
                }
                None => notify.notified().await,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::task::yield_now;

    async fn until_waiting(pacer: &Pacer, n: usize) {
        while pacer.lock().queue.len() != n {
            yield_now().await;
        }
    }

    fn smooth(limit: u32) -> Arc<Pacer> {
        let pacer = Arc::new(Pacer::new(limit));
        assert!(pacer.pace_smoothly());
        pacer
    }

    #[test]
    fn rate_parameters() {
        let r = Rate::for_limit(300);
        assert_eq!(r.burst, 3);
        assert_eq!(r.interval, Duration::from_nanos(206_185_568));
        assert_eq!(r.max_per_minute(), 293);
        assert_eq!(Duration::from_secs(2).as_nanos() / r.interval.as_nanos(), 9, "served in 2 s");
        assert_eq!((r.cap, r.free), (291, 72));
        assert_eq!(r.window_spacing(0), Duration::from_nanos(206_185_567));
        assert_eq!(r.window_spacing(72), Duration::from_nanos(273_972_602));
        assert_eq!(r.window_spacing(291), Duration::from_secs(60));
        let r = Rate::for_limit(3_000);
        assert_eq!((r.cap, r.free, r.burst), (2_910, 727, 8));
        let r = Rate::for_limit(0);
        assert_eq!((r.limit, r.cap, r.free, r.burst), (1, 1, 0, 1));
        let r = Rate::for_limit(34);
        assert_eq!((r.cap, r.free, r.burst), (32, 8, 1));
        for limit in [1, 2, 7, 33, 34, 60, 100, 299, 300, 301, 1000, 5000, 100_000] {
            let r = Rate::for_limit(limit);
            assert!(r.max_per_minute() <= u64::from(limit), "{limit}: {r:?}");
            assert!(
                (60_000_000_000u128 / r.interval.as_nanos()) as f64 >= 0.95 * f64::from(limit) - 1.0,
                "{limit}: {r:?}"
            );
        }
    }

    /// Saturates `pacer` from `tasks` loops for `minutes` simulated minutes
    /// and returns the grant times, relative to the start.
    async fn saturate(pacer: Arc<Pacer>, tasks: usize, minutes: u64) -> Vec<Duration> {
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
            while times[hi] - times[lo] >= window {
                lo += 1;
            }
            max = max.max(hi - lo + 1);
        }
        max
    }

    fn per_minute(times: &[Duration], minutes: u64) -> Vec<usize> {
        (0..minutes)
            .map(|minute| {
                let lo = Duration::from_secs(60 * minute);
                let hi = lo + Duration::from_secs(60);
                times.iter().filter(|t| **t >= lo && **t < hi).count()
            })
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn smooth_rate_is_exact_over_simulated_minutes() {
        for (limit, most, least) in [(300u32, 293, 290), (60, 59, 58), (1000, 977, 969)] {
            let times = saturate(smooth(limit), 12, 5).await;
            assert!(times.windows(2).all(|w| w[0] <= w[1]));
            assert_eq!(max_in_any_window(&times, WINDOW), most, "{limit}");
            for (minute, n) in per_minute(&times, 5).into_iter().enumerate() {
                assert!(n >= least, "{limit}: minute {minute} used {n}");
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn window_pacing_settles_at_the_cap_without_a_stall() {
        let times = saturate(Arc::new(Pacer::new(300)), 12, 5).await;
        // The free share at once, then never more than the cap in any
        // 60 s, and the cap in every minute.
        assert_eq!(times.iter().filter(|t| t.is_zero()).count(), 72);
        assert_eq!(max_in_any_window(&times, WINDOW), 291);
        assert_eq!(per_minute(&times, 5), [290, 291, 291, 291, 291]);
        // No gap between starts longer than the paced spacing after the
        // free share (274 ms, to the timer's millisecond): no stall.
        let longest = times.windows(2).map(|w| w[1] - w[0]).max().unwrap();
        assert_eq!(longest, Duration::from_millis(274));
        // Settled: any 60 s from the third minute on holds the cap.
        let at = |t: u64| times.partition_point(|s| *s < Duration::from_millis(t));
        for from in (120_000..240_000).step_by(7_001) {
            assert_eq!(at(from + 60_000) - at(from), 291, "from {from} ms");
        }
    }

    /// The window pacing's thresholds, one start on either side of each
    /// (literal numbers, so a changed comparison or constant is caught).
    #[test]
    fn window_thresholds_on_either_side() {
        let spacing = Duration::from_nanos(206_185_567);
        let pacer = Pacer::new(300);
        let mut state = pacer.lock();
        let t0 = state.window.epoch;
        // 71 starts: the 72nd is still free; 72: the 73rd is spaced.
        for _ in 0..71 {
            state.grant(t0, true, None);
        }
        assert_eq!(state.earliest_start(t0), (None, true));
        state.grant(t0, true, None);
        let after_free = Duration::from_nanos(273_972_602);
        assert_eq!(state.earliest_start(t0), (Some(t0 + after_free), false));
        // 290 starts: one more may start (spaced); 291: full until the
        // oldest leave, exactly 60 s after them.
        for _ in 72..290 {
            state.grant(t0, false, None);
        }
        assert_eq!(state.window.starts, 290);
        assert_eq!(state.earliest_start(t0), (Some(t0 + after_free), false));
        state.grant(t0, false, None);
        let t1 = t0 + Duration::from_secs(1);
        assert_eq!(state.earliest_start(t1), (Some(t0 + WINDOW), false));
        assert_eq!(state.window.below(291), t0 + WINDOW);
        // One nanosecond before the 60 s the starts still count; at 60 s
        // they are gone.
        state.window.prune(t0 + WINDOW - Duration::from_nanos(1));
        assert_eq!(state.window.starts, 291);
        state.window.prune(t0 + WINDOW);
        assert_eq!((state.window.starts, state.window.free), (0, 0));
        drop(state);
        // Credit for a late start: up to one spacing, never more.
        let pacer = Pacer::new(300);
        let mut state = pacer.lock();
        let t0 = state.window.epoch + Duration::from_secs(1);
        let due = t0 + Duration::from_millis(10);
        state.grant(due + spacing - Duration::from_nanos(1), false, Some(due));
        assert_eq!(state.last_start, Some(due));
        state.grant(due + spacing * 3, false, Some(due + spacing));
        assert_eq!(state.last_start, Some(due + spacing * 2));
        state.grant(due + spacing * 4, false, None);
        assert_eq!(state.last_start, Some(due + spacing * 4));
        // Smooth pacing's tolerance is two intervals at a burst of 3.
        assert_eq!(state.rate.tolerance(), Duration::from_nanos(412_371_136));
    }

    #[test]
    fn the_window_falls_below_a_cap_when_enough_starts_left() {
        let mut window = Window::new();
        let t0 = window.epoch;
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        for ms in [0, 100, 200] {
            window.record(at(ms), false);
        }
        // Three starts: below 2 once the first two left (one remains),
        // below 3 once the first left, below 1 once all left.
        assert_eq!(window.below(2), at(100) + WINDOW);
        assert_eq!(window.below(3), at(0) + WINDOW);
        assert_eq!(window.below(1), at(200) + WINDOW);
        assert_eq!(window.below(0), at(200) + WINDOW);
    }

    #[test]
    fn capacity_and_recent_admissions_on_either_side() {
        let pacer = Pacer::new(300);
        let mut state = pacer.lock();
        let t0 = state.window.epoch;
        // Window pacing: 2 s at 60 s / 291 is 9 requests; 1 ms is still 1.
        assert_eq!(state.capacity_within(Duration::from_secs(2)), 9);
        assert_eq!(state.capacity_within(Duration::from_nanos(206_185_567 * 10 - 1)), 9);
        assert_eq!(state.capacity_within(Duration::from_nanos(206_185_567 * 10)), 10);
        assert_eq!(state.capacity_within(Duration::from_millis(1)), 1);
        // With 72 free starts in the window the spacing is 60 s / 219.
        for _ in 0..72 {
            state.grant(t0, true, None);
        }
        assert_eq!(state.capacity_within(Duration::from_secs(2)), 7);
        state.pacing = Pacing::Smooth;
        assert_eq!(state.capacity_within(Duration::from_nanos(206_185_568 * 10 - 1)), 9);
        assert_eq!(state.capacity_within(Duration::from_nanos(206_185_568 * 10)), 10);
        // Admissions count while younger than the horizon.
        state.recent_admissions.extend([t0, t0 + Duration::from_secs(1)]);
        let horizon = Duration::from_secs(2);
        assert_eq!(
            state.admissions_within(horizon, t0 + Duration::from_secs(2) - Duration::from_nanos(1)),
            2
        );
        assert_eq!(state.admissions_within(horizon, t0 + Duration::from_secs(2)), 1);
        assert_eq!(state.admissions_within(horizon, t0 + Duration::from_secs(3)), 0);
    }

    /// Callers that are not always waiting, like lifecycle loops between
    /// their transitions: each asks again a little after its last start, so
    /// the queue is often empty when the next start is due and a start
    /// comes late. The lateness up to one spacing is credited, so the
    /// settled minutes still hold the cap.
    #[tokio::test(start_paused = true)]
    async fn late_callers_still_settle_at_the_cap() {
        let pacer = Arc::new(Pacer::new(300));
        let start = Instant::now();
        let grants = Arc::new(Mutex::new(Vec::new()));
        let handles: Vec<_> = [350u64, 420]
            .into_iter()
            .map(|gap| {
                let (pacer, grants) = (pacer.clone(), grants.clone());
                tokio::spawn(async move {
                    loop {
                        pacer.acquire(Priority::InFlight).await;
                        grants.lock().unwrap().push(start.elapsed());
                        tokio::time::sleep(Duration::from_millis(gap)).await;
                    }
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_secs(300)).await;
        handles.iter().for_each(|h| h.abort());
        let mut times = grants.lock().unwrap().clone();
        times.sort();
        assert_eq!(max_in_any_window(&times, WINDOW), 291);
        let minutes = per_minute(&times, 5);
        assert!(minutes[2..].iter().all(|n| *n == 291), "{minutes:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_lone_lease_goes_at_network_speed() {
        let pacer = Pacer::new(300);
        let start = Instant::now();
        // The free share (72 starts: five lifecycles of 14 requests): no wait.
        for _ in 0..72 {
            pacer.acquire(Priority::InFlight).await;
        }
        assert_eq!(Instant::now(), start);
        pacer.lock().window.prune(Instant::now());
        assert_eq!(pacer.lock().window.starts, 72);
        // The free share is spent: the next start waits 60 s / (291 − 72).
        pacer.acquire(Priority::InFlight).await;
        // (Tokio's timer has millisecond resolution.)
        assert_eq!(Instant::now() - start, Duration::from_millis(274));
        // Once the free starts left the window, it is free again.
        tokio::time::sleep_until(start + WINDOW).await;
        pacer.lock().window.prune(Instant::now());
        assert_eq!(pacer.lock().window.starts, 1);
        let t = Instant::now();
        pacer.acquire(Priority::InFlight).await;
        assert_eq!(Instant::now(), t);
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_window_waits_for_its_oldest_start() {
        let pacer = Pacer::new(300);
        let t0 = Instant::now();
        {
            let mut state = pacer.lock();
            for _ in 0..200 {
                state.grant(t0, false, None);
            }
            state.grant(t0 + Duration::from_secs(1), false, None);
            for _ in 0..90 {
                state.grant(t0 + Duration::from_secs(2), false, None);
            }
            let now = t0 + Duration::from_secs(3);
            // 291 starts: full until the 200 of t0 leave.
            assert_eq!(state.earliest_start(now), (Some(t0 + WINDOW), false));
            // Then 91: spaced 206 ms after the last start (long past).
            let due = t0 + Duration::from_secs(2) + Duration::from_nanos(206_185_567);
            assert_eq!(state.earliest_start(t0 + WINDOW), (Some(due), false));
            state.grant(t0 + WINDOW, false, None);
            let next = t0 + WINDOW + Duration::from_nanos(206_185_567);
            assert_eq!(state.earliest_start(t0 + WINDOW), (Some(next), false));
            // Below the free share: free.
            assert_eq!(state.earliest_start(t0 + Duration::from_secs(62)), (None, true));
            assert_eq!(state.window.starts, 1);
        }
    }

    #[test]
    fn the_window_log_is_bounded_by_its_slots() {
        let mut window = Window::new();
        let t0 = window.epoch;
        // 100 starts every 10 ms for 60 s: 600,000 starts in 1,200 slots.
        for tick in 0..6_000u64 {
            for _ in 0..100 {
                window.record(t0 + Duration::from_millis(10 * tick), tick % 2 == 0);
            }
        }
        assert_eq!(window.slots.len(), 1_200);
        assert_eq!((window.starts, window.free), (600_000, 300_000));
        // A slot leaves the window 60 s after its latest start.
        window.prune(t0 + Duration::from_millis(60_039));
        assert_eq!(window.starts, 600_000);
        window.prune(t0 + Duration::from_millis(60_040));
        assert_eq!((window.slots.len(), window.starts, window.free), (1_199, 599_500, 299_700));
    }

    #[tokio::test(start_paused = true)]
    async fn smooth_bursts_after_idle_stay_within_the_window() {
        // Alternate idle periods and bursts; the limit holds in every window.
        for pacer in [smooth(300), Arc::new(Pacer::new(300))] {
            let start = Instant::now();
            let mut times = Vec::new();
            for round in 0..40u64 {
                for _ in 0..(round % 7) * 20 {
                    pacer.acquire(Priority::NewWork).await;
                    times.push(start.elapsed());
                }
                tokio::time::sleep(Duration::from_millis(round * 731 % 5000)).await;
            }
            assert!(max_in_any_window(&times, WINDOW) <= 293);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn falling_back_to_smooth_pacing() {
        let pacer = Pacer::new(300);
        assert_eq!(pacer.pacing(), Pacing::Window);
        let start = Instant::now();
        for _ in 0..10 {
            pacer.acquire(Priority::InFlight).await;
        }
        assert!(pacer.pace_smoothly());
        assert!(!pacer.pace_smoothly());
        assert_eq!(pacer.pacing(), Pacing::Smooth);
        // No burst credit: one interval after the last start, then the steady rate.
        pacer.acquire(Priority::InFlight).await;
        assert_eq!(Instant::now() - start, Duration::from_millis(207));
        pacer.acquire(Priority::InFlight).await;
        assert_eq!(Instant::now() - start, Duration::from_millis(413));
        // After an idle minute, a burst of three.
        tokio::time::sleep(WINDOW).await;
        let t = Instant::now();
        for _ in 0..3 {
            pacer.acquire(Priority::InFlight).await;
        }
        assert_eq!(Instant::now(), t);
        pacer.acquire(Priority::InFlight).await;
        assert_eq!(Instant::now() - t, Duration::from_millis(207));
        // A fresh pacer that never started anything has its full burst.
        let fresh = Pacer::new(300);
        assert!(fresh.pace_smoothly());
        let t = Instant::now();
        for _ in 0..3 {
            fresh.acquire(Priority::InFlight).await;
        }
        assert_eq!(Instant::now(), t);
    }

    #[tokio::test(start_paused = true)]
    async fn priority_then_fifo() {
        for pacer in [smooth(60), Arc::new(Pacer::new(60))] {
            // Spend the burst (1) or the free share (14).
            let free = if pacer.pacing() == Pacing::Smooth { 1 } else { 14 };
            for _ in 0..free {
                pacer.acquire(Priority::NewWork).await;
            }
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
    }

    #[tokio::test(start_paused = true)]
    async fn cancelled_waiters_release_their_place() {
        let pacer = smooth(60);
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
        assert_eq!(pacer.lock().queue.len(), 1);
        let granted = last.await.unwrap();
        // Served at the first free slot (one second at 60/min, 97 %), as if
        // the others never existed.
        assert_eq!(granted - start, Duration::from_millis(1_031));
        assert_eq!(pacer.lock().queue.len(), 0);
        // A future dropped before it is ever polled leaves no trace either.
        drop(pacer.acquire(Priority::Cleanup));
        assert_eq!(pacer.lock().queue.len(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn retry_after_delays_every_waiter() {
        for pacer in [smooth(300), Arc::new(Pacer::new(300))] {
            let start = Instant::now();
            pacer.pause_until(start + Duration::from_secs(10));
            // A shorter pause never shortens the longer one.
            pacer.pause_until(start + Duration::from_secs(1));
            assert_eq!(pacer.paused_until(), Some(start + Duration::from_secs(10)));
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
                assert_eq!(h.await.unwrap() - start, Duration::from_secs(10));
            }
        }
    }

    const HORIZON: Duration = Duration::from_secs(2);

    #[tokio::test(start_paused = true)]
    async fn admission_follows_the_backlog() {
        let pacer = smooth(300);
        for _ in 0..3 {
            pacer.acquire(Priority::InFlight).await; // spend the burst
        }
        // A backlog of 9 waiting requests (2 s of the budget) blocks admission.
        let waiters: Vec<_> = (0..9)
            .map(|_| {
                let p = pacer.clone();
                tokio::spawn(async move { p.acquire(Priority::InFlight).await })
            })
            .collect();
        until_waiting(&pacer, 9).await;
        let start = Instant::now();
        let admission = pacer.admit_new_work(HORIZON).await;
        // One request had to start before new work was admitted.
        assert_eq!(Instant::now() - start, Duration::from_millis(207));
        assert_eq!(pacer.lock().queue.len(), 8);
        // The guard and the recent admission count: two more starts.
        let t1 = Instant::now();
        let second = pacer.admit_new_work(HORIZON).await;
        assert_eq!(Instant::now() - t1, Duration::from_millis(412));
        drop(admission);
        drop(second);
        for w in waiters {
            w.await.unwrap();
        }
        // Idle: admission is immediate; a cancelled admission frees its place.
        tokio::time::sleep(HORIZON).await;
        drop(pacer.admit_new_work(HORIZON));
        let t2 = Instant::now();
        let _a = pacer.admit_new_work(HORIZON).await;
        assert_eq!(Instant::now(), t2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_crowd_is_admitted_at_the_sustained_rate() {
        // Window pacing at 300/min: 2 s of the sustained rate is 9 requests.
        // Nothing waits (the free share serves requests at once), yet a
        // crowd holding its admissions counts: 5 outstanding and the 4
        // granted while others were outstanding make 9, and the sixth waits
        // until those leave the horizon.
        let pacer = Arc::new(Pacer::new(300));
        let start = Instant::now();
        let crowd: Vec<_> = {
            let mut crowd = Vec::new();
            for _ in 0..5 {
                crowd.push(pacer.admit_new_work(HORIZON).await);
            }
            crowd
        };
        assert_eq!(Instant::now(), start);
        let sixth = tokio::spawn({
            let p = pacer.clone();
            async move {
                let _admission = p.admit_new_work(HORIZON).await;
                Instant::now()
            }
        });
        assert_eq!(sixth.await.unwrap() - start, HORIZON);
        drop(crowd);
        // A lone lease's admissions, one after the other, never wait.
        let t = Instant::now();
        for _ in 0..20 {
            drop(pacer.admit_new_work(HORIZON).await);
        }
        assert_eq!(Instant::now(), t);
        // Free starts still in the window slow the sustained rate: 2 s of
        // 60 s / (291 − 72) is 7 requests, so 4 outstanding and 3 recent.
        for _ in 0..72 {
            pacer.acquire(Priority::InFlight).await;
        }
        let t = Instant::now();
        let mut crowd = Vec::new();
        for _ in 0..4 {
            crowd.push(pacer.admit_new_work(HORIZON).await);
        }
        assert_eq!(Instant::now(), t);
        drop(pacer.admit_new_work(HORIZON).await);
        assert_eq!(Instant::now() - t, HORIZON);
    }

    #[tokio::test(start_paused = true)]
    async fn a_share_scales_the_cap_without_free_starts() {
        // A quarter of 300/min: cap 72 (of 291), no free starts, spaced
        // 60 s / 72 = 833.3 ms from the first start on.
        let rate = Rate::for_share(300, 250_000);
        assert_eq!((rate.cap, rate.free, rate.burst), (72, 0, 1));
        assert_eq!(rate.interval, Duration::from_nanos(824_742_269));
        assert_eq!(Rate::for_share(300, 1), Rate { cap: 1, ..Rate::for_share(300, 1) });
        assert_eq!(Rate::for_share(300, FULL_SHARE), Rate::for_limit(300));
        let pacer = Pacer::new(300);
        pacer.grant_share(250_000);
        assert_eq!(pacer.share(), 250_000);
        let start = Instant::now();
        for _ in 0..3 {
            pacer.acquire(Priority::InFlight).await;
        }
        assert_eq!(Instant::now() - start, Duration::from_millis(1_667));
        // Sustained: 72 starts in each minute after the first.
        let mut times = Vec::new();
        for _ in 0..72 * 4 {
            pacer.acquire(Priority::InFlight).await;
            times.push(start.elapsed());
        }
        assert!(max_in_any_window(&times, WINDOW) <= 72);
    }

    #[tokio::test(start_paused = true)]
    async fn a_lower_share_waits_until_the_window_holds_less() {
        let pacer = Pacer::new(300);
        let t0 = Instant::now();
        {
            let mut state = pacer.lock();
            for _ in 0..100 {
                state.grant(t0, false, None);
            }
            for _ in 0..60 {
                state.grant(t0 + Duration::from_secs(30), false, None);
            }
        }
        // 160 starts in the window, a third of the budget granted: cap 96.
        pacer.grant_share(333_333);
        assert_eq!(pacer.rate().cap, 96);
        let mut state = pacer.lock();
        let now = t0 + Duration::from_secs(31);
        // Nothing starts until the 100 of t0 leave (60 remain, below 96).
        assert_eq!(state.earliest_start(now), (Some(t0 + WINDOW), false));
        let (at, free) = state.earliest_start(t0 + WINDOW);
        assert!(!free && at.is_some_and(|at| at <= t0 + WINDOW));
    }

    #[tokio::test(start_paused = true)]
    async fn a_higher_share_applies_one_window_later() {
        let pacer = Pacer::new(300);
        let t0 = Instant::now();
        pacer.grant_share(250_000);
        pacer.grant_share(500_000);
        // Still a quarter; granting the same raise again keeps its time.
        assert_eq!((pacer.share(), pacer.rate().cap), (250_000, 72));
        tokio::time::sleep(Duration::from_secs(30)).await;
        pacer.grant_share(500_000);
        tokio::time::sleep_until(t0 + WINDOW - Duration::from_millis(1)).await;
        assert_eq!(pacer.share(), 250_000);
        tokio::time::sleep_until(t0 + WINDOW).await;
        assert_eq!((pacer.share(), pacer.rate().cap), (500_000, 145));
        // A lower share cancels a pending raise and applies at once.
        pacer.grant_share(FULL_SHARE);
        pacer.grant_share(200_000);
        assert_eq!((pacer.share(), pacer.rate().cap), (200_000, 58));
        tokio::time::sleep(WINDOW).await;
        assert_eq!(pacer.share(), 200_000);
    }

    /// An admission waiter cancelled while it waits leaves the admission
    /// queue at once: the waiter behind it is admitted when the budget
    /// allows (here when the crowd's recent admissions leave the 2 s
    /// horizon), not held behind a place nobody will take.
    #[tokio::test(start_paused = true)]
    async fn a_cancelled_admission_waiter_releases_its_place() {
        let pacer = Arc::new(Pacer::new(300));
        let start = Instant::now();
        // 5 outstanding and 4 recent admissions fill 2 s at 60 s / 291.
        let mut crowd = Vec::new();
        for _ in 0..5 {
            crowd.push(pacer.admit_new_work(HORIZON).await);
        }
        let waiter = |p: Arc<Pacer>| async move {
            let _admission = p.admit_new_work(HORIZON).await;
            Instant::now()
        };
        let first = tokio::spawn(waiter(pacer.clone()));
        while pacer.lock().admissions.len() != 1 {
            yield_now().await;
        }
        let second = tokio::spawn(waiter(pacer.clone()));
        while pacer.lock().admissions.len() != 2 {
            yield_now().await;
        }
        first.abort();
        assert!(first.await.unwrap_err().is_cancelled());
        assert_eq!(pacer.lock().admissions.len(), 1);
        let admitted = tokio::time::timeout(WINDOW, second)
            .await
            .expect("the waiter behind a cancelled one is admitted")
            .unwrap();
        assert_eq!(admitted - start, HORIZON);
        drop(crowd);
    }

    /// After the limit is lowered (600 to 300 requests a minute) the window
    /// may hold more than the new cap: it is full until it holds fewer than
    /// 291, here when the 291 starts of the second slot leave too.
    #[test]
    fn a_window_over_a_lowered_cap_waits_for_enough_starts_to_leave() {
        let mut window = Window::new();
        let t0 = window.epoch;
        let t1 = t0 + Duration::from_secs(1);
        for _ in 0..100 {
            window.record(t0, false);
        }
        for _ in 0..291 {
            window.record(t1, false);
        }
        assert_eq!(window.below(291), t1 + WINDOW);
        assert_eq!(window.below(292), t0 + WINDOW);
    }

    /// A 429's pause that is over does not change what a start is: the
    /// free share after it is still free, and the start after the free
    /// share waits 60 s / (291 − 72) (274 ms), as for a lone lease.
    #[tokio::test(start_paused = true)]
    async fn starts_after_a_pause_are_still_free() {
        let pacer = Pacer::new(300);
        let resumed = Instant::now() + Duration::from_secs(1);
        pacer.pause_until(resumed);
        tokio::time::sleep_until(resumed).await;
        for _ in 0..72 {
            pacer.acquire(Priority::InFlight).await;
        }
        assert_eq!(Instant::now(), resumed);
        pacer.acquire(Priority::InFlight).await;
        assert_eq!(Instant::now() - resumed, Duration::from_millis(274));
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
