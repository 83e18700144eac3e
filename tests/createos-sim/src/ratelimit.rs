//! Per-client-IP rate limiting: an exact sliding log or a token bucket
//! (see [`Algorithm`]).

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::config::{Algorithm, RateLimit};

/// A request is accepted if the client's [`Counter`] has room, and then
/// counted; a refused request is not counted.
#[derive(Debug)]
pub(crate) struct RateLimiter {
    inner: Mutex<State>,
}

#[derive(Debug)]
struct State {
    limit: Option<RateLimit>,
    clients: HashMap<IpAddr, Counter>,
}

/// One client's count.
#[derive(Debug)]
enum Counter {
    /// Accepted requests of the last window, oldest first.
    Log(VecDeque<Instant>),
    /// Tokens left (fractional) at `at`.
    Bucket { tokens: f64, at: Instant },
}

impl Counter {
    fn new(limit: &RateLimit, now: Instant) -> Counter {
        match limit.algorithm {
            Algorithm::SlidingWindow => Counter::Log(VecDeque::new()),
            Algorithm::TokenBucket { burst } => Counter::Bucket { tokens: f64::from(burst), at: now },
        }
    }

    /// `Ok(())` if accepted (and counted), else the wait until a request
    /// would be.
    fn take(&mut self, limit: &RateLimit, now: Instant) -> Result<(), Duration> {
        match (self, limit.algorithm) {
            (Counter::Log(log), _) => {
                while log.front().is_some_and(|front| now.duration_since(*front) >= limit.window) {
                    log.pop_front();
                }
                if (log.len() as u64) < u64::from(limit.requests) {
                    log.push_back(now);
                    return Ok(());
                }
                // Acceptable when the oldest entry that keeps the log full
                // leaves the window.
                let idx = log.len() - limit.requests as usize;
                Err(log.get(idx).map_or(limit.window, |t| (*t + limit.window).saturating_duration_since(now)))
            }
            (Counter::Bucket { tokens, at }, Algorithm::TokenBucket { burst }) => {
                let per_second = f64::from(limit.requests) / limit.window.as_secs_f64();
                let refilled = *tokens + now.saturating_duration_since(*at).as_secs_f64() * per_second;
                *tokens = refilled.min(f64::from(burst));
                *at = now;
                if *tokens >= 1.0 {
                    *tokens -= 1.0;
                    return Ok(());
                }
                Err(Duration::from_secs_f64((1.0 - *tokens) / per_second))
            }
            (Counter::Bucket { .. }, Algorithm::SlidingWindow) => unreachable!("counters follow the limit"),
        }
    }
}

impl RateLimiter {
    pub(crate) fn new(limit: Option<RateLimit>) -> Self {
        RateLimiter { inner: Mutex::new(State { limit, clients: HashMap::new() }) }
    }

    /// Replace the limit and forget the history.
    pub(crate) fn set(&self, limit: Option<RateLimit>) {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        g.limit = limit;
        g.clients.clear();
    }

    /// `Ok(())` if accepted (and counted), else `Err(retry_after_secs)`.
    pub(crate) fn check(&self, ip: IpAddr) -> Result<(), u64> {
        self.check_at(ip, Instant::now())
    }

    fn check_at(&self, ip: IpAddr, now: Instant) -> Result<(), u64> {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let Some(limit) = g.limit else {
            return Ok(());
        };
        let counter = g.clients.entry(ip).or_insert_with(|| Counter::new(&limit, now));
        counter.take(&limit, now).map_err(|wait| ceil_secs(wait).max(1))
    }
}

fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    const IP: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

    #[test]
    fn sliding_window_is_exact() {
        let rl = RateLimiter::new(Some(RateLimit::sliding_window(3, Duration::from_secs(10))));
        let t0 = Instant::now();
        for i in 0..3 {
            assert!(rl.check_at(IP, t0 + Duration::from_secs(i)).is_ok());
        }
        assert_eq!(rl.check_at(IP, t0 + Duration::from_millis(3500)), Err(7));
        // first entry leaves at t0+10
        assert!(rl.check_at(IP, t0 + Duration::from_secs(10)).is_ok());
        assert!(rl.check_at(IP, t0 + Duration::from_secs(10)).is_err());
        rl.set(None);
        assert!(rl.check_at(IP, t0).is_ok());
    }

    #[test]
    fn token_bucket_allows_its_burst_then_its_rate() {
        // 300 a minute (5 a second), burst 5.
        let rl = RateLimiter::new(Some(RateLimit::createos_token_bucket()));
        let t0 = Instant::now();
        for _ in 0..5 {
            assert_eq!(rl.check_at(IP, t0), Ok(()));
        }
        // Empty: the next token comes in 200 ms, rounded up to a second.
        assert_eq!(rl.check_at(IP, t0), Err(1));
        assert_eq!(rl.check_at(IP, t0 + Duration::from_millis(199)), Err(1));
        assert_eq!(rl.check_at(IP, t0 + Duration::from_millis(200)), Ok(()));
        // A refusal takes nothing: a token every 200 ms, no more.
        for i in 2..=50u64 {
            assert_eq!(rl.check_at(IP, t0 + Duration::from_millis(200 * i)), Ok(()), "{i}");
            assert_eq!(rl.check_at(IP, t0 + Duration::from_millis(200 * i)), Err(1), "{i}");
        }
        // Idle for a minute refills the burst, no more.
        let t1 = t0 + Duration::from_secs(70);
        for _ in 0..5 {
            assert_eq!(rl.check_at(IP, t1), Ok(()));
        }
        assert_eq!(rl.check_at(IP, t1), Err(1));
        // Where a sliding window of 300 a minute would accept 300 at once.
        let window = RateLimiter::new(Some(RateLimit::createos_default()));
        assert!((0..300).all(|_| window.check_at(IP, t0).is_ok()));
        assert_eq!(window.check_at(IP, t0), Err(60));
    }
}
