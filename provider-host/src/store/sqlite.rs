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
//!
//! A ledger file is marked with its own `application_id` and schema version:
//! a SQLite file of another application is refused, never extended, and a
//! ledger of a newer schema is refused rather than misread. Any number of
//! processes may open (and create) one ledger at once: every statement waits
//! for the others' locks. Commands that only read use
//! [`Ledger::open_read_only`], which needs no write access at all.

use crate::{
    group_commit::{self, Committer, Waiting},
    memory::SavedEntry,
    store::{
        lease_id, saved_entry, stored_error, unix_ms, CommitCounts, Done, LeaseEnv, LeaseRecord, LeaseState,
        LeaseStore, LedgerError, Owner, Problem, Whose, Write, FORGET_MEMORY, MEMORY, SAVE_MEMORY,
    },
};
use provider_abi::MemoryEntry;
use rusqlite::{params, Connection, OpenFlags, Row};
use serde_json::Value;
use std::{
    path::{Path, PathBuf},
    sync::Mutex,
    time::{Duration, SystemTime},
};

/// The ledger: one SQLite database, shared by every thread of the harness.
///
/// Writes go through a committer thread with a connection of its own, which
/// commits the writes of concurrent callers together (group commit); reads,
/// and the rare writes that answer more than a number, use the other
/// connection.
pub struct Ledger {
    path: PathBuf,
    conn: Mutex<Connection>,
    /// `None` for a ledger opened read-only.
    committer: Option<Committer>,
    pid: u32,
    start: u64,
    created_dir: Option<PathBuf>,
}

/// Marks a SQLite file as a lease ledger (`PRAGMA application_id`): "HHLg".
const APPLICATION_ID: i64 = 0x4848_4c67;

/// The version of [`SCHEMA`] (`PRAGMA user_version`); a ledger of a newer
/// version is refused rather than misread, one of an older version is
/// brought to this one by [`MIGRATIONS`] when opened for writing.
const SCHEMA_VERSION: i64 = 2;

/// The statements that bring a ledger of the version before each to that
/// version, in order: (version, SQL).
const MIGRATIONS: &[(i64, &str)] = &[
    // Version 2: the flag says where the API lived, not what it was.
    (2, "ALTER TABLE leases RENAME COLUMN embedded_sim TO api_in_process"),
];

/// The columns of the `leases` table of version 1, in order, to recognise
/// a ledger written before ledgers carried [`APPLICATION_ID`] (which is
/// version 1).
const UNMARKED_COLUMNS: &str = "id owner run_id state provider_lease_id metadata_json driver_key company_id \
    environment_id config_json embedded_sim last_hook last_error_json pid pid_start created_at updated_at";

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
    api_in_process    INTEGER NOT NULL,
    last_hook         TEXT NOT NULL,
    last_error_json   TEXT,
    pid               INTEGER NOT NULL,
    pid_start         INTEGER NOT NULL,
    created_at        TEXT NOT NULL,
    updated_at        TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS leases_state ON leases(state);
CREATE INDEX IF NOT EXISTS leases_provider_lease_id ON leases(provider_lease_id);
CREATE INDEX IF NOT EXISTS leases_live_owners ON leases(pid, pid_start, state) WHERE state <> 'destroyed';
CREATE TABLE IF NOT EXISTS hosts (
    pid               INTEGER NOT NULL,
    pid_start         INTEGER NOT NULL,
    PRIMARY KEY (pid, pid_start)
);
CREATE TABLE IF NOT EXISTS provider_memory (
    provider_id       TEXT NOT NULL,
    key               TEXT NOT NULL,
    value             BLOB NOT NULL,
    saved_at_ms       INTEGER NOT NULL,
    PRIMARY KEY (provider_id, key)
);
";

/// The owners of the rows not destroyed (read from `leases_live_owners`).
const LIVE_OWNERS: &str = "SELECT DISTINCT pid, pid_start FROM leases WHERE state <> 'destroyed'";
/// One owner's rows not destroyed (found through `leases_live_owners`).
const LIVE_ROWS_OF_OWNER: &str =
    "SELECT * FROM leases WHERE state <> 'destroyed' AND pid = ?1 AND pid_start = ?2 ORDER BY id";

