//! Where the host records leases: the operations its policy needs, never
//! SQL, and what it records ([`LeaseRecord`]). [`sqlite`]'s [`Ledger`] is
//! the embedded implementation, for the processes of one machine;
//! [`postgres`]'s [`PgLedger`] is a fleet's.
//! [`LedgerLocation`] names either, and [`open`] opens it.
//!
//! A lease belongs to a host: in SQLite a process of this machine (alive
//! while it runs), in PostgreSQL a host id whose heartbeat the store renews
//! (alive until it expires). A host that is gone leaves its rows to any
//! surviving host, which takes them over ([`LeaseStore::take_over`]) exactly
//! once before it sweeps them.

#[cfg(feature = "postgres")]
pub mod postgres;
mod record;
#[cfg(feature = "sqlite")]
pub mod sqlite;

#[cfg(feature = "postgres")]
use self::postgres::PgLedger;
use crate::memory::SavedEntry;
use provider_abi::{Lease, MemoryEntry, ProviderError};
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) use record::{lease_id, stored_error, Problem};
pub use record::{LeaseEnv, LeaseRecord, LeaseState, LedgerError, Owner, Whose};
#[cfg(feature = "sqlite")]
use sqlite::Ledger;
use std::{
    path::PathBuf,
    time::{Duration, SystemTime},
};

/// How many transactions committed and the writes they held.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CommitCounts {
    /// Transactions committed (each one `fsync` of the write-ahead log).
    pub commits: u64,
    /// Writes those transactions held, failed writes not counted.
    pub writes: u64,
}

/// A write of the host's policy, as data: what [`LeaseStore::submit`] takes
/// (and `committed`, on a `dyn LeaseStore`, awaits).
#[derive(Debug, Clone)]
pub enum Write {
    /// [`LeaseStore::begin`]; answers the new row's id.
    Begin {
        /// Who acquires the lease.
        owner: Owner,
        /// The run id passed to the hooks.
        run_id: String,
        /// The environment and configuration.
        env: LeaseEnv,
        /// The hook about to be called.
        hook: String,
    },
    /// [`LeaseStore::set_state`].
    SetState {
        /// The row.
        row: i64,
        /// The lease's state.
        state: LeaseState,
        /// The hook about to be called, or returned.
        hook: String,
        /// The last error (`None` clears it).
        error: Option<ProviderError>,
    },
    /// [`LeaseStore::set_lease`].
    SetLease {
        /// The row.
        row: i64,
        /// The lease's state.
        state: LeaseState,
        /// The hook that returned the lease.
        hook: String,
        /// The lease as the provider returned it.
        lease: Lease,
    },
    /// [`LeaseStore::restore`]: the row `record` names, put back as it holds it.
    Restore(LeaseRecord),
    /// [`LeaseStore::forget`]: the row.
    Forget(i64),
    /// [`LeaseStore::adopt`]: the row.
    Adopt(i64),
}

/// Where [`LeaseStore::submit`] answers: the write's outcome, once durable.
pub type Done = Box<dyn FnOnce(Result<i64, LedgerError>) + Send>;

/// A durable record of leases. Every write is durable before it returns (or,
/// through [`LeaseStore::submit`], before it is answered): the host writes
/// ahead of each hook, so a crash leaves a row saying what might still exist
/// remotely.
pub trait LeaseStore: Send + Sync {
    /// This host, as its rows name it (for messages).
    fn host_name(&self) -> String;

    /// How often a long run looks for the leases of gone hosts to take over:
    /// half a heartbeat's expiry in a fleet.
    fn patrol_interval(&self) -> Duration;

    /// Runs `write` and returns once it is durable: the new row's id for
    /// [`Write::Begin`], else 0. The methods that record a transition
    /// (`begin`, `set_state`...) run theirs through it.
    fn write(&self, write: Write) -> Result<i64, LedgerError>;

