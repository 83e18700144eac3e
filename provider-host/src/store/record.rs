//! What a lease store records, whichever store it is: a lease's row
//! ([`LeaseRecord`]: its [`LeaseState`], [`Owner`] and [`LeaseEnv`]), whose
//! rows a host lists ([`Whose`]) and the store's error ([`LedgerError`]).

use provider_abi::Lease;
use serde::Serialize;
use serde_json::Value;
use std::{fmt, path::PathBuf};
use strum::{Display, EnumString, IntoStaticStr, VariantArray};

/// Where a lease stands, as far as the harness knows.
///
/// The non-final states are recorded before the hook that might leave the
/// lease in them, so a crash mid-hook errs towards "something may remain".
/// Displays (and parses) as the name stored in the database.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Display, EnumString, IntoStaticStr, VariantArray,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum LeaseState {
    /// `acquire_lease` (or `probe`) was called, and its creation request has
    /// not left: nothing exists remotely.
    Acquiring,
    /// The creation request may have left: a sandbox may exist, named once
    /// the reply recorded its id.
    Creating,
    /// Acquired or resumed (or being resumed): the sandbox may be running.
    Active,
    /// Released for reuse.
    Paused,
    /// Process cleanup could not be confirmed: destroy it, never reuse it.
    Unconfirmed,
    /// `release_lease` was called.
    Releasing,
    /// `destroy_lease` was called.
    Destroying,
    /// Gone: nothing remains remotely.
    Destroyed,
    /// A release or destroy failed: something may remain.
    CleanupFailed,
}

impl LeaseState {
    /// The name stored in the database.
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// Who acquired a lease, which decides what `sweep` may do with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, EnumString, IntoStaticStr)]
#[serde(rename_all = "lowercase")]
#[strum(serialize_all = "lowercase")]
pub enum Owner {
    /// A hook command (`acquire`...): the user holds the lease JSON; an
    /// active or paused lease is kept until the user sweeps held leases.
    Command,
    /// `lifecycle` or `soak`: the run always ends by destroying its leases,
    /// so any row it left, paused included, is swept.
    Lifecycle,
    /// A `probe`: its sandbox is never named to the host; the row only says
    /// whether the probe finished.
    Probe,
}

impl Owner {
    /// The name stored in the database.
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// The environment a lease belongs to, as stored (never with the API key).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LeaseEnv {
    /// The provider's driver key.
    pub driver_key: String,
    /// The company.
    pub company_id: String,
    /// The environment.
    pub environment_id: String,
    /// The provider configuration without its secrets (the properties the
    /// provider's schema marks `writeOnly`; see [`crate::secrets`]).
    pub config: Value,
    /// True when the API this lease talked to lived in the owning process
    /// (an API served in process, for tests or offline runs): its sandboxes
    /// are gone with that process, so a sweep closes the row without a request.
    pub api_in_process: bool,
}

/// One ledger row.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LeaseRecord {
    /// The row id.
    pub id: i64,
    /// Who acquired the lease.
    pub owner: Owner,
    /// The run id passed to the hooks.
    pub run_id: String,
    /// Where the lease stands.
    pub state: LeaseState,
    /// The provider lease id, once known.
    pub provider_lease_id: Option<String>,
    /// The lease metadata the provider returned (JSON object).
    pub metadata: Option<Value>,
    /// The environment and configuration.
    #[serde(flatten)]
    pub env: LeaseEnv,
    /// The last hook called on the lease.
    pub last_hook: String,
    /// The last error, as `{"kind", "message"}`.
    pub last_error: Option<Value>,
    /// The process that owns the row (on the machine of its host).
    pub pid: u32,
    /// The host that owns the row, in a fleet's ledger (PostgreSQL); `None`
    /// in SQLite, where the owner is the process `pid` of this machine.
    pub host_id: Option<String>,
    /// When the row was created (UTC, RFC 3339).
    pub created_at: String,
    /// When the row last changed (UTC, RFC 3339).
    pub updated_at: String,
    #[serde(skip)]
    pub(crate) owner_start: u64,
}

impl LeaseRecord {
    /// True for a row `sweep` may act on once its owner is gone: every row
    /// not destroyed, since something may remain remotely. Which of them a
    /// sweep does act on is its scope's choice ([`crate::sweep::Scope`]): a
    /// lease a hook command left active or paused is held on purpose.
    pub fn is_left_behind(&self) -> bool {
        self.state != LeaseState::Destroyed
    }

