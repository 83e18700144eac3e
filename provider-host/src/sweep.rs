//! `sweep`: destroys every lease a crashed or interrupted run left behind.
//!
//! The rows come from [`LeaseStore::left_behind`], narrowed by [`Scope`] and,
//! when they are a gone host's, taken over by this host first
//! ([`LeaseStore::take_over`]: each row goes to one sweeping host only); a
//! lease the scripting `acquire` command (or `resume`/`release`) left active
//! or paused is *held* on purpose and is swept only when the user says so.
//! Each row is destroyed through the provider with the configuration the
//! ledger stored; secrets are never stored, so they come from the caller's
//! current configuration, for rows of the same account only
//! ([`SecretFields::restore`]); without one the provider uses its own
//! fallback. A row whose host may already have deleted its sandbox is
//! checked first ([`Host::destroy_left_behind`]), so a sandbox is deleted
//! once. Rows whose API lived in their host's process, which has exited,
//! are closed without a request: their sandboxes are gone with it. A row
//! whose creation request never left (still `acquiring`) is closed without a
//! word: nothing exists. A row without a lease id whose request may have
//! left (`creating`: its reply was still in flight) cannot be acted on and is
//! reported.

use crate::hosted::HookSupport;
use crate::{
    environment::Environment,
    host::{storable_config, HeldLease, Host},
    secrets::SecretFields,
    store::{LeaseRecord, LeaseState, LedgerError, Owner},
    store::{LeaseStore, Whose},
};
use provider_abi::ProviderError;
use serde_json::{json, Value};
use std::sync::mpsc::{Receiver, RecvTimeoutError};

/// Which rows to sweep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Rows of hosts that are gone (processes that are no longer running,
    /// in SQLite; expired heartbeats, in PostgreSQL): the `sweep` command;
    /// held leases too when `include_held`.
    Abandoned {
        /// Also sweep leases the hook commands left active or paused.
        include_held: bool,
    },
    /// Rows of dead `lifecycle`, `soak` and `probe` runs only: what
    /// `lifecycle` and `soak` sweep before they start.
    DeadRuns,
    /// Rows of this host (the end of a `soak`).
    ThisProcess,
    /// Rows of gone hosts whose acquire or probe never returned (still
    /// `acquiring` or `creating`): a sandbox only the gone host could have
    /// named. An `acquiring` row is closed without a word (its request never
    /// left), a `creating` one with a lease id is destroyed. A lease that was
    /// handed out stays, whatever its state, for its holder to resume,
    /// release or destroy (a platform's restarted worker).
    Unreturned,
}

impl Scope {
    /// True when `record` (left behind) falls in this scope.
    fn covers(self, record: &LeaseRecord) -> bool {
        match self {
            Scope::Abandoned { include_held } => include_held || !is_held(record),
            Scope::DeadRuns => record.owner != Owner::Command,
            Scope::ThisProcess => true,
            Scope::Unreturned => {
                matches!(record.state, LeaseState::Acquiring | LeaseState::Creating)
            }
        }
    }
}

/// A lease a hook command left active or paused for the user to use later.
fn is_held(record: &LeaseRecord) -> bool {
    record.owner == Owner::Command && matches!(record.state, LeaseState::Active | LeaseState::Paused)
}

/// The caller's current configuration, whose secrets a sweep may lend to
/// rows of the same account.
#[derive(Debug, Clone, Default)]
pub struct SweepSecrets {
    /// The current provider configuration, secrets included.
    current: Value,
    /// The same as the ledger would store it (normalised, without secrets).
    current_stored: Value,
}

impl SweepSecrets {
    /// The secrets of `config`, as `provider` describes them.
    pub fn from_config(provider: &dyn HookSupport, config: &Environment) -> Self {
        let env = config.params(&provider.manifest().driver_key);
        Self {
            current: config.config.clone(),
            current_stored: storable_config(provider, &env, &config.config),
        }
    }

    /// The environment `record` was acquired in, its stored configuration
    /// given back the current secrets of `fields` its account may have.
    pub(crate) fn environment(&self, fields: &SecretFields, record: &LeaseRecord) -> Environment {
        Environment {
            driver_key: Some(record.env.driver_key.clone()),
            company_id: record.env.company_id.clone(),
            environment_id: record.env.environment_id.clone(),
            config: fields.restore(&record.env.config, &self.current, &self.current_stored),
            api_in_process: record.env.api_in_process,
        }
    }
}

/// What happened to one row (named in snake case in its JSON).
#[derive(Debug, Clone, PartialEq, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum Outcome {
    /// Destroyed now.
    Destroyed,
    /// The API it talked to lived in its host's process, which exited:
    /// the sandbox is gone with that process.
    GoneWithItsProcess,
    /// Its creation request never left: nothing existed to destroy.
    NeverSent,
    /// No lease id: nothing can be done remotely.
    Unresolvable,
    /// The destroy failed; the row stays for the next sweep.
    Failed(ProviderError),
}

