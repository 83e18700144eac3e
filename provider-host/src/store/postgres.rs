//! The fleet's lease ledger, in PostgreSQL: the same rows as the SQLite
//! [`crate::store::sqlite::Ledger`], owned by hosts that renew a heartbeat.
//!
//! Every write is its own autocommitted statement, so it is durable
//! (`synchronous_commit` on, the server's default) before it returns, and so
//! before the hook it guards. A host registers a row in `hosts` when it opens
//! the ledger and renews its expiry on a background thread every third of
//! it (so it stays alive through two failed renewals in a row); a host
//! whose expiry passed (it was killed, or lost
//! the database for longer than the expiry) is gone, and its rows are taken
//! over by a survivor with `SELECT ... FOR UPDATE SKIP LOCKED` and a check
//! that each row's owner is still the gone host: one survivor gets each row.
//! The owner is fenced out: every write is conditional on this host still
//! owning the row, so a host that comes back after its rows were taken over
//! gets an error instead of undoing a survivor's work. Times are the
//! database's clock, never the hosts'.
//!
//! The schema is migrated at open (`migrations/postgres/*.sql`, applied in
//! order inside one transaction under an advisory lock, so hosts starting at
//! once migrate once); a database whose `leases` table is not a ledger's, or
//! whose migrations are newer than this build's, is refused untouched.

use crate::{
    memory::SavedEntry,
    store::{
        lease_id, saved_entry, stored_error, unix_ms, LeaseStore, Write, FORGET_MEMORY, MEMORY, SAVE_MEMORY,
    },
    store::{LeaseEnv, LeaseRecord, LeaseState, LedgerError, Owner, Problem, Whose},
};
use postgres::{types::ToSql, GenericClient, NoTls, Row};
use provider_abi::MemoryEntry;
use r2d2_postgres::{r2d2, PostgresConnectionManager};
use serde_json::Value;
use std::{
    sync::{
        mpsc::{self, RecvTimeoutError},
        LazyLock,
    },
    thread::JoinHandle,
    time::{Duration, SystemTime},
};

/// The migrations, in order: (version, SQL).
const MIGRATIONS: &[(i32, &str)] = &[
    (1, include_str!("../../migrations/postgres/0001_hosts_and_leases.sql")),
    (2, include_str!("../../migrations/postgres/0002_api_in_process.sql")),
];

/// Tables and indexes added after the migrations: created where missing,
/// under the migration lock, and never counted as a migration, so hosts of
/// an older build still open the ledger (they refuse newer migrations) and
/// never read them; an index changes no row's meaning. Building one locks
/// `leases` against writes once, on the first open by a build that has it.
const ADDED: &[&str] = &[
    // What providers learnt, kept across processes (`crate::memory`).
    "CREATE TABLE IF NOT EXISTS provider_memory (
        provider_id TEXT NOT NULL,
        key         TEXT NOT NULL,
        value       BYTEA NOT NULL,
        saved_at_ms BIGINT NOT NULL,
        PRIMARY KEY (provider_id, key)
    )",
    // What a patrol reads every half expiry: the rows not destroyed, by
    // owner, never the whole ledger's history.
    "CREATE INDEX IF NOT EXISTS leases_live_owners ON leases (host_id) WHERE state <> 'destroyed'",
];

/// The advisory lock migrations hold ("HHLg", as the SQLite ledger's application id).
const MIGRATION_LOCK: i64 = 0x4848_4c67;

