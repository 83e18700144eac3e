use std::time::{Duration, Instant};

use createos_sim::RateLimit;

use crate::common::*;

#[test]
fn sliding_window_429_with_retry_after() {
    let _g = shared();
    let mut cfg = fast_config();
    cfg.rate_limit = Some(RateLimit::sliding_window(20, Duration::from_secs(2)));
    let api = Api::start(cfg);
    let start = Instant::now();
    for _ in 0..20 {
        assert_eq!(api.get("/sandboxes/none").0, 404);
    }
    let r = api.req(reqwest::Method::GET, "/sandboxes/none").send().unwrap();
    assert_eq!(r.status().as_u16(), 429);
    let retry: u64 = r.headers()["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=2).contains(&retry), "{retry}");
    // accepted again once the window slides past the first request
    assert!(wait_until(Duration::from_secs(5), || api.get("/sandboxes/none").0 == 404));
    assert!(start.elapsed() >= Duration::from_millis(1900));
    assert!(api.sim.ledger().count_status(429) >= 1);
    api.sim.set_rate_limit(None);
    for _ in 0..40 {
        assert_eq!(api.get("/sandboxes/none").0, 404);
    }
}

#[test]
fn token_bucket_429_after_its_burst() {
    let _g = shared();
    let mut cfg = fast_config();
    cfg.rate_limit = Some(RateLimit::token_bucket(60, Duration::from_secs(60), 3));
    let api = Api::start(cfg);
    for _ in 0..3 {
        assert_eq!(api.get("/sandboxes/none").0, 404);
    }
    // One a second after the burst: far below a sliding window's 60.
    let r = api.req(reqwest::Method::GET, "/sandboxes/none").send().unwrap();
    assert_eq!(r.status().as_u16(), 429);
    assert_eq!(r.headers()["retry-after"].to_str().unwrap(), "1");
    assert!(wait_until(Duration::from_secs(5), || api.get("/sandboxes/none").0 == 404));
}