/// One swept row.
#[derive(Debug, Clone)]
pub struct Swept {
    /// The row as it was before the sweep.
    pub record: LeaseRecord,
    /// What the sweep did.
    pub outcome: Outcome,
}

impl Swept {
    /// The result as JSON.
    pub fn to_json(&self) -> Value {
        let error = match &self.outcome {
            Outcome::Failed(error) => Some(crate::error_json(error)),
            _ => None,
        };
        json!({
            "row": self.record.id,
            "providerLeaseId": self.record.provider_lease_id,
            "state": self.record.state.as_str(),
            "owner": self.record.owner.as_str(),
            "outcome": <&str>::from(&self.outcome),
            "error": error,
        })
    }
}

/// Sweeps the rows of `scope`.
pub fn sweep(
    provider: &dyn HookSupport,
    ledger: &dyn LeaseStore,
    scope: Scope,
    secrets: &SweepSecrets,
) -> Result<Vec<Swept>, LedgerError> {
    let whose = if scope == Scope::ThisProcess { Whose::ThisHost } else { Whose::Gone };
    let mut records: Vec<LeaseRecord> =
        ledger.left_behind(whose)?.into_iter().filter(|record| scope.covers(record)).collect();
    if whose == Whose::Gone {
        records = ledger.take_over(&records)?;
    }
    let fields = SecretFields::of(&provider.manifest());
    let swept = records.into_iter().map(|record| {
        let outcome = sweep_one(provider, ledger, &record, &fields, secrets, scope)?;
        Ok(Swept { record, outcome })
    });
    swept.collect()
}

/// Sweeps one row, logging what it did but for a row closed without a request.
fn sweep_one(
    provider: &dyn HookSupport,
    ledger: &dyn LeaseStore,
    record: &LeaseRecord,
    fields: &SecretFields,
    secrets: &SweepSecrets,
    scope: Scope,
) -> Result<Outcome, LedgerError> {
    if record.env.api_in_process && scope != Scope::ThisProcess {
        ledger.set_state(record.id, LeaseState::Destroyed, "sweep", None)?;
        return Ok(Outcome::GoneWithItsProcess);
    }
    if record.provider_lease_id.is_none() {
        if record.state == LeaseState::Acquiring {
            ledger.set_state(record.id, LeaseState::Destroyed, "sweep", None)?;
            return Ok(Outcome::NeverSent);
        }
        tracing::warn!(
            row = record.id,
            "a lease left behind has no id (its creation reply was still in flight); it cannot be swept"
        );
        return Ok(Outcome::Unresolvable);
    }
    let config = secrets.environment(fields, record);
    let host = Host::new(provider, ledger, &config, record.owner, &record.run_id);
    let (held, lease) = (HeldLease::new(record.id, record.lease()), &record.provider_lease_id);
    Ok(match crate::wait(host.destroy_left_behind(&held, record.state)) {
        Ok(()) => {
            tracing::warn!(lease = ?lease, state = %record.state, "swept a lease left behind");
            Outcome::Destroyed
        }
        Err(error) => {
            tracing::warn!(lease = ?lease, kind = %error.kind, "sweep could not destroy a lease");
            Outcome::Failed(error)
        }
    })
}

/// Sweeps the rows gone hosts' runs left ([`Scope::DeadRuns`]) every
/// [`LeaseStore::patrol_interval`], until `stop` receives or its sender is
/// dropped: a long run's watch over its fleet. Returns every row swept.
pub fn patrol(
    provider: &dyn HookSupport,
    ledger: &dyn LeaseStore,
    secrets: &SweepSecrets,
    stop: &Receiver<()>,
) -> Vec<Swept> {
    let mut swept = Vec::new();
    while let Err(RecvTimeoutError::Timeout) = stop.recv_timeout(ledger.patrol_interval()) {
        match sweep(provider, ledger, Scope::DeadRuns, secrets) {
            Ok(rows) => swept.extend(rows),
            Err(error) => tracing::warn!(%error, "cannot look for the leases of gone hosts"),
        }
    }
    swept
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::LeaseEnv;
    use strum::VariantArray;

    fn record(state: LeaseState) -> LeaseRecord {
        LeaseRecord {
            id: 1,
            owner: Owner::Command,
            run_id: "run".into(),
            state,
            provider_lease_id: Some("sb-1".into()),
            metadata: None,
            env: LeaseEnv {
                driver_key: "createos".into(),
                company_id: "acme".into(),
                environment_id: "dev".into(),
                config: json!({}),
                api_in_process: false,
            },
            last_hook: "acquire_lease".into(),
            last_error: None,
            pid: 1,
            host_id: None,
            created_at: String::new(),
            updated_at: String::new(),
            owner_start: 0,
        }
    }

    #[test]
    fn unreturned_covers_the_rows_whose_acquire_never_returned_and_no_lease_handed_out() {
        let covered: Vec<LeaseState> = LeaseState::VARIANTS
            .iter()
            .copied()
            .filter(|state| Scope::Unreturned.covers(&record(*state)))
            .collect();
        assert_eq!(covered, [LeaseState::Acquiring, LeaseState::Creating]);
    }
}