/// The columns of a [`LeaseRecord`], from `leases l`.
const COLUMNS: &str = "l.id, l.owner, l.run_id, l.state, l.provider_lease_id, l.metadata_json, l.driver_key,
    l.company_id, l.environment_id, l.config_json, l.api_in_process, l.last_hook, l.last_error_json,
    l.host_id, l.pid,
    to_char(l.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"') AS created_at,
    to_char(l.updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"') AS updated_at";

/// The rows not destroyed of hosts whose heartbeat expired (read through
/// `leases_live_owners`), of `leases l`.
const LIVE_ROWS_OF_GONE_HOSTS: &str = "WHERE l.state <> 'destroyed' AND NOT EXISTS
       (SELECT 1 FROM hosts h WHERE h.host_id = l.host_id AND h.expires_at >= now())
     ORDER BY l.id";

type Pool = r2d2::Pool<PostgresConnectionManager<NoTls>>;

/// What a [`PgLedger`] is opened with: how long this host stays alive
/// without a renewal, and the connections in the pool.
pub type PgOptions = super::StoreOptions;

/// The lease ledger in a PostgreSQL database, shared by a fleet of hosts.
pub struct PgLedger {
    /// Taken only by `drop`, to close the connections off an async runtime.
    pool: Option<Pool>,
    location: String,
    host_id: String,
    pid: u32,
    expiry: Duration,
    /// The thread renewing this host's heartbeat, and the sender whose drop
    /// stops it.
    heartbeat: Option<(mpsc::Sender<()>, JoinHandle<()>)>,
}

/// `url` as shown in messages: its password (in the user part or a
/// `password` parameter) replaced by `***`. Works on the text, so a URL the
/// driver would refuse is redacted too.
pub fn redacted(url: &str) -> String {
    let (head, query) = url.split_once('?').map_or((url, None), |(head, query)| (head, Some(query)));
    // In the authority (from `://` to the next `/`), what follows the first
    // `:` of the user part (up to the last `@`).
    let password = head.find("://").map(|at| at + 3).and_then(|start| {
        let (credentials, _) = head[start..].split('/').next()?.rsplit_once('@')?;
        Some(start + credentials.find(':')? + 1..start + credentials.len())
    });
    let mut shown = head.to_owned();
    if let Some(password) = password {
        shown.replace_range(password, "***");
    }
    if let Some(query) = query {
        let pairs: Vec<&str> = query
            .split('&')
            .map(|pair| if pair.starts_with("password=") { "password=***" } else { pair })
            .collect();
        shown = format!("{shown}?{}", pairs.join("&"));
    }
    shown
}

/// The connection settings of `url`, with a connect timeout unless it sets one.
fn config(url: &str) -> Result<postgres::Config, Problem> {
    let mut config: postgres::Config = url.parse()?;
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(Duration::from_secs(10));
    }
    if config.get_application_name().is_none() {
        config.application_name("provider-host");
    }
    Ok(config)
}

/// Whether the database holds the ledger's migrations (none yet: a new
/// ledger); a `leases` table without them is another application's, refused.
fn holds_ledger(client: &mut impl GenericClient) -> Result<bool, Problem> {
    let tables = "SELECT to_regclass('ledger_migrations') IS NOT NULL, to_regclass('leases') IS NOT NULL";
    let tables = client.query_one(tables, &[])?;
    match (tables.get(0), tables.get(1)) {
        (false, true) => Err(Problem::ForeignDatabase),
        (migrated, _) => Ok(migrated),
    }
}

/// Applies the migrations this database lacks, under [`MIGRATION_LOCK`].
fn migrate(client: &mut postgres::Client) -> Result<(), Problem> {
    let mut tx = client.transaction()?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])?;
    if !holds_ledger(&mut tx)? {
        tx.batch_execute(
            "CREATE TABLE ledger_migrations (
                version    INTEGER PRIMARY KEY,
                applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
            )",
        )?;
    }
    let applied: i32 = tx.query_one("SELECT coalesce(max(version), 0) FROM ledger_migrations", &[])?.get(0);
    let known = MIGRATIONS.last().map_or(0, |(version, _)| *version);
    if applied > known {
        return Err(Problem::Newer { what: "migration", found: applied.into(), known: known.into() });
    }
    for (version, sql) in MIGRATIONS.iter().filter(|(version, _)| *version > applied) {
        tx.batch_execute(sql)?;
        tx.execute("INSERT INTO ledger_migrations (version) VALUES ($1)", &[version])?;
    }
    for sql in ADDED {
        tx.batch_execute(sql)?;
    }
    Ok(tx.commit()?)
}