    /// Records a lease about to be acquired (state `acquiring`, no id yet)
    /// and returns its row id.
    fn begin(&self, owner: Owner, run_id: &str, env: &LeaseEnv, hook: &str) -> Result<i64, LedgerError> {
        self.write(Write::Begin { owner, run_id: run_id.to_owned(), env: env.clone(), hook: hook.to_owned() })
    }

    /// Records that `hook` is about to be called, or has returned, leaving the
    /// lease in `state`; `error` replaces the last error (`None` clears it).
    fn set_state(
        &self,
        row: i64,
        state: LeaseState,
        hook: &str,
        error: Option<&ProviderError>,
    ) -> Result<(), LedgerError> {
        self.write(Write::SetState { row, state, hook: hook.to_owned(), error: error.cloned() }).map(drop)
    }

    /// Records the lease the provider returned (its id and metadata), in `state`.
    fn set_lease(&self, row: i64, state: LeaseState, hook: &str, lease: &Lease) -> Result<(), LedgerError> {
        self.write(Write::SetLease { row, state, hook: hook.to_owned(), lease: lease.clone() }).map(drop)
    }

    /// Puts a row's state, last hook, last error and owner back as `record`
    /// holds them: a call the provider refused before any request changed
    /// nothing.
    fn restore(&self, record: &LeaseRecord) -> Result<(), LedgerError> {
        self.write(Write::Restore(record.clone())).map(drop)
    }

    /// Removes a row: a lease the provider refused before any request.
    fn forget(&self, row: i64) -> Result<(), LedgerError> {
        self.write(Write::Forget(row)).map(drop)
    }

    /// Takes over a row for this host (a command acting on a lease an
    /// earlier run recorded). The previous owner's later writes to it fail.
    fn adopt(&self, row: i64) -> Result<(), LedgerError> {
        self.write(Write::Adopt(row)).map(drop)
    }

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

    /// Rows `sweep` may act on ([`LeaseRecord::is_left_behind`]): this
    /// host's, or those of hosts that are gone.
    fn left_behind(&self, whose: Whose) -> Result<Vec<LeaseRecord>, LedgerError>;

    /// Takes over those of `records` (listed by `left_behind(Whose::Gone)`)
    /// whose owner is still the gone host they name, in one transaction, and
    /// returns them as now this host's. Hosts sweeping at once share the rows
    /// out: each row goes to exactly one, and a live host's row to none.
    fn take_over(&self, records: &[LeaseRecord]) -> Result<Vec<LeaseRecord>, LedgerError>;

    /// The live hosts that share this host's request budget, itself
    /// included (at least 1): those that send requests from the same caller
    /// address. SQLite: the running processes that opened this ledger (one
    /// machine). PostgreSQL: the hosts of this machine (same hostname) whose
    /// heartbeat has not expired; hosts of other machines have budgets of
    /// their own, the API counting requests per caller IP.
    fn budget_group(&self) -> Result<usize, LedgerError>;

    /// Starts `write`; `done` gets its outcome (the new row's id for
    /// [`Write::Begin`], else 0) once it is durable, or its error. The
    /// default runs it on this thread before returning; SQLite's returns at
    /// once and commits it together with the writes of other callers.
    fn submit(&self, write: Write, done: Done) {
        done(self.write(write))
    }

    /// Starts `write`; `executed` gets its outcome (the new row's id for
    /// [`Write::Begin`], else 0) as soon as it ran, maybe before it is
    /// durable. A write submitted after that answer is durable only once
    /// this one is, and fails if this one was lost: a caller awaits this
    /// write's durability by awaiting the next write's. The default answers
    /// once it is durable; SQLite's runs it in the transaction being
    /// gathered and answers before the commit.
    fn queue(&self, write: Write, executed: Done) {
        self.submit(write, executed)
    }

    /// How many transactions committed the writes of this store's handle,
    /// for a store that counts them (SQLite).
    fn commit_counts(&self) -> Option<CommitCounts> {
        None
    }

