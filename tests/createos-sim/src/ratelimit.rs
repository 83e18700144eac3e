//! Exact sliding-log rate limiter, per client IP.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::config::RateLimit;

/// Sliding-log limiter: a request is accepted if fewer than `requests`
/// requests were accepted from the same IP in the last `window`.
#[derive(Debug)]
pub(crate) struct RateLimiter {
    inner: Mutex<State>,
}

#[derive(Debug)]
struct State {
    limit: Option<RateLimit>,
    logs: HashMap<IpAddr, VecDeque<Instant>>,
}

impl RateLimiter {
    pub(crate) fn new(limit: Option<RateLimit>) -> Self {
        RateLimiter { inner: Mutex::new(State { limit, logs: HashMap::new() }) }
    }

    /// Replace the limit and forget the history.
    pub(crate) fn set(&self, limit: Option<RateLimit>) {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        g.limit = limit;
        g.logs.clear();
    }

    /// `Ok(())` if accepted (and logged), else `Err(retry_after_secs)`.
    pub(crate) fn check(&self, ip: IpAddr) -> Result<(), u64> {
        self.check_at(ip, Instant::now())
    }

    fn check_at(&self, ip: IpAddr, now: Instant) -> Result<(), u64> {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let Some(limit) = g.limit else {
            return Ok(());
        };
        let log = g.logs.entry(ip).or_default();
        while let Some(&front) = log.front() {
            if now.duration_since(front) >= limit.window {
                log.pop_front();
            } else {
                break;
            }
        }
        if (log.len() as u64) < u64::from(limit.requests) {
            log.push_back(now);
            return Ok(());
        }
        // The request becomes acceptable when the oldest entry that keeps the
        // log full leaves the window.
        let idx = log.len() - limit.requests as usize;
        let wait = match log.get(idx) {
            Some(&t) => (t + limit.window).saturating_duration_since(now),
            None => limit.window,
        };
        Err(ceil_secs(wait).max(1))
    }
}

fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    #[test]
    fn sliding_window_is_exact() {
        let rl = RateLimiter::new(Some(RateLimit { requests: 3, window: Duration::from_secs(10) }));
        let ip = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let t0 = Instant::now();
        for i in 0..3 {
            assert!(rl.check_at(ip, t0 + Duration::from_secs(i)).is_ok());
        }
        assert_eq!(rl.check_at(ip, t0 + Duration::from_millis(3500)), Err(7));
        // first entry leaves at t0+10
        assert!(rl.check_at(ip, t0 + Duration::from_secs(10)).is_ok());
        assert!(rl.check_at(ip, t0 + Duration::from_secs(10)).is_err());
        rl.set(None);
        assert!(rl.check_at(ip, t0).is_ok());
    }
}