/// This machine's name, for the `hosts` table: read once, at the first open.
static HOSTNAME: LazyLock<String> = LazyLock::new(|| {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|name| name.trim().to_owned())
        .ok()
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "localhost".to_owned())
});

/// Registers `host_id` (or renews it): alive for `expiry` from now.
const BEAT: &str = "INSERT INTO hosts (host_id, hostname, pid, expires_at)
    VALUES ($1, $2, $3, now() + make_interval(secs => $4))
    ON CONFLICT (host_id) DO UPDATE SET heartbeat_at = now(), expires_at = EXCLUDED.expires_at";

impl PgLedger {
    /// Connects to `url`, migrates the schema, registers this host and
    /// starts its heartbeat.
    pub fn open(url: &str, options: &PgOptions) -> Result<PgLedger, LedgerError> {
        off_async_runtime(|| {
            let location = redacted(url);
            let connect = || -> Result<Pool, Problem> {
                let config = config(url)?;
                // One connection first: a clear error for a wrong URL or a
                // server that is down, before the pool retries in the background.
                migrate(&mut config.connect(NoTls)?)?;
                Ok(r2d2::Pool::builder()
                    .max_size(options.pool_size.max(2))
                    .min_idle(Some(1))
                    .connection_timeout(Duration::from_secs(30))
                    .build(PostgresConnectionManager::new(config, NoTls))?)
            };
            let pool = connect().map_err(|problem| LedgerError::at(&location, problem))?;
            let pid = std::process::id();
            let host_id = format!("{}-{pid}-{}", *HOSTNAME, &uuid::Uuid::new_v4().simple().to_string()[..8]);
            let mut ledger = PgLedger {
                pool: Some(pool),
                location,
                host_id,
                pid,
                expiry: options.heartbeat_expiry.max(Duration::from_millis(300)),
                heartbeat: None,
            };
            ledger.beat()?;
            let renewer = ledger.handle();
            let (stop, stopped) = mpsc::channel::<()>();
            let every = ledger.expiry / 3;
            let beating = move || {
                // A failed renewal is logged and retried at the next beat.
                while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(every) {
                    if let Err(error) = renewer.beat() {
                        tracing::warn!(%error, "cannot renew this host's heartbeat");
                    }
                }
            };
            let thread = std::thread::Builder::new()
                .name("ledger-heartbeat".into())
                .spawn(beating)
                .map_err(|error| LedgerError::at(&ledger.location, Problem::Io(error)))?;
            ledger.heartbeat = Some((stop, thread));
            Ok(ledger)
        })
    }

    /// A second handle on the same pool and host (for the heartbeat thread).
    fn handle(&self) -> PgLedger {
        let (pool, location, host_id) = (self.pool.clone(), self.location.clone(), self.host_id.clone());
        PgLedger { pool, location, host_id, heartbeat: None, ..*self }
    }

    /// This host's id, as its rows and the `hosts` table name it.
    pub fn host_id(&self) -> &str {
        &self.host_id
    }

    /// Renews this host's heartbeat now.
    fn beat(&self) -> Result<(), LedgerError> {
        let params: [&(dyn ToSql + Sync); 4] =
            [&self.host_id, &*HOSTNAME, &(self.pid as i32), &self.expiry.as_secs_f64()];
        self.with(|client| client.execute(BEAT, &params).map(drop))
    }

    fn with<T: Send>(
        &self,
        f: impl FnOnce(&mut postgres::Client) -> Result<T, postgres::Error> + Send,
    ) -> Result<T, LedgerError> {
        off_async_runtime(|| {
            let pool = self.pool.as_ref().ok_or_else(|| LedgerError::at(&self.location, Problem::Closed))?;
            let mut client = pool.get().map_err(|error| LedgerError::at(&self.location, error))?;
            f(&mut client).map_err(|error| LedgerError::at(&self.location, error))
        })
    }

