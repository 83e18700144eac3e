//! The durable lease ledger: every lease the harness acquires, in SQLite.
//!
//! A row is written (and committed) *before* each hook is called and again
//! after it returns, so a harness killed at any point (even `SIGKILL`) leaves
//! a row saying what might still exist remotely; `sweep` acts on those rows
//! later. The database runs in WAL mode with `synchronous = FULL`: a commit
//! survives the process dying and the machine losing power.
//!
//! A row holds the provider lease id and metadata exactly as the provider
//! returned them, the environment (driver, company, environment), the provider
//! configuration as the host hands it over (the host strips what the
//! provider's schema marks secret, so a later sweep can act with the secret
//! from the caller), the process that owns the row and timestamps.

use provider_abi::{Lease, ProviderError};
use rusqlite::{params, Connection, OptionalExtension, Row};
use serde_json::{json, Value};
use std::{
    fmt,
    path::{Path, PathBuf},
    str::FromStr,
    sync::Mutex,
    time::Duration,
};

/// Where a lease stands, as far as the harness knows.
///
/// The non-final states are recorded before the hook that might leave the
/// lease in them, so a crash mid-hook errs towards "something may remain".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LeaseState {
    /// `acquire_lease` (or `probe`) was called; no lease id is known yet.
    Acquiring,
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
    /// Every state.
    pub const ALL: [LeaseState; 8] = [
        LeaseState::Acquiring,
        LeaseState::Active,
        LeaseState::Paused,
        LeaseState::Unconfirmed,
        LeaseState::Releasing,
        LeaseState::Destroying,
        LeaseState::Destroyed,
        LeaseState::CleanupFailed,
    ];

    /// The name stored in the database.
    pub fn as_str(self) -> &'static str {
        match self {
            LeaseState::Acquiring => "acquiring",
            LeaseState::Active => "active",
            LeaseState::Paused => "paused",
            LeaseState::Unconfirmed => "unconfirmed",
            LeaseState::Releasing => "releasing",
            LeaseState::Destroying => "destroying",
            LeaseState::Destroyed => "destroyed",
            LeaseState::CleanupFailed => "cleanup_failed",
        }
    }

    /// States a crashed or interrupted run leaves behind: `sweep` destroys
    /// them. `paused` is not among them (a lease parked for reuse on purpose)
    /// unless its owner is a lifecycle (see [`Owner`]).
    pub fn is_left_behind(self) -> bool {
        !matches!(self, LeaseState::Paused | LeaseState::Destroyed)
    }
}

impl fmt::Display for LeaseState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for LeaseState {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        LeaseState::ALL
            .into_iter()
            .find(|state| state.as_str() == text)
            .ok_or_else(|| format!("unknown lease state `{text}`"))
    }
}

/// Who acquired a lease, which decides what `sweep` may do with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    /// A hook command (`acquire`...): the user holds the lease JSON; a paused
    /// lease is kept for reuse.
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
        match self {
            Owner::Command => "command",
            Owner::Lifecycle => "lifecycle",
            Owner::Probe => "probe",
        }
    }

    fn parse(text: &str) -> Owner {
        match text {
            "lifecycle" => Owner::Lifecycle,
            "probe" => Owner::Probe,
            _ => Owner::Command,
        }
    }
}

/// The environment a lease belongs to, as stored (never with the API key).
#[derive(Debug, Clone, PartialEq)]
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
    /// True when the API was a simulator embedded in the owning process (its
    /// sandboxes die with that process).
    pub embedded_sim: bool,
}

/// One ledger row.
#[derive(Debug, Clone, PartialEq)]
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
    pub env: LeaseEnv,
    /// The last hook called on the lease.
    pub last_hook: String,
    /// The last error, as `{"kind", "message"}`.
    pub last_error: Option<Value>,
    /// The process that owns the row.
    pub pid: u32,
    /// When the row was created (UTC, RFC 3339).
    pub created_at: String,
    /// When the row last changed (UTC, RFC 3339).
    pub updated_at: String,
    owner_start: u64,
}

impl LeaseRecord {
    /// True while the process that wrote the row is running.
    pub fn owner_is_running(&self) -> bool {
        process::start_time(self.pid).is_some_and(|start| start == self.owner_start)
    }