const NOW: &str = "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')";

/// Runs one statement, compiled once per connection: the hooks of every
/// lease write the same few statements, and parsing them each time was 8 %
/// of the harness's CPU in a soak (`perf`).
fn execute_cached(conn: &Connection, sql: &str, params: impl rusqlite::Params) -> rusqlite::Result<usize> {
    conn.prepare_cached(sql)?.execute(params)
}

impl Ledger {
    /// Opens (creating if needed) the ledger at `path`, and its directory.
    ///
    /// The busy timeout applies from the first statement, so any number of
    /// processes may create the same new ledger at once. A SQLite file of
    /// another schema is refused, never extended with the ledger's tables.
    pub fn open(path: &Path) -> Result<Ledger, LedgerError> {
        let open = || -> Result<Ledger, Problem> {
            let created_dir = path.parent().filter(|dir| !dir.as_os_str().is_empty() && !dir.exists());
            if let Some(dir) = created_dir {
                std::fs::create_dir_all(dir)
                    .map_err(|source| Problem::Directory { dir: dir.into(), source })?;
            }
            let conn = Connection::open(path)?;
            // First of all: every later statement, the schema's included,
            // waits for another process's lock instead of failing at once.
            conn.busy_timeout(BUSY_TIMEOUT)?;
            prepare_schema(&conn)?;
            // After the schema check, so a foreign database is left untouched.
            enter_wal_mode(&conn)?;
            let reader = Connection::open(path)?;
            for conn in [&conn, &reader] {
                conn.busy_timeout(BUSY_TIMEOUT)?;
                conn.pragma_update(None, "synchronous", "FULL")?;
                conn.pragma_update(None, "cache_size", -PAGE_CACHE_KIB)?;
            }
            let mut ledger = Ledger::with_connection(path, reader, created_dir.map(Path::to_path_buf));
            ledger.committer = Some(Committer::start(conn).map_err(Problem::Io)?);
            Ok(ledger)
        };
        let ledger = open().map_err(|problem| LedgerError::at(path.display(), problem))?;
        // Registers this process as a host of the ledger (for `budget_group`).
        let host = (ledger.pid, ledger.start as i64);
        ledger.with(|conn| {
            conn.execute("INSERT OR IGNORE INTO hosts (pid, pid_start) VALUES (?1, ?2)", host)
        })?;
        Ok(ledger)
    }

    /// Opens the ledger at `path` for reading only: it needs no write access
    /// to the file or its directory, and never creates or changes either.
    /// `None` when there is no ledger there yet (no file, or an empty one).
    ///
    /// A ledger in WAL mode is read through its `-shm` file, which SQLite
    /// creates when the ledger is first opened after being closed. When it
    /// cannot (a directory this process may not write, so no writer of this
    /// user has the ledger open), the file is read as immutable: should
    /// another user write it meanwhile, the listing may miss that change.
    pub fn open_read_only(path: &Path) -> Result<Option<Ledger>, LedgerError> {
        let fail = |problem: Problem| LedgerError::at(path.display(), problem);
        if !path.try_exists().map_err(|error| fail(Problem::Io(error)))? {
            return Ok(None);
        }
        let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let open = |uri: &Path, flags: OpenFlags| -> Result<Option<Connection>, Problem> {
            let conn = Connection::open_with_flags(uri, flags)?;
            conn.busy_timeout(BUSY_TIMEOUT)?;
            Ok(identify(&conn)?.map(|_| conn))
        };
        let conn = match open(path, flags) {
            Err(Problem::Sqlite(error))
                if matches!(
                    error.sqlite_error_code(),
                    Some(rusqlite::ErrorCode::CannotOpen | rusqlite::ErrorCode::ReadOnly)
                ) =>
            {
                // A `file:` URI (percent-encoded) holds only absolute paths.
                let absolute = std::path::absolute(path).map_err(|error| fail(Problem::Io(error)))?;
                let uri = url::Url::from_file_path(absolute).expect("an absolute path");
                open(Path::new(&format!("{uri}?immutable=1")), flags | OpenFlags::SQLITE_OPEN_URI)
            }
            other => other,
        };
        Ok(conn.map_err(fail)?.map(|conn| Ledger::with_connection(path, conn, None)))
    }

