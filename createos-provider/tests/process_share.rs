//! The share of the request budget granted to the whole process
//! (`grant_share_to_all`, what the `grant_request_share` hook calls). It is
//! state every pacer of the process sees, so it has a test binary of its own:
//! one process, one test, no other pacer test disturbed or disturbing.

use createos_provider::pacer::{grant_share_to_all, key_fingerprint, Pacer, Rate, FULL_SHARE};

#[test]
fn a_share_granted_to_the_process_reaches_every_shared_budget_now_and_later() {
    let key = key_fingerprint("process-share-test-key");
    let existing = Pacer::shared("http://existing.invalid", key, 600);
    let private = Pacer::new(600);
    assert_eq!(existing.share(), FULL_SHARE);

    grant_share_to_all(250_000);
    assert_eq!(existing.share(), 250_000, "a budget that existed before the grant");
    assert_eq!(existing.rate(), Rate::for_share(600, 250_000));
    let later = Pacer::shared("http://later.invalid", key, 600);
    assert_eq!(later.share(), 250_000, "a budget created after the grant");
    assert_eq!(private.share(), FULL_SHARE, "an unshared budget is not the process's");

    // Out-of-range shares are clamped, for the existing budgets and the next.
    grant_share_to_all(0);
    assert_eq!(existing.share(), 1);
    grant_share_to_all(FULL_SHARE * 3);
    let after_raise = Pacer::shared("http://after-raise.invalid", key, 600);
    assert_eq!(after_raise.share(), FULL_SHARE);
    // A raise reaches an existing budget only a window later.
    assert_eq!(existing.share(), 1);
}
