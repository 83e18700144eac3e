//! What a newly active provider version must learn from the host: the
//! leases whose cleanup is unconfirmed. The version that marked them knew
//! it only in memory; the lease store knows it durably, so the host hands
//! each such lease to the new version (`import_unconfirmed`) before
//! it takes its first call, and the new version itself refuses to reuse them.

use crate::{
    hosted::HookSupport,
    secrets::SecretFields,
    store::LeaseStore,
    store::{LeaseState, LedgerError},
    sweep::SweepSecrets,
};
use provider_abi::{Hook, LeaseParams};

/// The leases `store` records as unconfirmed, as the parameters of a hook
/// acting on each: its own environment and stored configuration, with the
/// secrets of `secrets` lent to rows of the same account.
pub fn unconfirmed_leases(
    store: &dyn LeaseStore,
    provider: &dyn HookSupport,
    secrets: &SweepSecrets,
) -> Result<Vec<LeaseParams>, LedgerError> {
    let fields = SecretFields::of(&provider.manifest());
    let leases = store.in_state(LeaseState::Unconfirmed)?.into_iter().map(|record| {
        let env = secrets.environment(&fields, &record).params(&record.env.driver_key);
        LeaseParams::new(env, record.run_id.as_str(), &record.lease())
    });
    Ok(leases.collect())
}

/// Hands `lease` to `provider` as unconfirmed (`import_unconfirmed`), so it
/// itself refuses to reuse it; true when it took it. A provider without the
/// hook takes nothing; a refusal is logged with the version that refused
/// (the new one at a swap; a set's active one).
pub(crate) fn hand_over(provider: &dyn HookSupport, lease: &LeaseParams) -> bool {
    if !provider.supports(Hook::ImportUnconfirmed) {
        return false;
    }
    let taken = provider.import_unconfirmed(lease).inspect_err(|error| {
        let id = lease.provider_lease_id.as_ref().map(|id| id.to_string());
        let version = provider.manifest().version;
        tracing::warn!(%version, lease = ?id, kind = %error.kind, "the version answering new calls did not take an unconfirmed lease");
    });
    taken.is_ok()
}