    fn with_connection(path: &Path, conn: Connection, created_dir: Option<PathBuf>) -> Ledger {
        let pid = std::process::id();
        Ledger {
            path: path.to_path_buf(),
            conn: Mutex::new(conn),
            committer: None,
            pid,
            start: start_time(pid).unwrap_or(0),
            created_dir,
        }
    }

    /// The directory [`Ledger::open`] created for the ledger, if it did.
    pub fn created_dir(&self) -> Option<&Path> {
        self.created_dir.as_deref()
    }

    fn with<T>(&self, f: impl FnOnce(&Connection) -> rusqlite::Result<T>) -> Result<T, LedgerError> {
        f(&crate::lock(&self.conn)).map_err(|source| LedgerError::at(self.path.display(), source))
    }

    /// Sends `write` to the committer, `waiting` as its caller does; `done`
    /// gets its outcome. A ledger opened read-only runs it at once, and it
    /// fails as a write to a read-only database does.
    fn send(&self, write: Write, done: Done, waiting: Waiting) {
        let write = self.statements(write);
        let Some(committer) = &self.committer else { return done(self.with(write)) };
        let path = self.path.clone();
        let answer = move |outcome: group_commit::Outcome| {
            done(outcome.map_err(|error| LedgerError::at(path.display(), Problem::Store(error))))
        };
        committer.send(write, Box::new(answer), waiting)
    }

    /// The statements of `write`, for the committer: the new row's id for
    /// [`Write::Begin`], else 0.
    fn statements(&self, write: Write) -> group_commit::Write {
        // How many writers are in flight decides how long a transaction
        // waits for company: a begin starts a lease's writes, a lease
        // recorded destroyed (or forgotten) ends them.
        if let Some(committer) = &self.committer {
            match &write {
                Write::Begin { .. } => committer.writer_started(),
                Write::SetState { state: LeaseState::Destroyed, .. }
                | Write::SetLease { state: LeaseState::Destroyed, .. }
                | Write::Forget(_) => committer.writer_finished(),
                _ => {}
            }
        }
        let (pid, start) = (self.pid, self.start as i64);
        match write {
            Write::Begin { owner, run_id, env, hook } => Box::new(move |conn| {
                execute_cached(
                    conn,
                    &format!(
                        "INSERT INTO leases (owner, run_id, state, driver_key, company_id, environment_id,
                            config_json, api_in_process, last_hook, pid, pid_start, created_at, updated_at)
                         VALUES (?1, ?2, 'acquiring', ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, {NOW}, {NOW})"
                    ),
                    params![
                        owner.as_str(),
                        run_id,
                        env.driver_key,
                        env.company_id,
                        env.environment_id,
                        env.config.to_string(),
                        env.api_in_process,
                        hook,
                        pid,
                        start,
                    ],
                )?;
                Ok(conn.last_insert_rowid())
            }),
            Write::SetState { row, state, hook, error } => statement(
                format!(
                    "UPDATE leases SET state = ?2, last_hook = ?3, last_error_json = ?4, updated_at = {NOW}
                     WHERE id = ?1"
                ),
                (row, state.as_str(), hook, error.as_ref().map(stored_error)),
            ),
            Write::SetLease { row, state, hook, lease } => statement(
                format!(
                    "UPDATE leases SET state = ?2, last_hook = ?3, last_error_json = NULL,
                        provider_lease_id = COALESCE(?4, provider_lease_id), metadata_json = ?5,
                        updated_at = {NOW}
                     WHERE id = ?1"
                ),
                (row, state.as_str(), hook, lease_id(&lease), lease.metadata_json.to_string()),
            ),
            Write::Restore(record) => statement(
                format!(
                    "UPDATE leases SET state = ?2, last_hook = ?3, last_error_json = ?4, pid = ?5,
                        pid_start = ?6, updated_at = {NOW}
                     WHERE id = ?1"
                ),
                (
                    record.id,
                    record.state.as_str(),
                    record.last_hook,
                    record.last_error.as_ref().map(Value::to_string),
                    record.pid,
                    record.owner_start as i64,
                ),
            ),
            Write::Forget(row) => statement("DELETE FROM leases WHERE id = ?1".to_owned(), (row,)),
            Write::Adopt(row) => statement(
                format!("UPDATE leases SET pid = ?2, pid_start = ?3, updated_at = {NOW} WHERE id = ?1"),
                (row, pid, start),
            ),
        }
    }
}