    /// What provider `provider_id` remembered ([`crate::memory`]), newest
    /// first. The default: a store that keeps no memory.
    fn memory(&self, _provider_id: &str) -> Result<Vec<SavedEntry>, LedgerError> {
        Ok(Vec::new())
    }

    /// Keeps `entries` of provider `provider_id` as saved at `saved_at`
    /// (replacing those of the same keys), then forgets its entries saved
    /// before `forget_before` and all but its newest `keep`. The default: a
    /// store that keeps no memory.
    fn save_memory(
        &self,
        _provider_id: &str,
        _entries: &[MemoryEntry],
        _saved_at: SystemTime,
        _forget_before: SystemTime,
        _keep: usize,
    ) -> Result<(), LedgerError> {
        Ok(())
    }

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

impl dyn LeaseStore + '_ {
    /// `write`, awaited: resolves once it is durable, holding no thread
    /// meanwhile when the store commits on a thread of its own (SQLite).
    pub async fn committed(&self, write: Write) -> Result<i64, LedgerError> {
        self.answered(|done| self.submit(write, done)).await
    }

    /// `write`, awaited until it ran ([`LeaseStore::queue`]): the caller
    /// goes on before it is durable, and its next write, awaited, makes
    /// both durable.
    pub async fn queued(&self, write: Write) -> Result<i64, LedgerError> {
        self.answered(|done| self.queue(write, done)).await
    }

    /// What `start` answers through the [`Done`] it is given.
    async fn answered(&self, start: impl FnOnce(Done)) -> Result<i64, LedgerError> {
        let (sender, answer) = tokio::sync::oneshot::channel();
        start(Box::new(move |outcome| drop(sender.send(outcome))));
        answer.await.unwrap_or_else(|_| Err(LedgerError::at(self.host_name(), record::Problem::Closed)))
    }
}

/// What a provider remembered, newest first: the statement both stores run.
/// SQLite reads PostgreSQL's `$N` parameters too, but numbers them by first
/// appearance (`$1` is a name to it), so in these three statements `$1`,
/// `$2`, ... must first appear in that order.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) const MEMORY: &str = "SELECT key, value, saved_at_ms FROM provider_memory WHERE provider_id = $1
    ORDER BY saved_at_ms DESC, key";

/// Keeps one entry of a provider's memory, replacing the one of its key.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) const SAVE_MEMORY: &str = "INSERT INTO provider_memory (provider_id, key, value, saved_at_ms)
    VALUES ($1, $2, $3, $4)
    ON CONFLICT (provider_id, key) DO UPDATE SET value = EXCLUDED.value, saved_at_ms = EXCLUDED.saved_at_ms";

/// Forgets a provider's entries saved before `$2` and all but its newest `$3`.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) const FORGET_MEMORY: &str = "DELETE FROM provider_memory WHERE provider_id = $1 AND (saved_at_ms < $2
    OR key NOT IN (SELECT key FROM provider_memory WHERE provider_id = $1 ORDER BY saved_at_ms DESC, key LIMIT $3))";

/// Milliseconds since the Unix epoch, as the stores keep memory's times.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) fn unix_ms(time: SystemTime) -> i64 {
    time.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |since| since.as_millis() as i64)
}

/// A row of [`MEMORY`]: an entry saved `saved_at_ms` after the Unix epoch.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) fn saved_entry(key: String, value: Vec<u8>, saved_at_ms: i64) -> SavedEntry {
    let saved_at = SystemTime::UNIX_EPOCH + Duration::from_millis(saved_at_ms.max(0) as u64);
    SavedEntry { entry: MemoryEntry::new(key, value), saved_at }
}

/// Where the ledger is: a SQLite file, or a PostgreSQL database
/// (`postgres://` or `postgresql://` URL).
#[derive(Clone, PartialEq, Eq)]
pub enum LedgerLocation {
    /// A SQLite file (one machine).
    Sqlite(PathBuf),
    /// A PostgreSQL URL (a fleet).
    Postgres(String),
}