    /// Runs a write of row `row` conditional on this host owning it
    /// (`$1` the row, `$2` this host); changing nothing because another host
    /// took the row over is an error, because the row is gone is not.
    fn fenced(&self, row: i64, sql: &str, rest: &[&(dyn ToSql + Sync)]) -> Result<(), LedgerError> {
        let mut params: Vec<&(dyn ToSql + Sync)> = vec![&row, &self.host_id];
        params.extend_from_slice(rest);
        let owner = self.with(|client| {
            if client.execute(sql, &params)? == 1 {
                return Ok(None);
            }
            let owner = client.query_opt("SELECT host_id FROM leases WHERE id = $1", &[&row])?;
            Ok(owner.map(|owner| owner.get::<_, String>(0)))
        })?;
        match owner {
            Some(host) if host != self.host_id => {
                Err(LedgerError::at(&self.location, Problem::TakenOver { row, host }))
            }
            _ => Ok(()),
        }
    }

    /// Ends this host's row now: gone when it owns no lease, else expired.
    fn expire_now(&self) {
        let result = self.with(|client| {
            client.execute(
                "DELETE FROM hosts h WHERE h.host_id = $1
                   AND NOT EXISTS (SELECT 1 FROM leases l WHERE l.host_id = h.host_id)",
                &[&self.host_id],
            )?;
            client.execute("UPDATE hosts SET expires_at = now() WHERE host_id = $1", &[&self.host_id])
        });
        if let Err(error) = result {
            tracing::warn!(%error, "cannot end this host's heartbeat; its rows wait for the expiry");
        }
    }

    /// The rows of `leases l` that `clause` (`WHERE`, `ORDER BY`...) selects.
    fn select(&self, clause: &str, params: &[&(dyn ToSql + Sync)]) -> Result<Vec<LeaseRecord>, LedgerError> {
        self.with(|client| select(client, clause, params))
    }
}

impl Drop for PgLedger {
    /// A host that closes its ledger is gone at once: its heartbeat stops,
    /// and its row expires now (or goes, when it owns no lease), so the rows
    /// it left are a survivor's without waiting for the expiry.
    fn drop(&mut self) {
        if let Some((stop, thread)) = self.heartbeat.take() {
            drop(stop);
            let _ = thread.join();
            self.expire_now();
        }
        // Closing the connections blocks on the driver's runtime too.
        let pool = self.pool.take();
        off_async_runtime(move || drop(pool));
    }
}

/// A driver error in one line: the server's own message for a database
/// error, else the error and its causes.
pub(crate) fn describe(error: &postgres::Error) -> String {
    if let Some(db) = error.as_db_error() {
        return format!("{}: {}", db.severity(), db.message());
    }
    let causes = std::iter::successors(Some(error as &dyn std::error::Error), |error| error.source());
    causes.map(ToString::to_string).collect::<Vec<_>>().join(": ").replace('\n', " ")
}