impl LeaseStore for Ledger {
    fn host_name(&self) -> String {
        format!("process {}", self.pid)
    }

    fn patrol_interval(&self) -> Duration {
        // The kernel says at once when a process of this machine is gone.
        Duration::from_secs(2)
    }

    /// Committed, with the writes of other callers, before it returns.
    fn write(&self, write: Write) -> Result<i64, LedgerError> {
        let (sender, answer) = std::sync::mpsc::sync_channel(1);
        self.send(write, Box::new(move |outcome| drop(sender.send(outcome))), Waiting::Thread);
        answer.recv().unwrap_or_else(|_| Err(LedgerError::at(self.path.display(), Problem::Closed)))
    }

    fn submit(&self, write: Write, done: Done) {
        self.send(write, done, Waiting::Task)
    }

    fn queue(&self, write: Write, executed: Done) {
        self.send(write, executed, Waiting::Queued)
    }

    fn commit_counts(&self) -> Option<CommitCounts> {
        Some(self.committer.as_ref().map(Committer::counts).unwrap_or_default())
    }

    /// What provider `provider_id` remembered, newest first
    /// ([`crate::store::LeaseStore::memory`]).
    fn memory(&self, provider_id: &str) -> Result<Vec<SavedEntry>, LedgerError> {
        self.with(|conn| {
            query(conn, MEMORY, [provider_id], |row| Ok(saved_entry(row.get(0)?, row.get(1)?, row.get(2)?)))
        })
    }

    /// Keeps `entries` of provider `provider_id` in one transaction
    /// ([`crate::store::LeaseStore::save_memory`]).
    fn save_memory(
        &self,
        provider_id: &str,
        entries: &[MemoryEntry],
        saved_at: SystemTime,
        forget_before: SystemTime,
        keep: usize,
    ) -> Result<(), LedgerError> {
        self.with(|conn| {
            let transaction = conn.unchecked_transaction()?;
            for entry in entries {
                let entry = (provider_id, entry.key.as_str(), entry.value.as_slice(), unix_ms(saved_at));
                execute_cached(&transaction, SAVE_MEMORY, entry)?;
            }
            execute_cached(&transaction, FORGET_MEMORY, (provider_id, unix_ms(forget_before), keep as i64))?;
            transaction.commit()
        })
    }

    /// One row.
    fn get(&self, row: i64) -> Result<Option<LeaseRecord>, LedgerError> {
        Ok(self.with(|conn| query(conn, "SELECT * FROM leases WHERE id = ?1", [row], read_row))?.pop())
    }

    /// The latest row recording `provider_lease_id` for this company and
    /// environment.
    fn find(
        &self,
        provider_lease_id: &str,
        company_id: &str,
        environment_id: &str,
    ) -> Result<Option<LeaseRecord>, LedgerError> {
        let sql = "SELECT * FROM leases WHERE provider_lease_id = ?1 AND company_id = ?2
                     AND environment_id = ?3 ORDER BY id DESC LIMIT 1";
        let key = (provider_lease_id, company_id, environment_id);
        Ok(self.with(|conn| query(conn, sql, key, read_row))?.pop())
    }

