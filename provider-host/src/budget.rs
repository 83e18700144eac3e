//! One request budget for every host that shares a ledger.
//!
//! The provider paces itself against its own budget (CreateOS:
//! `requestsPerMinute` per account and caller); the host grants it a share
//! of that budget through `grant_request_share`, never reading the
//! provider's configuration. The share of a host is `1 / n`, `n` the live
//! hosts of its group ([`LeaseStore::budget_group`]: the processes that
//! opened one SQLite ledger, or the hosts of one machine in a PostgreSQL
//! fleet), read again every [`SHARE_INTERVAL`] and granted again.
//!
//! A host joining a group counts itself from the start, so it never takes
//! more than its fair share; the others lower theirs within one interval.
//! Until then the group may spend up to `1 / n` of one budget per interval
//! more than the budget's rate, which the provider's own margin absorbs
//! (CreateOS: 9 of 300 requests a minute, against at most 2.5 a second for
//! a second host). A provider that lacks the hook keeps its whole budget:
//! split its own limit by hand between the hosts of a group.

use crate::{hosted::HookSupport, store::LeaseStore};
use provider_abi::Hook;
use std::{
    sync::mpsc::{Receiver, RecvTimeoutError},
    time::Duration,
};

/// The whole budget, in parts per million.
pub const FULL_SHARE: u32 = 1_000_000;

/// How often a long run reads its group again and grants the share.
pub const SHARE_INTERVAL: Duration = Duration::from_secs(1);

/// The share (parts per million) of one host among `hosts` live ones.
pub fn share_of(hosts: usize) -> u32 {
    FULL_SHARE / u32::try_from(hosts.max(1)).unwrap_or(u32::MAX)
}

/// The shares a run granted (parts per million).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Granted {
    /// The share granted before the run's first request.
    pub first: u32,
    /// The lowest share granted.
    pub lowest: u32,
    /// The last share granted.
    pub last: u32,
}

/// Reads the group of `store`'s host and grants `provider` its share now.
/// `None` when the provider lacks the hook (it keeps its whole budget) or
/// the share could not be read or granted (logged; the last grant stands).
pub fn grant(provider: &dyn HookSupport, store: &dyn LeaseStore) -> Option<u32> {
    if !provider.supports(Hook::GrantRequestShare) {
        return None;
    }
    let hosts = store
        .budget_group()
        .inspect_err(|error| tracing::warn!(%error, "cannot count the hosts sharing the request budget"))
        .ok()?;
    let share = share_of(hosts);
    if let Err(error) = provider.grant_request_share(share) {
        tracing::warn!(kind = %error.kind, "the provider did not take its request share");
        return None;
    }
    tracing::debug!(hosts, share, "request share granted");
    Some(share)
}

/// Grants the share once, then again every [`SHARE_INTERVAL`] until `stop`
/// receives or its sender is dropped; returns what was granted (`None`: the
/// provider lacks the hook).
pub fn keep_granting(
    provider: &dyn HookSupport,
    store: &dyn LeaseStore,
    first: Option<u32>,
    stop: &Receiver<()>,
) -> Option<Granted> {
    let start = |share| Granted { first: share, lowest: share, last: share };
    let mut granted = first.map(start);
    while let Err(RecvTimeoutError::Timeout) = stop.recv_timeout(SHARE_INTERVAL) {
        if let Some(share) = grant(provider, store) {
            let granted = granted.get_or_insert_with(|| start(share));
            (granted.lowest, granted.last) = (granted.lowest.min(share), share);
        }
    }
    granted
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_split_the_budget_evenly() {
        assert_eq!(share_of(0), 1_000_000);
        assert_eq!(share_of(1), 1_000_000);
        assert_eq!(share_of(2), 500_000);
        assert_eq!(share_of(3), 333_333);
        assert_eq!(share_of(4), 250_000);
    }
}