    /// The row as JSON.
    pub fn to_json(&self) -> Value {
        serde_json::to_value(self).unwrap_or_default()
    }

    /// The lease as the provider returned it, for hooks acting on it.
    pub fn lease(&self) -> Lease {
        Lease {
            provider_lease_id: self.provider_lease_id.clone().map(Into::into).into(),
            metadata_json: self.metadata.as_ref().map(Value::to_string).unwrap_or_default().into(),
            expires_at: None.into(),
            expired: false,
        }
    }
}

/// A hook error as the stores keep it: `{"kind", "message"}`.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) fn stored_error(error: &provider_abi::ProviderError) -> String {
    serde_json::json!({"kind": error.kind.to_string(), "message": error.message.as_str()}).to_string()
}

/// The provider lease id `lease` names, if any.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) fn lease_id(lease: &Lease) -> Option<String> {
    lease.provider_lease_id.as_ref().map(|id| id.to_string()).into_option()
}

/// A ledger error: the database could not be opened, read or written. Displays
/// as one line naming the file (or the database URL, without its password).
#[derive(Debug, thiserror::Error)]
#[error("lease ledger {location}: {problem}")]
pub struct LedgerError {
    location: String,
    #[source]
    problem: Problem,
}

/// What went wrong with a ledger.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Problem {
    #[cfg(feature = "sqlite")]
    #[error("{0}")]
    Sqlite(rusqlite::Error),
    #[cfg(feature = "sqlite")]
    #[error("cannot create its directory {}: {source}", dir.display())]
    Directory { dir: PathBuf, source: std::io::Error },
    #[cfg(any(feature = "sqlite", feature = "postgres"))]
    #[error("{0}")]
    Io(std::io::Error),
    #[cfg(feature = "sqlite")]
    #[error("not a SQLite database")]
    NotADatabase,
    #[cfg(feature = "sqlite")]
    #[error(
        "a SQLite database of another application ({0}); refusing to add the lease ledger's tables to it"
    )]
    Foreign(String),
    #[cfg(any(feature = "sqlite", feature = "postgres"))]
    #[error("written by a newer host-harness (ledger {what} {found}, this one knows {known})")]
    Newer { what: &'static str, found: i64, known: i64 },
    #[cfg(feature = "postgres")]
    #[error("{}", super::postgres::describe(.0))]
    Postgres(#[from] postgres::Error),
    #[cfg(feature = "postgres")]
    #[error("{0}")]
    Pool(#[from] r2d2_postgres::r2d2::Error),
    #[cfg(feature = "postgres")]
    #[error("a database of another application (a `leases` table without the ledger's migrations); refusing to change it")]
    ForeignDatabase,
    #[error("the ledger is closed")]
    Closed,
    #[cfg(feature = "postgres")]
    #[error("row {row} was taken over by host {host} (this host's heartbeat had expired); not changing it")]
    TakenOver { row: i64, host: String },
    #[error("{0}")]
    Store(String),
}

/// A SQLite error, `NotADatabase` told apart (a file that is no ledger).
#[cfg(feature = "sqlite")]
impl From<rusqlite::Error> for Problem {
    fn from(error: rusqlite::Error) -> Self {
        match error.sqlite_error_code() {
            Some(rusqlite::ErrorCode::NotADatabase) => Problem::NotADatabase,
            _ => Problem::Sqlite(error),
        }
    }
}

impl LedgerError {
    /// An error of the ledger shown as `location`.
    pub(crate) fn at(location: impl fmt::Display, problem: impl Into<Problem>) -> Self {
        LedgerError { location: location.to_string(), problem: problem.into() }
    }

    /// An error of another [`crate::store::LeaseStore`] (a database server):
    /// `location` names it (never with credentials), `problem` is one line.
    pub fn other(location: impl Into<PathBuf>, problem: impl Into<String>) -> Self {
        LedgerError {
            location: location.into().display().to_string(),
            problem: Problem::Store(problem.into()),
        }
    }
}

/// Whose left-behind rows [`crate::store::LeaseStore::left_behind`] lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Whose {
    /// This host's (this process's, in SQLite).
    ThisHost,
    /// Hosts that are gone: their process exited (SQLite), or their
    /// heartbeat expired (PostgreSQL).
    Gone,
}