    /// Every row, oldest first.
    fn list(&self) -> Result<Vec<LeaseRecord>, LedgerError> {
        self.with(|conn| query(conn, "SELECT * FROM leases ORDER BY id", [], read_row))
    }

    /// Rows `sweep` may act on (see [`LeaseRecord::is_left_behind`]), owned
    /// by this process or by processes that are no longer running (`whose`).
    /// On one machine the kernel is the heartbeat: a process that exited is
    /// gone at once, and a reused pid is told apart by its start time.
    fn left_behind(&self, whose: Whose) -> Result<Vec<LeaseRecord>, LedgerError> {
        // Destroyed rows (most of a long-lived ledger) are never read: both
        // queries read the partial index `leases_live_owners`, which holds
        // the rest (SQLite cannot use an index for `<>`, and a full scan
        // every two seconds made a patrol's cost grow with the ledger's
        // history). Only the rows of the owners asked about are read: a
        // patrol asks the kernel about each owner once, not about each row,
        // and reads no row while every owner runs.
        let owners: Vec<(u32, u64)> = match whose {
            Whose::ThisHost => vec![(self.pid, self.start)],
            Whose::Gone => self
                .with(|conn| query(conn, LIVE_OWNERS, [], owner))?
                .into_iter()
                .filter(|&(pid, start)| !runs(pid, start))
                .collect(),
        };
        let mut left = Vec::new();
        for (pid, start) in owners {
            let rows = self.with(|conn| query(conn, LIVE_ROWS_OF_OWNER, (pid, start as i64), read_row))?;
            left.extend(rows.into_iter().filter(LeaseRecord::is_left_behind));
        }
        left.sort_by_key(|record| record.id);
        Ok(left)
    }

    /// The running processes that opened this ledger, this one included
    /// (at least 1); the registrations of processes that exited are removed.
    fn budget_group(&self) -> Result<usize, LedgerError> {
        self.with(|conn| {
            let mut live = 0;
            for (pid, start) in query(conn, "SELECT pid, pid_start FROM hosts", [], owner)? {
                if (pid, start) == (self.pid, self.start) || runs(pid, start) {
                    live += 1;
                } else {
                    conn.execute("DELETE FROM hosts WHERE pid = ?1 AND pid_start = ?2", (pid, start as i64))?;
                }
            }
            Ok(live)
        })
        .map(|live: usize| live.max(1))
    }

    /// Takes over, in one transaction, those of `records` still owned by the
    /// process they name while it is not running, and returns them as now
    /// owned by this process. Two sweepers offered the same rows share them
    /// out: each row goes to exactly one.
    fn take_over(&self, records: &[LeaseRecord]) -> Result<Vec<LeaseRecord>, LedgerError> {
        self.with(|conn| {
            let tx = rusqlite::Transaction::new_unchecked(conn, rusqlite::TransactionBehavior::Immediate)?;
            let sql = format!(
                "UPDATE leases SET pid = ?2, pid_start = ?3, updated_at = {NOW}
                 WHERE id = ?1 AND pid = ?4 AND pid_start = ?5 RETURNING *"
            );
            let mut taken = Vec::new();
            for record in records.iter().filter(|record| !runs(record.pid, record.owner_start)) {
                let owners =
                    params![record.id, self.pid, self.start as i64, record.pid, record.owner_start as i64];
                taken.extend(query(&tx, &sql, owners, read_row)?);
            }
            tx.commit()?;
            Ok(taken)
        })
    }
}

/// How long a statement waits for another connection's lock.
const BUSY_TIMEOUT: Duration = Duration::from_secs(30);

/// The most the ledger's connection keeps of the file in memory (SQLite's
/// default is 2 MiB). Rows in flight are the newest and share pages, so
/// this holds the pages of about 20,000 of them (with SQLite's default, at
/// 10,000 lifecycles in flight every ledger write reads its page back from
/// the kernel).
/// Pages are cached only once read, so a small ledger costs no more.
const PAGE_CACHE_KIB: i64 = 16 * 1024;

