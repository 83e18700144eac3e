//! A lease the provider returned that has not reached the host's caller yet.
//!
//! Between a creating hook's return and the caller receiving the lease, the
//! host awaits the lease's `active` record. Should the caller drop the
//! host's future there, or that record fail, nobody holds the lease: the
//! guard destroys it, waiting on the dropping thread (`Drop` cannot await),
//! and records the outcome on the lease's row after the `active` record:
//! `destroyed`, or `cleanup_failed` (which `sweep` destroys) when the
//! destroy failed.

use crate::{
    host::Host,
    hosted::HookSupport,
    store::LeaseState,
    store::{LeaseStore, Write},
};
use provider_abi::{Hook, LeaseParams};

/// Destroys its lease when dropped before [`Unclaimed::handed_over`].
pub(crate) struct Unclaimed<'a> {
    provider: &'a dyn HookSupport,
    ledger: &'a dyn LeaseStore,
    row: i64,
    lease: Option<LeaseParams>,
}

impl<'a> Unclaimed<'a> {
    /// Guards the lease of `params`, recorded on `host`'s ledger row `row`.
    pub(crate) fn new(host: &Host<'a>, row: i64, params: LeaseParams) -> Self {
        Unclaimed { provider: host.provider, ledger: host.ledger, row, lease: Some(params) }
    }

    /// The lease reached its caller: nothing to destroy.
    pub(crate) fn handed_over(mut self) {
        self.lease = None;
    }
}

impl Drop for Unclaimed<'_> {
    fn drop(&mut self) {
        let Some(params) = self.lease.take() else { return };
        let id = params.provider_lease_id.as_ref().map(|id| id.to_string()).into_option();
        let hook = Hook::DestroyLease.name().to_owned();
        let (state, error) = match pollster::block_on(self.provider.destroy_lease(params)) {
            Ok(()) => {
                tracing::warn!(lease = ?id, "destroyed a lease acquired for a caller that stopped waiting");
                (LeaseState::Destroyed, None)
            }
            Err(error) => {
                tracing::warn!(
                    lease = ?id,
                    kind = %error.kind,
                    "a lease acquired for a caller that stopped waiting is left running; `sweep` destroys it"
                );
                (LeaseState::CleanupFailed, Some(error))
            }
        };
        // Submitted after the `active` record, so committed after it.
        self.ledger.submit(Write::SetState { row: self.row, state, hook, error }, Box::new(drop));
    }
}
