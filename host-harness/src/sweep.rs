//! `sweep`: destroys every lease a crashed or interrupted run left behind.
//!
//! The rows come from [`Ledger::left_behind`]. Each is destroyed through the
//! provider with the configuration the ledger stored; the API key is never
//! stored, so it comes from the caller ([`SweepKey`]): the current
//! configuration's `apiKey` when its `apiUrl` is the row's (a key is never
//! sent to another API), else the provider's own fallback
//! (`CREATEOS_API_KEY`). Rows whose API was a simulator embedded in a process
//! that has exited are closed without a request: their sandboxes died with
//! it. A row without a lease id (an `acquire` or `probe` cut short before the
//! provider named its sandbox) cannot be acted on and is reported.

use crate::{
    host::{HeldLease, Host},
    ledger::{LeaseRecord, LeaseState, Ledger, LedgerError},
    request::HarnessConfig,
};
use provider_abi::{LoadedProvider, ProviderError};
use serde_json::{json, Value};

/// Which rows to sweep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Rows of processes that are no longer running (`sweep`, and what
    /// `lifecycle` and `soak` do first).
    Orphans,
    /// Rows of this process (the end of a `soak`).
    ThisProcess,
}

/// Where the API key for a swept lease comes from.
#[derive(Debug, Clone, Default)]
pub struct SweepKey {
    /// `(apiUrl, apiKey)` of the current configuration, if it has a key.
    pub current: Option<(String, String)>,
}

impl SweepKey {
    /// The key of `config`, usable for leases on the same API.
    pub fn from_config(config: &HarnessConfig) -> Self {
        let current = config.api_key().map(|key| (normalize(config.api_url().unwrap_or("")), key.to_owned()));
        SweepKey { current }
    }

    /// The provider configuration to act on `record` with.
    fn config_for(&self, record: &LeaseRecord) -> Value {
        let mut config = record.env.config.clone();
        let url = normalize(config.get("apiUrl").and_then(Value::as_str).unwrap_or(""));
        if let (Some((current_url, key)), Value::Object(object)) = (&self.current, &mut config) {
            if *current_url == url {
                object.insert("apiKey".into(), Value::String(key.clone()));
            }
        }
        config
    }
}

fn normalize(url: &str) -> String {
    url.trim_end_matches('/').to_ascii_lowercase()
}

/// What happened to one row.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Destroyed now.
    Destroyed,
    /// Its embedded simulator exited, taking the sandbox with it.
    GoneWithSimulator,
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
        let (outcome, error) = match &self.outcome {
            Outcome::Destroyed => ("destroyed", None),
            Outcome::GoneWithSimulator => ("gone_with_simulator", None),
            Outcome::Unresolvable => ("unresolvable", None),
            Outcome::Failed(error) => ("failed", Some(crate::render::error(error))),
        };
        json!({
            "row": self.record.id,
            "providerLeaseId": self.record.provider_lease_id,
            "state": self.record.state.as_str(),
            "owner": self.record.owner.as_str(),
            "outcome": outcome,
            "error": error,
        })
    }
}

/// Sweeps the rows of `scope`.
pub fn sweep(
    provider: &LoadedProvider,
    ledger: &Ledger,
    scope: Scope,
    key: &SweepKey,
) -> Result<Vec<Swept>, LedgerError> {
    let process = match scope {
        Scope::Orphans => None,
        Scope::ThisProcess => Some(ledger.pid()),
    };
    let mut swept = Vec::new();
    for record in ledger.left_behind(process)? {
        let outcome = sweep_one(provider, ledger, &record, key, scope)?;
        match &outcome {
            Outcome::Destroyed => {
                tracing::warn!(lease = ?record.provider_lease_id, state = %record.state, "swept a lease left behind")
            }
            Outcome::Unresolvable => tracing::info!(
                row = record.id,
                "a lease left behind has no id (its acquire was cut short); it cannot be swept"
            ),
            Outcome::Failed(error) => {
                tracing::warn!(lease = ?record.provider_lease_id, kind = %error.kind, "sweep could not destroy a lease")
            }
            Outcome::GoneWithSimulator => {}
        }
        swept.push(Swept { record, outcome });
    }
    Ok(swept)
}

fn sweep_one(
    provider: &LoadedProvider,
    ledger: &Ledger,
    record: &LeaseRecord,
    key: &SweepKey,
    scope: Scope,
) -> Result<Outcome, LedgerError> {
    if record.env.embedded_sim && scope == Scope::Orphans {
        ledger.adopt(record.id)?;
        ledger.set_state(record.id, LeaseState::Destroyed, "sweep", None)?;
        return Ok(Outcome::GoneWithSimulator);
    }
    if record.provider_lease_id.is_none() {
        return Ok(Outcome::Unresolvable);
    }
    ledger.adopt(record.id)?;
    let config = HarnessConfig {
        driver_key: Some(record.env.driver_key.clone()),
        company_id: record.env.company_id.clone(),
        environment_id: record.env.environment_id.clone(),
        config: key.config_for(record),
    };
    let host = Host::new(provider, ledger, &config, record.owner, &record.run_id, record.env.embedded_sim);
    let held = HeldLease { row: record.id, lease: record.lease() };
    Ok(match host.destroy(&held) {
        Ok(()) => Outcome::Destroyed,
        Err(error) => Outcome::Failed(error),
    })
}