/// Reads what the file at `conn` holds, without changing it: the version
/// of the ledger it is (an unmarked one, written before ledgers carried
/// [`APPLICATION_ID`], is of version 1), `None` for a new (or empty) file.
/// Anything else, or a ledger newer than this build, is refused.
fn identify(conn: &Connection) -> Result<Option<i64>, Problem> {
    let application_id: i64 = conn.query_row("PRAGMA application_id", [], |row| row.get(0))?;
    let version: i64 = conn.query_row("PRAGMA user_version", [], |row| row.get(0))?;
    let tables = query(
        conn,
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name",
        [],
        |row| row.get::<_, String>(0),
    )?;
    let foreign = match application_id {
        APPLICATION_ID if version > SCHEMA_VERSION => {
            return Err(Problem::Newer { what: "schema version", found: version, known: SCHEMA_VERSION })
        }
        APPLICATION_ID => return Ok(Some(version)),
        0 if tables.is_empty() && version == 0 => return Ok(None),
        0 if tables.is_empty() => format!("user version {version}"),
        0 => {
            let sql = "SELECT name FROM pragma_table_info('leases') ORDER BY cid";
            if tables == ["leases"]
                && version == 0
                && query(conn, sql, [], |row| row.get::<_, String>(0))?.join(" ") == UNMARKED_COLUMNS
            {
                return Ok(Some(1));
            }
            let shown: Vec<&str> = tables.iter().take(5).map(String::as_str).collect();
            let more = if tables.len() > shown.len() { ", ..." } else { "" };
            format!("tables {}{more}", shown.join(", "))
        }
        _ => format!("application id {application_id:#x}"),
    };
    Err(Problem::Foreign(foreign))
}

/// Checks what the file holds and creates, marks or migrates the ledger's
/// schema, in one `IMMEDIATE` transaction (rolled back unless it commits):
/// a concurrent opener waits for it, then finds the schema made.
fn prepare_schema(conn: &Connection) -> Result<(), Problem> {
    let tx = rusqlite::Transaction::new_unchecked(conn, rusqlite::TransactionBehavior::Immediate)?;
    // A new file gets the current schema; an older one, the [`MIGRATIONS`]
    // newer than its version.
    let found = identify(&tx)?;
    for (_, sql) in MIGRATIONS.iter().filter(|(to, _)| *to > found.unwrap_or(SCHEMA_VERSION)) {
        tx.execute_batch(sql)?;
    }
    // Writes nothing when the tables exist.
    tx.execute_batch(SCHEMA)?;
    if found != Some(SCHEMA_VERSION) {
        tx.pragma_update(None, "application_id", APPLICATION_ID)?;
        tx.pragma_update(None, "user_version", SCHEMA_VERSION)?;
    }
    Ok(tx.commit()?)
}

/// Puts the database in WAL mode, waiting as long as [`BUSY_TIMEOUT`] for the
/// other connections' locks.
///
/// SQLite's busy handler does not cover this one statement: the switch reads
/// the header under a shared lock, then upgrades to an exclusive one, and an
/// upgrade fails at once while another connection reads (waiting there could
/// deadlock two upgraders). Ledgers opened at the same instant all meet here,
/// so the switch is retried on `SQLITE_BUSY` with the busy handler's own
/// back-off, after checking whether another connection already made it.
fn enter_wal_mode(conn: &Connection) -> rusqlite::Result<()> {
    let mut backoff_ms = [1, 2, 5, 10, 15, 20, 25].into_iter();
    let deadline = std::time::Instant::now() + BUSY_TIMEOUT;
    loop {
        let mode: String = conn.query_row("PRAGMA journal_mode", [], |row| row.get(0))?;
        if mode.eq_ignore_ascii_case("wal") {
            return Ok(());
        }
        match conn.pragma_update(None, "journal_mode", "WAL") {
            Err(error)
                if error.sqlite_error_code() == Some(rusqlite::ErrorCode::DatabaseBusy)
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(backoff_ms.next().unwrap_or(50)));
            }
            other => return other,
        }
    }
}