impl std::fmt::Debug for LedgerLocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LedgerLocation::Sqlite(path) => write!(f, "Sqlite({})", path.display()),
            #[cfg(feature = "postgres")]
            LedgerLocation::Postgres(url) => write!(f, "Postgres({})", self::postgres::redacted(url)),
            #[cfg(not(feature = "postgres"))]
            LedgerLocation::Postgres(_) => write!(f, "Postgres(..)"),
        }
    }
}

impl LedgerLocation {
    /// A `--ledger` argument: a URL of scheme `postgres`/`postgresql`, else a path.
    pub fn parse(text: &std::ffi::OsStr) -> LedgerLocation {
        match text.to_str() {
            Some(url) if url.starts_with("postgres://") || url.starts_with("postgresql://") => {
                LedgerLocation::Postgres(url.to_owned())
            }
            _ => LedgerLocation::Sqlite(PathBuf::from(text)),
        }
    }
}

/// What a store is opened with.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// PostgreSQL: how long a host's heartbeat lasts unrenewed (renewed every
    /// third of it); also the scale of [`LeaseStore::patrol_interval`].
    pub heartbeat_expiry: Duration,
    /// PostgreSQL: connections in the pool.
    pub pool_size: u32,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions { heartbeat_expiry: Duration::from_secs(30), pool_size: 16 }
    }
}

/// Opens (creating or migrating if needed) the ledger at `location`.
pub fn open(location: &LedgerLocation, options: &StoreOptions) -> Result<Box<dyn LeaseStore>, LedgerError> {
    match location {
        #[cfg(feature = "sqlite")]
        LedgerLocation::Sqlite(path) => Ok(Box::new(Ledger::open(path)?)),
        #[cfg(feature = "postgres")]
        LedgerLocation::Postgres(url) => Ok(Box::new(PgLedger::open(url, options)?)),
        #[cfg(not(all(feature = "sqlite", feature = "postgres")))]
        _ => {
            let _ = options; // Only PostgreSQL reads them.
            Err(missing(location))
        }
    }
}

/// Every row of the ledger at `location`, read without changing it (no
/// ledger there yet: none).
pub fn read_all(location: &LedgerLocation) -> Result<Vec<LeaseRecord>, LedgerError> {
    match location {
        #[cfg(feature = "sqlite")]
        LedgerLocation::Sqlite(path) => {
            Ledger::open_read_only(path)?.map_or(Ok(Vec::new()), |ledger| ledger.list())
        }
        #[cfg(feature = "postgres")]
        LedgerLocation::Postgres(url) => self::postgres::read_all(url),
        #[cfg(not(all(feature = "sqlite", feature = "postgres")))]
        _ => Err(missing(location)),
    }
}

/// Where the SQLite ledger lives unless told: `$XDG_STATE_HOME/host-harness/ledger.sqlite3`
/// (`~/.local/state/...` when that is unset).
pub fn default_sqlite_path() -> PathBuf {
    let state =
        std::env::var_os("XDG_STATE_HOME").filter(|dir| !dir.is_empty()).map(PathBuf::from).unwrap_or_else(
            || std::env::var_os("HOME").map(PathBuf::from).unwrap_or_default().join(".local/state"),
        );
    state.join("host-harness").join("ledger.sqlite3")
}

/// The error of a `location` whose store this build lacks (its feature is
/// off).
#[cfg(not(all(feature = "sqlite", feature = "postgres")))]
fn missing(location: &LedgerLocation) -> LedgerError {
    let (shown, store, feature) = match location {
        LedgerLocation::Sqlite(_) => ("ledger.sqlite3", "SQLite", "sqlite"),
        LedgerLocation::Postgres(_) => ("postgres://..", "PostgreSQL", "postgres"),
    };
    let problem = format!("this build has no {store} ledger (provider-host's `{feature}` feature is off)");
    LedgerError::other(shown, problem)
}
