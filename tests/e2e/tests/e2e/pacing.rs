//! The request budget against the simulator's two rate limiters: the
//! provider paces by CreateOS's 60 s window (a lone lease's requests go
//! back to back), and when the server's limiter turns out to be a token
//! bucket it honours the 429's `Retry-After` and paces smoothly from then on.

use crate::support::Bed;
use createos_sim::{Ledger, RateLimit, SimConfig};
use provider_abi::{Lease, Provider};
use provider_host::wait;
use serde_json::{json, Value};
use std::time::Duration;

fn bed(limit: RateLimit) -> (Bed, Value) {
    let bed = Bed::with(SimConfig { rate_limit: Some(limit), ..SimConfig::default() });
    let config = bed.config(json!({"requestsPerMinute": 300, "reuseLease": true, "timeoutMs": 20_000}));
    (bed, config)
}

/// Acquire, (execute,) release, resume, (execute,) destroy.
fn lifecycle(bed: &Bed, config: &Value, execute: bool) {
    let lease: Lease = bed.acquire(config);
    let params = bed.lease_params(config, &lease);
    let run = || {
        if execute {
            let (result, _) = bed.execute(&bed.command(config, &lease, "/bin/echo", &["hello"]));
            assert_eq!(result.unwrap().stdout, "hello\n");
        }
    };
    run();
    wait(bed.provider.release_lease(params.clone())).unwrap();
    assert!(!wait(bed.provider.resume_lease(params.clone())).unwrap().expired);
    run();
    wait(bed.provider.destroy_lease(params.clone())).unwrap();
}

/// Every request that arrived after a 429 arrived at least `retry_after`
/// after it (a lone lease sends one request at a time).
fn assert_honoured(ledger: &Ledger, retry_after: Duration) {
    for (i, refused) in ledger.requests.iter().enumerate().filter(|(_, r)| r.status == 429) {
        for later in &ledger.requests[i + 1..] {
            let after = later.received_at - refused.received_at;
            assert!(after >= retry_after, "{} {} {after:?} after a 429", later.method, later.path);
        }
    }
}

#[test]
fn lone_lifecycles_under_a_sliding_window_are_never_refused() {
    let (bed, config) = bed(RateLimit::createos_default());
    for _ in 0..3 {
        lifecycle(&bed, &config, true);
    }
    let ledger = bed.ledger();
    assert_eq!(ledger.count_status(429), 0);
    assert!(ledger.leaked().is_empty());
}

#[test]
fn a_token_bucket_limiter_makes_the_provider_pace_smoothly() {
    // 300 a minute, burst 5: a token every 200 ms, so `Retry-After: 1`.
    let (bed, config) = bed(RateLimit::createos_token_bucket());
    // Window pacing sends a lone lifecycle's requests back to back: the
    // bucket runs dry and refuses one. (No command in this one: a refused
    // process creation is reported to the caller, never sent again.)
    lifecycle(&bed, &config, false);
    let first = bed.ledger();
    let refused = first.count_status(429);
    assert!((1..=2).contains(&refused), "{refused} refusals");
    assert_honoured(&first, Duration::from_secs(1));
    // From then on the provider paces smoothly (at most 3 back to back,
    // then one every 206 ms, under the bucket's 5 and 200 ms): no more 429.
    for _ in 0..2 {
        lifecycle(&bed, &config, true);
    }
    let ledger = bed.ledger();
    assert_eq!(ledger.count_status(429), refused, "refused only before the fallback");
    assert!(ledger.leaked().is_empty());
}