/// The rows of `leases l` that `clause` (`WHERE`, `ORDER BY`...) selects, through `client`.
fn select(
    client: &mut impl GenericClient,
    clause: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<Vec<LeaseRecord>, postgres::Error> {
    let rows = client.query(&format!("SELECT {COLUMNS} FROM leases l {clause}"), params)?;
    Ok(rows.iter().map(read_row).collect())
}

fn read_row(row: &Row) -> LeaseRecord {
    let json = |text: Option<String>| text.and_then(|text| serde_json::from_str::<Value>(&text).ok());
    let state: String = row.get("state");
    LeaseRecord {
        id: row.get("id"),
        owner: row.get::<_, &str>("owner").parse().unwrap_or(Owner::Command),
        run_id: row.get("run_id"),
        state: state.parse().unwrap_or(LeaseState::CleanupFailed),
        provider_lease_id: row.get("provider_lease_id"),
        metadata: json(row.get("metadata_json")),
        env: LeaseEnv {
            driver_key: row.get("driver_key"),
            company_id: row.get("company_id"),
            environment_id: row.get("environment_id"),
            config: json(row.get("config_json")).unwrap_or(Value::Null),
            api_in_process: row.get("api_in_process"),
        },
        last_hook: row.get("last_hook"),
        last_error: json(row.get("last_error_json")),
        pid: row.get::<_, i32>("pid") as u32,
        host_id: Some(row.get("host_id")),
        created_at: row.get("created_at"),
        updated_at: row.get("updated_at"),
        owner_start: 0,
    }
}

impl LeaseStore for PgLedger {
    fn host_name(&self) -> String {
        format!("host {}", self.host_id)
    }

    fn memory(&self, provider_id: &str) -> Result<Vec<SavedEntry>, LedgerError> {
        let rows = self.with(|client| client.query(MEMORY, &[&provider_id]))?;
        Ok(rows.iter().map(|row| saved_entry(row.get(0), row.get(1), row.get(2))).collect())
    }

    fn save_memory(
        &self,
        provider_id: &str,
        entries: &[MemoryEntry],
        saved_at: SystemTime,
        forget_before: SystemTime,
        keep: usize,
    ) -> Result<(), LedgerError> {
        let (saved_at, forget_before, keep) = (unix_ms(saved_at), unix_ms(forget_before), keep as i64);
        self.with(|client| {
            let mut tx = client.transaction()?;
            for entry in entries {
                tx.execute(
                    SAVE_MEMORY,
                    &[&provider_id, &entry.key.as_str(), &entry.value.as_slice(), &saved_at],
                )?;
            }
            tx.execute(FORGET_MEMORY, &[&provider_id, &forget_before, &keep])?;
            tx.commit()
        })
    }

    fn patrol_interval(&self) -> Duration {
        self.expiry / 2
    }

    fn budget_group(&self) -> Result<usize, LedgerError> {
        let live: i64 = self.with(|client| {
            client
                .query_one(
                    "SELECT count(*) FROM hosts WHERE hostname = $1 AND expires_at >= now()",
                    &[&*HOSTNAME],
                )
                .map(|row| row.get(0))
        })?;
        Ok((live as usize).max(1))
    }

    fn write(&self, write: Write) -> Result<i64, LedgerError> {
        match write {
            Write::Begin { owner, run_id, env, hook } => {
                // The insert renews this host's heartbeat in the same
                // statement: a row is never born to a host that counts as gone.
                let sql = format!(
                    "WITH beat AS ({BEAT} RETURNING host_id)
                     INSERT INTO leases (owner, run_id, state, driver_key, company_id, environment_id,
                         config_json, api_in_process, last_hook, host_id, pid)
                     SELECT $5, $6, 'acquiring', $7, $8, $9, $10, $11, $12, beat.host_id, $3 FROM beat
                     RETURNING id"
                );
                let params: [&(dyn ToSql + Sync); 12] = [
                    &self.host_id,
                    &*HOSTNAME,
                    &(self.pid as i32),
                    &self.expiry.as_secs_f64(),
                    &owner.as_str(),
                    &run_id,
                    &env.driver_key,
                    &env.company_id,
                    &env.environment_id,
                    &env.config.to_string(),
                    &env.api_in_process,
                    &hook,
                ];
                return self.with(|client| client.query_one(&sql, &params).map(|row| row.get(0)));
            }
            Write::SetState { row, state, hook, error } => self.fenced(
                row,
                "UPDATE leases SET state = $3, last_hook = $4, last_error_json = $5, updated_at = now()
                 WHERE id = $1 AND host_id = $2",
                &[&state.as_str(), &hook, &error.as_ref().map(stored_error)],
            ),
            Write::SetLease { row, state, hook, lease } => self.fenced(
                row,
                "UPDATE leases SET state = $3, last_hook = $4, last_error_json = NULL,
                     provider_lease_id = COALESCE($5, provider_lease_id), metadata_json = $6, updated_at = now()
                 WHERE id = $1 AND host_id = $2",
                &[&state.as_str(), &hook, &lease_id(&lease), &lease.metadata_json.as_str()],
            ),
            Write::Restore(record) => self.fenced(
                record.id,
                "UPDATE leases SET state = $3, last_hook = $4, last_error_json = $5,
                     host_id = COALESCE($6, host_id), pid = $7, updated_at = now()
                 WHERE id = $1 AND host_id = $2",
                &[
                    &record.state.as_str(),
                    &record.last_hook,
                    &record.last_error.as_ref().map(Value::to_string),
                    &record.host_id,
                    &(record.pid as i32),
                ],
            ),
            Write::Forget(row) => self.fenced(row, "DELETE FROM leases WHERE id = $1 AND host_id = $2", &[]),
            Write::Adopt(row) => self.with(|client| {
                client
                    .execute(
                        "UPDATE leases SET host_id = $2, pid = $3, updated_at = now() WHERE id = $1",
                        &[&row, &self.host_id, &(self.pid as i32)],
                    )
                    .map(drop)
            }),
        }
        .map(|()| 0)
    }

    fn get(&self, row: i64) -> Result<Option<LeaseRecord>, LedgerError> {
        Ok(self.select("WHERE l.id = $1", &[&row])?.pop())
    }

    fn find(
        &self,
        provider_lease_id: &str,
        company_id: &str,
        environment_id: &str,
    ) -> Result<Option<LeaseRecord>, LedgerError> {
        let latest = "WHERE l.provider_lease_id = $1 AND l.company_id = $2 AND l.environment_id = $3
            ORDER BY l.id DESC LIMIT 1";
        Ok(self.select(latest, &[&provider_lease_id, &company_id, &environment_id])?.pop())
    }

    fn list(&self) -> Result<Vec<LeaseRecord>, LedgerError> {
        self.select("ORDER BY l.id", &[])
    }

    fn left_behind(&self, whose: Whose) -> Result<Vec<LeaseRecord>, LedgerError> {
        let rows = match whose {
            Whose::ThisHost => self.select("WHERE l.host_id = $1 ORDER BY l.id", &[&self.host_id])?,
            Whose::Gone => self.select(LIVE_ROWS_OF_GONE_HOSTS, &[])?,
        };
        Ok(rows.into_iter().filter(LeaseRecord::is_left_behind).collect())
    }

    fn take_over(&self, records: &[LeaseRecord]) -> Result<Vec<LeaseRecord>, LedgerError> {
        let (ids, owners): (Vec<i64>, Vec<String>) = records
            .iter()
            .filter_map(|record| Some((record.id, record.host_id.clone()?)))
            .filter(|(_, owner)| *owner != self.host_id)
            .unzip();
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        // The row locks are skipped, not waited for: a row another survivor
        // is taking over is its. A row taken over meanwhile has a new owner
        // (alive) and no longer matches its old one: PostgreSQL re-checks
        // both conditions on the row's latest version before locking it.
        let sql = format!(
            "WITH claimed AS (
                 SELECT l.id FROM leases l
                 JOIN unnest($2::bigint[], $3::text[]) AS wanted(id, host_id)
                   ON wanted.id = l.id AND wanted.host_id = l.host_id
                 WHERE NOT EXISTS (SELECT 1 FROM hosts h WHERE h.host_id = l.host_id AND h.expires_at >= now())
                 FOR UPDATE OF l SKIP LOCKED)
             UPDATE leases l SET host_id = $1, pid = $4, updated_at = now()
             FROM claimed WHERE l.id = claimed.id
             RETURNING {COLUMNS}"
        );
        let taken =
            self.with(|client| client.query(&sql, &[&self.host_id, &ids, &owners, &(self.pid as i32)]))?;
        let mut taken: Vec<LeaseRecord> = taken.iter().map(read_row).collect();
        taken.sort_by_key(|record| record.id);
        // Gone hosts that own no row any more are forgotten.
        self.with(|client| {
            client.execute(
                "DELETE FROM hosts h WHERE h.expires_at < now()
                   AND NOT EXISTS (SELECT 1 FROM leases l WHERE l.host_id = h.host_id)",
                &[],
            )
        })?;
        Ok(taken)
    }
}

