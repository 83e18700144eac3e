//! Where the host records leases: the operations its policy needs, never
//! SQL. [`Ledger`] (SQLite) is the embedded implementation; a fleet's
//! database implements the same trait.

use crate::ledger::{LeaseEnv, LeaseRecord, LeaseState, Ledger, LedgerError, Owner};
use provider_abi::{Lease, ProviderError};

/// A durable record of leases. Every write is durable before it returns: the
/// host writes ahead of each hook, so a crash leaves a row saying what might
/// still exist remotely.
pub trait LeaseStore: Send + Sync {
    /// The process this store records as the owner of the rows it writes.
    fn pid(&self) -> u32;

    /// Records a lease about to be acquired (state `acquiring`, no id yet)
    /// and returns its row id.
    fn begin(&self, owner: Owner, run_id: &str, env: &LeaseEnv, hook: &str) -> Result<i64, LedgerError>;

    /// Records that `hook` is about to be called, or has returned, leaving the
    /// lease in `state`; `error` replaces the last error (`None` clears it).
    fn set_state(
        &self,
        row: i64,
        state: LeaseState,
        hook: &str,
        error: Option<&ProviderError>,
    ) -> Result<(), LedgerError>;

    /// Records the lease the provider returned (its id and metadata), in `state`.
    fn set_lease(&self, row: i64, state: LeaseState, hook: &str, lease: &Lease) -> Result<(), LedgerError>;

    /// Removes a row: a lease the provider refused before any request.
    fn forget(&self, row: i64) -> Result<(), LedgerError>;

    /// Takes over a row for this process.
    fn adopt(&self, row: i64) -> Result<(), LedgerError>;

    /// One row.
    fn get(&self, row: i64) -> Result<Option<LeaseRecord>, LedgerError>;

    /// The latest row recording `provider_lease_id` for this company and environment.
    fn find(
        &self,
        provider_lease_id: &str,
        company_id: &str,
        environment_id: &str,
    ) -> Result<Option<LeaseRecord>, LedgerError>;

    /// Every row, oldest first.
    fn list(&self) -> Result<Vec<LeaseRecord>, LedgerError>;

    /// Rows `sweep` must act on: left behind, and owned by `process` or, when
    /// `None`, by a process that is no longer running.
    fn left_behind(&self, process: Option<u32>) -> Result<Vec<LeaseRecord>, LedgerError>;

    /// Leases in `state` that carry a provider lease id (for example the
    /// unconfirmed ones a newly active provider version must refuse to reuse).
    fn in_state(&self, state: LeaseState) -> Result<Vec<LeaseRecord>, LedgerError> {
        Ok(self
            .list()?
            .into_iter()
            .filter(|record| record.state == state && record.provider_lease_id.is_some())
            .collect())
    }
}

impl LeaseStore for Ledger {
    fn pid(&self) -> u32 {
        Ledger::pid(self)
    }

    fn begin(&self, owner: Owner, run_id: &str, env: &LeaseEnv, hook: &str) -> Result<i64, LedgerError> {
        Ledger::begin(self, owner, run_id, env, hook)
    }

    fn set_state(
        &self,
        row: i64,
        state: LeaseState,
        hook: &str,
        error: Option<&ProviderError>,
    ) -> Result<(), LedgerError> {
        Ledger::set_state(self, row, state, hook, error)
    }

    fn set_lease(&self, row: i64, state: LeaseState, hook: &str, lease: &Lease) -> Result<(), LedgerError> {
        Ledger::set_lease(self, row, state, hook, lease)
    }

    fn forget(&self, row: i64) -> Result<(), LedgerError> {
        Ledger::forget(self, row)
    }

    fn adopt(&self, row: i64) -> Result<(), LedgerError> {
        Ledger::adopt(self, row)
    }

    fn get(&self, row: i64) -> Result<Option<LeaseRecord>, LedgerError> {
        Ledger::get(self, row)
    }

    fn find(
        &self,
        provider_lease_id: &str,
        company_id: &str,
        environment_id: &str,
    ) -> Result<Option<LeaseRecord>, LedgerError> {
        Ledger::find(self, provider_lease_id, company_id, environment_id)
    }

    fn list(&self) -> Result<Vec<LeaseRecord>, LedgerError> {
        Ledger::list(self)
    }

    fn left_behind(&self, process: Option<u32>) -> Result<Vec<LeaseRecord>, LedgerError> {
        Ledger::left_behind(self, process)
    }
}