/// True while process `pid`, started at `start`, is running on this
/// machine: a pid plus its start time name a row's owner, so a reused pid
/// is not mistaken for it.
fn runs(pid: u32, start: u64) -> bool {
    start_time(pid) == Some(start)
}

/// The start time (clock ticks since boot) of process `pid`, if it runs.
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Field 22, counted after the parenthesised command name (which may hold spaces).
    let after_name = &stat[stat.rfind(')')? + 1..];
    let start = after_name.split_whitespace().nth(19)?.parse().ok()?;
    // A zombie has exited: its leases are no longer in use.
    let state = after_name.split_whitespace().next()?;
    (state != "Z").then_some(start)
}

/// The rows `sql` selects with `params`, each read by `read`.
fn query<T>(
    conn: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
    read: impl FnMut(&Row<'_>) -> rusqlite::Result<T>,
) -> rusqlite::Result<Vec<T>> {
    let mut statement = conn.prepare_cached(sql)?;
    let rows = statement.query_map(params, read)?.collect();
    rows
}

/// A row's owner: a process and its start time.
fn owner(row: &Row<'_>) -> rusqlite::Result<(u32, u64)> {
    Ok((row.get(0)?, row.get::<_, i64>(1)? as u64))
}

/// A write of one statement, answering 0.
fn statement(sql: String, params: impl rusqlite::Params + Send + 'static) -> group_commit::Write {
    Box::new(move |conn| execute_cached(conn, &sql, params).map(|_| 0))
}

fn read_row(row: &Row<'_>) -> rusqlite::Result<LeaseRecord> {
    let json = |text: Option<String>| text.and_then(|text| serde_json::from_str::<Value>(&text).ok());
    let state: String = row.get("state")?;
    Ok(LeaseRecord {
        id: row.get("id")?,
        owner: row.get::<_, String>("owner")?.parse().unwrap_or(Owner::Command),
        run_id: row.get("run_id")?,
        state: state.parse().unwrap_or(LeaseState::CleanupFailed),
        provider_lease_id: row.get("provider_lease_id")?,
        metadata: json(row.get("metadata_json")?),
        env: LeaseEnv {
            driver_key: row.get("driver_key")?,
            company_id: row.get("company_id")?,
            environment_id: row.get("environment_id")?,
            config: json(row.get("config_json")?).unwrap_or(Value::Null),
            api_in_process: match row.get("api_in_process") {
                // A ledger opened read-only is never migrated: one of version
                // 1 names the column as it did then.
                Err(rusqlite::Error::InvalidColumnName(_)) => row.get("embedded_sim")?,
                other => other?,
            },
        },
        last_hook: row.get("last_hook")?,
        last_error: json(row.get("last_error_json")?),
        pid: row.get("pid")?,
        host_id: None,
        owner_start: row.get::<_, i64>("pid_start")? as u64,
        created_at: row.get("created_at")?,
        updated_at: row.get("updated_at")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The query plan of `sql` on a new ledger, one line per step.
    fn plan(sql: &str) -> String {
        let dir = tempfile::tempdir().unwrap();
        let ledger = Ledger::open(&dir.path().join("ledger.sqlite3")).unwrap();
        let steps: Vec<String> = ledger
            .with(|conn| {
                let mut statement = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}"))?;
                let steps = statement.query_map([], |row| row.get::<_, String>(3))?.collect();
                steps
            })
            .unwrap();
        steps.join("\n")
    }

    /// A patrol runs these every two seconds for as long as a host runs:
    /// they must read the index of live rows, never every row of the
    /// ledger's history.
    #[test]
    fn the_patrols_queries_never_scan_destroyed_rows() {
        let owners = plan(LIVE_OWNERS);
        assert_eq!(owners, "SCAN leases USING COVERING INDEX leases_live_owners");
        let rows = plan(&LIVE_ROWS_OF_OWNER.replace("?1", "1").replace("?2", "2"));
        assert!(
            rows.contains("SEARCH leases USING INDEX leases_live_owners (pid=? AND pid_start=?)"),
            "{rows}"
        );
    }
}