/// Runs `work`, which blocks on the synchronous PostgreSQL driver: on this
/// thread, or on a thread of its own when this one drives an async runtime
/// (the driver blocks on a runtime of its own, which tokio refuses to start
/// inside another). A ledger call is milliseconds; the thread, microseconds.
fn off_async_runtime<T: Send>(work: impl FnOnce() -> T + Send) -> T {
    if tokio::runtime::Handle::try_current().is_err() {
        return work();
    }
    std::thread::scope(|scope| {
        scope.spawn(work).join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

/// Every row of the ledger at `url`, read without migrating or registering
/// (no ledger there yet: none).
pub fn read_all(url: &str) -> Result<Vec<LeaseRecord>, LedgerError> {
    let read = || -> Result<Vec<LeaseRecord>, Problem> {
        let mut client = config(url)?.connect(NoTls)?;
        Ok(if holds_ledger(&mut client)? { select(&mut client, "ORDER BY l.id", &[])? } else { Vec::new() })
    };
    off_async_runtime(read).map_err(|problem| LedgerError::at(redacted(url), problem))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A patrol runs this every half expiry on every host of the fleet: the
    /// index of rows not destroyed can serve it (PostgreSQL picks it once
    /// destroyed rows outnumber the rest; a sequential scan is forbidden
    /// here to see that it can).
    #[test]
    fn the_patrols_query_can_read_only_rows_not_destroyed() {
        let Some(cluster) = pg_cluster::PgCluster::for_test("the_patrols_query") else { return };
        let url = cluster.create_database("ledger");
        let options = PgOptions { heartbeat_expiry: Duration::from_secs(30), pool_size: 2 };
        let ledger = PgLedger::open(&url, &options).unwrap();
        let plan: Vec<String> = ledger
            .with(|client| {
                let mut tx = client.transaction()?;
                tx.batch_execute("SET LOCAL enable_seqscan = off")?;
                let rows =
                    tx.query(&format!("EXPLAIN SELECT l.id FROM leases l {LIVE_ROWS_OF_GONE_HOSTS}"), &[])?;
                Ok(rows.iter().map(|row| row.get(0)).collect())
            })
            .unwrap();
        let plan = plan.join("\n");
        assert!(plan.contains("Index Scan on leases_live_owners"), "{plan}");
        assert!(!plan.contains("Seq Scan on leases"), "{plan}");
    }

    #[test]
    fn passwords_never_show() {
        let cases = [
            ("postgres://app:s3cret@db.example:5432/ledger", "postgres://app:***@db.example:5432/ledger"),
            ("postgresql://app:s3cret@/ledger?host=/run/pg", "postgresql://app:***@/ledger?host=/run/pg"),
            (
                "postgres://app@db/ledger?password=s3cret&sslmode=require",
                "postgres://app@db/ledger?password=***&sslmode=require",
            ),
            (
                "postgresql:///ledger?host=/tmp/x&user=postgres",
                "postgresql:///ledger?host=/tmp/x&user=postgres",
            ),
            ("postgres://a:b:c@h", "postgres://a:***@h"),
        ];
        for (url, shown) in cases {
            assert_eq!(redacted(url), shown);
        }
    }
}