    /// The row as JSON.
    pub fn to_json(&self) -> Value {
        json!({
            "id": self.id,
            "owner": self.owner.as_str(),
            "runId": self.run_id,
            "state": self.state.as_str(),
            "providerLeaseId": self.provider_lease_id,
            "metadata": self.metadata,
            "driverKey": self.env.driver_key,
            "companyId": self.env.company_id,
            "environmentId": self.env.environment_id,
            "config": self.env.config,
            "embeddedSim": self.env.embedded_sim,
            "lastHook": self.last_hook,
            "lastError": self.last_error,
            "pid": self.pid,
            "createdAt": self.created_at,
            "updatedAt": self.updated_at,
        })
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

/// A ledger error: the database could not be opened or written.
#[derive(Debug, thiserror::Error)]
#[error("lease ledger {path}: {source}")]
pub struct LedgerError {
    path: PathBuf,
    #[source]
    source: rusqlite::Error,
}

/// The ledger: one SQLite database, shared by every thread of the harness.
pub struct Ledger {
    path: PathBuf,
    conn: Mutex<Connection>,
    pid: u32,
    start: u64,
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS leases (
    id                INTEGER PRIMARY KEY AUTOINCREMENT,
    owner             TEXT NOT NULL,
    run_id            TEXT NOT NULL,
    state             TEXT NOT NULL,
    provider_lease_id TEXT,
    metadata_json     TEXT,
    driver_key        TEXT NOT NULL,
    company_id        TEXT NOT NULL,
    environment_id    TEXT NOT NULL,
    config_json       TEXT NOT NULL,
    embedded_sim      INTEGER NOT NULL,
    last_hook         TEXT NOT NULL,
    last_error_json   TEXT,
    pid               INTEGER NOT NULL,
    pid_start         INTEGER NOT NULL,
    created_at        TEXT NOT NULL,
    updated_at        TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS leases_state ON leases(state);
CREATE INDEX IF NOT EXISTS leases_provider_lease_id ON leases(provider_lease_id);
";

const NOW: &str = "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')";

impl Ledger {
    /// The default location: `$XDG_STATE_HOME/host-harness/ledger.sqlite3`,
    /// or `~/.local/state/host-harness/ledger.sqlite3`.
    pub fn default_path() -> PathBuf {
        let state = std::env::var_os("XDG_STATE_HOME")
            .filter(|dir| !dir.is_empty())
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                std::env::var_os("HOME").map(PathBuf::from).unwrap_or_default().join(".local/state")
            });
        state.join("host-harness").join("ledger.sqlite3")
    }

    /// Opens (creating if needed) the ledger at `path`.
    pub fn open(path: &Path) -> Result<Ledger, LedgerError> {
        let fail = |source| LedgerError { path: path.to_path_buf(), source };
        if let Some(dir) = path.parent().filter(|dir| !dir.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .map_err(|error| fail(rusqlite::Error::ToSqlConversionFailure(Box::new(error))))?;
        }
        let conn = Connection::open(path).map_err(fail)?;
        conn.busy_timeout(Duration::from_secs(30)).map_err(fail)?;
        conn.pragma_update(None, "journal_mode", "WAL").map_err(fail)?;
        conn.pragma_update(None, "synchronous", "FULL").map_err(fail)?;
        conn.execute_batch(SCHEMA).map_err(fail)?;
        let pid = std::process::id();
        Ok(Ledger {
            path: path.to_path_buf(),
            conn: Mutex::new(conn),
            pid,
            start: process::start_time(pid).unwrap_or(0),
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The id of this process, as rows record it.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    fn with<T>(&self, f: impl FnOnce(&Connection) -> rusqlite::Result<T>) -> Result<T, LedgerError> {
        let conn = self.conn.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        f(&conn).map_err(|source| LedgerError { path: self.path.clone(), source })
    }

    /// Records a lease about to be acquired (state `acquiring`, no id yet)
    /// and returns its row id. Committed before it returns.
    pub fn begin(&self, owner: Owner, run_id: &str, env: &LeaseEnv, hook: &str) -> Result<i64, LedgerError> {
        let config = &env.config;
        self.with(|conn| {
            conn.execute(
                &format!(
                    "INSERT INTO leases (owner, run_id, state, driver_key, company_id, environment_id,
                        config_json, embedded_sim, last_hook, pid, pid_start, created_at, updated_at)
                     VALUES (?1, ?2, 'acquiring', ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, {NOW}, {NOW})"
                ),
                params![
                    owner.as_str(),
                    run_id,
                    env.driver_key,
                    env.company_id,
                    env.environment_id,
                    config.to_string(),
                    env.embedded_sim,
                    hook,
                    self.pid,
                    self.start as i64,
                ],
            )?;
            Ok(conn.last_insert_rowid())
        })
    }

    /// Records that `hook` is about to be called, or has returned, leaving the
    /// lease in `state`; `error` replaces the last error (`None` clears it).
    pub fn set_state(
        &self,
        row: i64,
        state: LeaseState,
        hook: &str,
        error: Option<&ProviderError>,
    ) -> Result<(), LedgerError> {
        let error = error.map(error_json);
        self.with(|conn| {
            conn.execute(
                &format!(
                    "UPDATE leases SET state = ?2, last_hook = ?3, last_error_json = ?4, updated_at = {NOW}
                     WHERE id = ?1"
                ),
                params![row, state.as_str(), hook, error.map(|error| error.to_string())],
            )
            .map(drop)
        })
    }

    /// Records the lease the provider returned (its id and metadata), in `state`.
    pub fn set_lease(
        &self,
        row: i64,
        state: LeaseState,
        hook: &str,
        lease: &Lease,
    ) -> Result<(), LedgerError> {
        let id = lease.provider_lease_id.as_ref().map(|id| id.to_string()).into_option();
        self.with(|conn| {
            conn.execute(
                &format!(
                    "UPDATE leases SET state = ?2, last_hook = ?3, last_error_json = NULL,
                        provider_lease_id = COALESCE(?4, provider_lease_id), metadata_json = ?5,
                        updated_at = {NOW}
                     WHERE id = ?1"
                ),
                params![row, state.as_str(), hook, id, lease.metadata_json.as_str()],
            )
            .map(drop)
        })
    }

    /// Removes a row: a lease the provider refused before any request was
    /// never this ledger's to track.
    pub fn forget(&self, row: i64) -> Result<(), LedgerError> {
        self.with(|conn| conn.execute("DELETE FROM leases WHERE id = ?1", [row]).map(drop))
    }

    /// Takes over a row for this process (a command acting on a lease a
    /// previous run recorded).
    pub fn adopt(&self, row: i64) -> Result<(), LedgerError> {
        self.with(|conn| {
            conn.execute(
                &format!("UPDATE leases SET pid = ?2, pid_start = ?3, updated_at = {NOW} WHERE id = ?1"),
                params![row, self.pid, self.start as i64],
            )
            .map(drop)
        })
    }

    /// One row.
    pub fn get(&self, row: i64) -> Result<Option<LeaseRecord>, LedgerError> {
        self.with(|conn| conn.query_row("SELECT * FROM leases WHERE id = ?1", [row], read_row).optional())
    }

    /// The latest row recording `provider_lease_id` for this company and
    /// environment.
    pub fn find(
        &self,
        provider_lease_id: &str,
        company_id: &str,
        environment_id: &str,
    ) -> Result<Option<LeaseRecord>, LedgerError> {
        self.with(|conn| {
            conn.query_row(
                "SELECT * FROM leases WHERE provider_lease_id = ?1 AND company_id = ?2
                   AND environment_id = ?3 ORDER BY id DESC LIMIT 1",
                params![provider_lease_id, company_id, environment_id],
                read_row,
            )
            .optional()
        })
    }

    /// Every row, oldest first.
    pub fn list(&self) -> Result<Vec<LeaseRecord>, LedgerError> {
        self.with(|conn| {
            let mut statement = conn.prepare("SELECT * FROM leases ORDER BY id")?;
            let rows = statement.query_map([], read_row)?.collect::<rusqlite::Result<Vec<_>>>();
            rows
        })
    }

    /// Rows `sweep` must act on: left behind (see [`LeaseState::is_left_behind`],
    /// plus paused lifecycle leases), and either owned by `process` or, when
    /// `process` is `None`, by a process that is no longer running.
    pub fn left_behind(&self, process: Option<u32>) -> Result<Vec<LeaseRecord>, LedgerError> {
        Ok(self
            .list()?
            .into_iter()
            .filter(|record| {
                record.state.is_left_behind()
                    || (record.state == LeaseState::Paused && record.owner == Owner::Lifecycle)
            })
            .filter(|record| match process {
                Some(pid) => record.pid == pid && record.owner_start == self.start,
                None => !record.owner_is_running(),
            })
            .collect())
    }
}

fn error_json(error: &ProviderError) -> Value {
    json!({"kind": error.kind.to_string(), "message": error.message.as_str()})
}

fn read_row(row: &Row<'_>) -> rusqlite::Result<LeaseRecord> {
    let json = |text: Option<String>| text.and_then(|text| serde_json::from_str::<Value>(&text).ok());
    let state: String = row.get("state")?;
    Ok(LeaseRecord {
        id: row.get("id")?,
        owner: Owner::parse(&row.get::<_, String>("owner")?),
        run_id: row.get("run_id")?,
        state: state.parse().unwrap_or(LeaseState::CleanupFailed),
        provider_lease_id: row.get("provider_lease_id")?,
        metadata: json(row.get("metadata_json")?),
        env: LeaseEnv {
            driver_key: row.get("driver_key")?,
            company_id: row.get("company_id")?,
            environment_id: row.get("environment_id")?,
            config: json(row.get("config_json")?).unwrap_or(Value::Null),
            embedded_sim: row.get("embedded_sim")?,
        },
        last_hook: row.get("last_hook")?,
        last_error: json(row.get("last_error_json")?),
        pid: row.get("pid")?,
        owner_start: row.get::<_, i64>("pid_start")? as u64,
        created_at: row.get("created_at")?,
        updated_at: row.get("updated_at")?,
    })
}

/// Which process owns a row: a pid plus its start time, so a reused pid is
/// not mistaken for the owner.
mod process {
    /// The start time (clock ticks since boot) of process `pid`, if it runs.
    pub fn start_time(pid: u32) -> Option<u64> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // Field 22, counted after the parenthesised command name (which may hold spaces).
        let after_name = &stat[stat.rfind(')')? + 1..];
        let start = after_name.split_whitespace().nth(19)?.parse().ok()?;
        // A zombie has exited: its leases are no longer in use.
        let state = after_name.split_whitespace().next()?;
        (state != "Z").then_some(start)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use provider_abi::ErrorKind;

    fn env() -> LeaseEnv {
        LeaseEnv {
            driver_key: "createos".into(),
            company_id: "c".into(),
            environment_id: "e".into(),
            config: json!({"shape": "s-1vcpu-1gb"}),
            embedded_sim: false,
        }
    }

    #[test]
    fn rows_record_every_state() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = Ledger::open(&dir.path().join("nested/ledger.sqlite3")).unwrap();
        let row = ledger.begin(Owner::Command, "run", &env(), "acquire_lease").unwrap();
        let lease = Lease {
            provider_lease_id: Some("sb-1".into()).into(),
            metadata_json: r#"{"marker":"m"}"#.into(),
            ..Default::default()
        };
        ledger.set_lease(row, LeaseState::Active, "acquire_lease", &lease).unwrap();
        for state in LeaseState::ALL {
            ledger.set_state(row, state, "release_lease", None).unwrap();
            assert_eq!(ledger.get(row).unwrap().unwrap().state, state);
        }
        let error = ProviderError::new(ErrorKind::CLEANUP_UNCONFIRMED, "unconfirmed");
        ledger.set_state(row, LeaseState::Unconfirmed, "release_lease", Some(&error)).unwrap();
        let record = ledger.find("sb-1", "c", "e").unwrap().unwrap();
        assert_eq!(record.last_error.unwrap()["kind"], "cleanup_unconfirmed");
        assert_eq!(record.metadata.unwrap()["marker"], "m");
        assert_eq!(record.env.config, json!({"shape": "s-1vcpu-1gb"}));
    }

    #[test]
    fn a_forgotten_row_is_gone() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = Ledger::open(&dir.path().join("ledger.sqlite3")).unwrap();
        let kept = ledger.begin(Owner::Command, "run", &env(), "hold").unwrap();
        let refused = ledger.begin(Owner::Command, "run", &env(), "hold").unwrap();
        ledger.forget(refused).unwrap();
        assert!(ledger.get(refused).unwrap().is_none());
        assert!(ledger.get(kept).unwrap().is_some());
    }

    #[test]
    fn left_behind_rows_depend_on_state_owner_and_process() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = Ledger::open(&dir.path().join("ledger.sqlite3")).unwrap();
        let states = [
            (Owner::Command, LeaseState::Paused, false),
            (Owner::Lifecycle, LeaseState::Paused, true),
            (Owner::Command, LeaseState::Destroyed, false),
            (Owner::Command, LeaseState::Active, true),
            (Owner::Probe, LeaseState::Acquiring, true),
            (Owner::Command, LeaseState::CleanupFailed, true),
        ];
        for (owner, state, _) in states {
            let row = ledger.begin(owner, "run", &env(), "acquire_lease").unwrap();
            ledger.set_state(row, state, "h", None).unwrap();
        }
        let mine = ledger.left_behind(Some(ledger.pid())).unwrap();
        let expected: Vec<_> =
            states.iter().filter(|(_, _, swept)| *swept).map(|(_, state, _)| *state).collect();
        assert_eq!(mine.iter().map(|record| record.state).collect::<Vec<_>>(), expected);
        assert!(ledger.left_behind(None).unwrap().is_empty(), "this process is running");
    }
}
