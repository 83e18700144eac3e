//! A lease the provider returned that has not reached the host's caller yet.
//!
//! Between a creating hook's return and the caller receiving the lease, the
//! host awaits the lease's `active` record. Should the caller drop the
//! host's future there, or that record fail, nobody holds the lease: the
//! guard destroys it, waiting on the dropping thread (`Drop` cannot await). Its row stays `acquiring` with the lease id, which
//! `sweep` resolves by asking the provider whether the lease still exists.

use crate::hosted::HookSupport;
use provider_abi::LeaseParams;

/// Destroys its lease when dropped before [`Unclaimed::handed_over`].
pub(crate) struct Unclaimed<'a> {
    provider: &'a dyn HookSupport,
    lease: Option<LeaseParams>,
}

impl<'a> Unclaimed<'a> {
    /// Guards the lease of `params`.
    pub(crate) fn new(provider: &'a dyn HookSupport, params: LeaseParams) -> Self {
        Unclaimed { provider, lease: Some(params) }
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
        match pollster::block_on(self.provider.destroy_lease(params)) {
            Ok(()) => {
                tracing::warn!(lease = ?id, "destroyed a lease acquired for a caller that stopped waiting")
            }
            Err(error) => tracing::warn!(
                lease = ?id,
                kind = %error.kind,
                "a lease acquired for a caller that stopped waiting is left running; `sweep` destroys it"
            ),
        }
    }
}
