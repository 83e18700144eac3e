//! The lease store's contract, run against both stores: the SQLite ledger
//! (one machine) and the PostgreSQL ledger (a fleet, on a private cluster
//! this test starts). Hosts are stores opened side by side; a gone host is
//! one whose process exited (SQLite) or whose heartbeat expired (PostgreSQL).

use pg_cluster::PgCluster;
use provider_abi::{ErrorKind, Lease, ProviderError};
use provider_host::{
    store::postgres::{PgLedger, PgOptions},
    store::sqlite::Ledger,
    store::{LeaseEnv, LeaseState, Owner},
    store::{LeaseStore, Whose},
};
use serde_json::json;
use std::{path::PathBuf, time::Duration};
use strum::VariantArray;

fn env() -> LeaseEnv {
    LeaseEnv {
        driver_key: "createos".into(),
        company_id: "c".into(),
        environment_id: "e".into(),
        config: json!({"shape": "s-1vcpu-1gb"}),
        api_in_process: false,
    }
}

fn lease(id: &str) -> Lease {
    Lease {
        provider_lease_id: Some(id.into()).into(),
        metadata_json: r#"{"marker":"m"}"#.into(),
        ..Default::default()
    }
}

/// Where the stores of one test live.
enum Bed {
    Sqlite(tempfile::TempDir),
    Postgres { cluster: PgCluster, url: String },
}

impl Bed {
    fn sqlite() -> Bed {
        Bed::Sqlite(tempfile::tempdir().unwrap())
    }

    fn postgres(test: &str) -> Option<Bed> {
        let cluster = PgCluster::for_test(test)?;
        let url = cluster.create_database("ledger");
        Some(Bed::Postgres { cluster, url })
    }

    /// Every bed this test can run on.
    fn all(test: &str) -> Vec<Bed> {
        std::iter::once(Bed::sqlite()).chain(Bed::postgres(test)).collect()
    }

    fn name(&self) -> &'static str {
        match self {
            Bed::Sqlite(_) => "sqlite",
            Bed::Postgres { .. } => "postgres",
        }
    }

    fn sqlite_path(&self) -> PathBuf {
        match self {
            Bed::Sqlite(dir) => dir.path().join("ledger.sqlite3"),
            Bed::Postgres { .. } => unreachable!(),
        }
    }

    /// A host: a store of its own on the shared ledger.
    fn host(&self) -> Box<dyn LeaseStore> {
        match self {
            Bed::Sqlite(_) => Box::new(Ledger::open(&self.sqlite_path()).unwrap()),
            Bed::Postgres { url, .. } => Box::new(
                PgLedger::open(url, &PgOptions { heartbeat_expiry: Duration::from_secs(30), pool_size: 4 })
                    .unwrap(),
            ),
        }
    }

    /// Makes `host`'s rows those of a gone host, as if it had been killed:
    /// its process is no longer running (SQLite: a pid that cannot exist),
    /// or its heartbeat expired without a renewal (PostgreSQL).
    fn kill(&self, host: &dyn LeaseStore) {
        match self {
            Bed::Sqlite(_) => {
                let conn = rusqlite::Connection::open(self.sqlite_path()).unwrap();
                conn.execute("UPDATE leases SET pid = 2147483647, pid_start = 1", []).unwrap();
            }
            Bed::Postgres { url, .. } => {
                let id = host.host_name().trim_start_matches("host ").to_owned();
                let mut client = postgres::Client::connect(url, postgres::NoTls).unwrap();
                client
                    .execute(
                        "UPDATE hosts SET expires_at = now() - interval '1 second' WHERE host_id = $1",
                        &[&id],
                    )
                    .unwrap();
            }
        }
    }
}

#[test]
fn rows_record_every_state_and_the_last_error() {
    for bed in Bed::all("rows_record_every_state_and_the_last_error") {
        let ledger = bed.host();
        let row = ledger.begin(Owner::Command, "run", &env(), "acquire_lease").unwrap();
        ledger.set_lease(row, LeaseState::Active, "acquire_lease", &lease("sb-1")).unwrap();
        for &state in LeaseState::VARIANTS {
            ledger.set_state(row, state, "release_lease", None).unwrap();
            assert_eq!(ledger.get(row).unwrap().unwrap().state, state, "{}", bed.name());
        }
        let error = ProviderError::new(ErrorKind::CLEANUP_UNCONFIRMED, "unconfirmed");
        ledger.set_state(row, LeaseState::Unconfirmed, "release_lease", Some(&error)).unwrap();
        let record = ledger.find("sb-1", "c", "e").unwrap().unwrap();
        assert_eq!(record.last_error.as_ref().unwrap()["kind"], "cleanup_unconfirmed", "{}", bed.name());
        assert_eq!(record.metadata.as_ref().unwrap()["marker"], "m");
        assert_eq!(record.env.config, json!({"shape": "s-1vcpu-1gb"}));
        assert!(record.created_at.ends_with('Z') && record.created_at.contains('T'), "{}", record.created_at);
        assert_eq!(ledger.in_state(LeaseState::Unconfirmed).unwrap().len(), 1);
        assert!(ledger.find("sb-1", "c", "other").unwrap().is_none());
    }
}

#[test]
fn a_forgotten_row_is_gone() {
    for bed in Bed::all("a_forgotten_row_is_gone") {
        let ledger = bed.host();
        let kept = ledger.begin(Owner::Command, "run", &env(), "hold").unwrap();
        let refused = ledger.begin(Owner::Command, "run", &env(), "hold").unwrap();
        ledger.forget(refused).unwrap();
        assert!(ledger.get(refused).unwrap().is_none(), "{}", bed.name());
        assert!(ledger.get(kept).unwrap().is_some());
        assert_eq!(ledger.list().unwrap().len(), 1);
    }
}

#[test]
fn left_behind_rows_depend_on_state_owner_and_host() {
    for bed in Bed::all("left_behind_rows_depend_on_state_owner_and_host") {
        let ledger = bed.host();
        let states = [
            (Owner::Command, LeaseState::Paused, true),
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
        let mine = ledger.left_behind(Whose::ThisHost).unwrap();
        let expected: Vec<_> =
            states.iter().filter(|(_, _, swept)| *swept).map(|(_, state, _)| *state).collect();
        assert_eq!(mine.iter().map(|record| record.state).collect::<Vec<_>>(), expected, "{}", bed.name());
        assert!(ledger.left_behind(Whose::Gone).unwrap().is_empty(), "{}: this host is alive", bed.name());
        let other = bed.host();
        if let Bed::Postgres { .. } = bed {
            // In SQLite a second store of this process is the same host.
            assert!(other.left_behind(Whose::ThisHost).unwrap().is_empty());
        }
        assert!(
            other.take_over(&mine).unwrap().is_empty(),
            "{}: a live host's rows are never taken over",
            bed.name()
        );
    }
}

/// Survivors racing to take over a gone host's rows share them out: every
/// row goes to exactly one of them.
#[test]
fn a_gone_hosts_rows_are_taken_over_exactly_once() {
    const ROWS: usize = 60;
    for bed in Bed::all("a_gone_hosts_rows_are_taken_over_exactly_once") {
        let dead = bed.host();
        let rows: Vec<i64> = (0..ROWS)
            .map(|index| {
                let row = dead.begin(Owner::Lifecycle, "soak", &env(), "acquire_lease").unwrap();
                dead.set_lease(row, LeaseState::Active, "acquire_lease", &lease(&format!("sb-{index}")))
                    .unwrap();
                row
            })
            .collect();
        bed.kill(dead.as_ref());
        let survivors: Vec<Box<dyn LeaseStore>> = (0..3).map(|_| bed.host()).collect();
        let taken: Vec<Vec<i64>> = std::thread::scope(|scope| {
            let handles: Vec<_> = survivors
                .iter()
                .map(|survivor| {
                    scope.spawn(move || {
                        let gone = survivor.left_behind(Whose::Gone).unwrap();
                        let taken = survivor.take_over(&gone).unwrap();
                        for record in &taken {
                            // Each survivor now owns what it took.
                            survivor.set_state(record.id, LeaseState::Destroyed, "sweep", None).unwrap();
                        }
                        taken.iter().map(|record| record.id).collect::<Vec<_>>()
                    })
                })
                .collect();
            handles.into_iter().map(|handle| handle.join().unwrap()).collect()
        });
        let mut all: Vec<i64> = taken.iter().flatten().copied().collect();
        all.sort();
        assert_eq!(all, rows, "{}: each row taken over exactly once ({taken:?})", bed.name());
        assert!(survivors[0].left_behind(Whose::Gone).unwrap().is_empty());
        // The gone host is fenced out of the rows it lost.
        let error = dead.set_state(rows[0], LeaseState::Paused, "release_lease", None);
        match bed {
            Bed::Postgres { .. } => {
                let message = error.expect_err("fenced").to_string();
                assert!(message.contains("taken over by host"), "{message}");
                assert!(!message.contains('\n'));
            }
            // On one machine a gone host is a process that exited: it writes nothing.
            Bed::Sqlite(_) => {}
        }
    }
}

#[test]
fn a_postgres_ledger_url_is_shown_without_its_password_and_a_foreign_database_is_refused() {
    let Some(bed) = Bed::postgres("a_postgres_ledger_url_is_shown_without_its_password") else { return };
    let Bed::Postgres { cluster, url } = &bed else { unreachable!() };
    let options = PgOptions { heartbeat_expiry: Duration::from_secs(30), pool_size: 2 };
    let wrong = format!("postgresql://postgres:s3cret@/nosuchdb?host={}", cluster.socket_dir().display());
    let message = PgLedger::open(&wrong, &options).err().expect("no such database").to_string();
    assert!(!message.contains("s3cret"), "{message}");
    assert!(message.contains("***") && message.contains("nosuchdb"), "{message}");
    assert!(!message.contains('\n'), "{message}");

    let foreign = cluster.create_database("foreign");
    let mut client = postgres::Client::connect(&foreign, postgres::NoTls).unwrap();
    client.batch_execute("CREATE TABLE leases (id INTEGER)").unwrap();
    let message = PgLedger::open(&foreign, &options).err().expect("foreign").to_string();
    assert!(message.contains("another application"), "{message}");
    let columns: i64 = client
        .query_one("SELECT count(*) FROM information_schema.columns WHERE table_name = 'leases'", &[])
        .unwrap()
        .get(0);
    assert_eq!(columns, 1, "left untouched");

    // Hosts opening a new ledger at once migrate it once.
    let opened: Vec<_> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..4).map(|_| scope.spawn(|| PgLedger::open(url, &options))).collect();
        handles.into_iter().map(|handle| handle.join().unwrap()).collect()
    });
    for result in &opened {
        assert!(result.is_ok(), "{}", result.as_ref().err().map(ToString::to_string).unwrap_or_default());
    }
}

/// The start time of process `pid` (clock ticks since boot), as the ledger
/// records a process.
fn start_time(pid: u32) -> i64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after_name = &stat[stat.rfind(')').unwrap() + 2..];
    after_name.split(' ').nth(19).unwrap().parse().unwrap()
}

#[test]
fn hosts_sharing_a_ledger_share_the_request_budget() {
    for bed in Bed::all("hosts_sharing_a_ledger_share_the_request_budget") {
        let a = bed.host();
        assert_eq!(a.budget_group().unwrap(), 1, "alone: {}", bed.name());
        match &bed {
            Bed::Sqlite(_) => {
                // Another process of this machine registered on the ledger
                // (its row as `Ledger::open` writes it), alive until its
                // standard input closes.
                let mut other =
                    std::process::Command::new("cat").stdin(std::process::Stdio::piped()).spawn().unwrap();
                let conn = rusqlite::Connection::open(bed.sqlite_path()).unwrap();
                conn.execute(
                    "INSERT INTO hosts (pid, pid_start) VALUES (?1, ?2)",
                    rusqlite::params![other.id(), start_time(other.id())],
                )
                .unwrap();
                // A store opened again in this process is the same host.
                let again = bed.host();
                assert_eq!((a.budget_group().unwrap(), again.budget_group().unwrap()), (2, 2));
                drop(other.stdin.take());
                other.wait().unwrap();
                assert_eq!(a.budget_group().unwrap(), 1);
                let rows: i64 = conn.query_row("SELECT count(*) FROM hosts", [], |row| row.get(0)).unwrap();
                assert_eq!(rows, 1, "the exited process's registration is removed");
            }
            Bed::Postgres { url, .. } => {
                let b = bed.host();
                assert_eq!((a.budget_group().unwrap(), b.budget_group().unwrap()), (2, 2));
                // A host of another machine has a budget of its own.
                let mut client = postgres::Client::connect(url, postgres::NoTls).unwrap();
                client
                    .execute(
                        "INSERT INTO hosts (host_id, hostname, pid, expires_at)
                         VALUES ('elsewhere-1', 'elsewhere', 1, now() + interval '1 hour')",
                        &[],
                    )
                    .unwrap();
                assert_eq!(a.budget_group().unwrap(), 2);
                // A host whose heartbeat expired no longer counts; one that
                // closed its ledger neither.
                bed.kill(b.as_ref());
                assert_eq!(a.budget_group().unwrap(), 1);
                drop(b);
                let c = bed.host();
                drop(c);
                assert_eq!(a.budget_group().unwrap(), 1);
            }
        }
    }
}

/// A host on an async runtime (a tokio host awaiting `Host::acquire`) writes its ledger from the runtime's thread: every store
/// must work there, including the PostgreSQL one, whose synchronous driver
/// blocks on a runtime of its own.
#[test]
fn a_store_is_usable_from_inside_an_async_runtime() {
    for bed in Bed::all("a_store_is_usable_from_inside_an_async_runtime") {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let state = runtime.block_on(async {
            let ledger = bed.host();
            let row = ledger.begin(Owner::Command, "run", &env(), "acquire_lease").unwrap();
            ledger.set_lease(row, LeaseState::Active, "acquire_lease", &lease("sb-async")).unwrap();
            ledger.get(row).unwrap().unwrap().state
        });
        assert_eq!(state, LeaseState::Active, "{}", bed.name());
    }
}

/// `restore` puts a row's state, last hook, last error and owner back as a
/// record read earlier holds them (a call refused before any request
/// changed nothing), on both stores.
#[test]
fn a_restored_row_is_as_it_was_read() {
    for bed in Bed::all("a_restored_row_is_as_it_was_read") {
        let ledger = bed.host();
        let row = ledger.begin(Owner::Command, "run", &env(), "acquire_lease").unwrap();
        ledger.set_lease(row, LeaseState::Active, "acquire_lease", &lease("sb-restored")).unwrap();
        let failed = ProviderError::new(ErrorKind::TIMEOUT, "the destroy timed out");
        ledger.set_state(row, LeaseState::CleanupFailed, "destroy_lease", Some(&failed)).unwrap();
        let before = ledger.get(row).unwrap().unwrap();
        let other = bed.host();
        other.adopt(row).unwrap();
        other.set_state(row, LeaseState::Destroying, "release_lease", None).unwrap();
        other.restore(&before).unwrap();
        let after = ledger.get(row).unwrap().unwrap();
        assert_eq!(
            (after.pid, after.host_id.clone()),
            (before.pid, before.host_id.clone()),
            "{}",
            bed.name()
        );
        assert_eq!(after.state, LeaseState::CleanupFailed, "{}", bed.name());
        assert_eq!(after.last_hook, "destroy_lease", "{}", bed.name());
        assert_eq!(after.last_error, before.last_error, "{}", bed.name());
        assert_eq!(after.provider_lease_id.as_deref(), Some("sb-restored"), "{}", bed.name());
    }
}

/// A fleet's ledger at migration 1 (its flag column named `embedded_sim`)
/// is brought to the current schema by the first host that opens it, its
/// rows kept.
#[test]
fn a_postgres_ledger_of_migration_1_is_migrated_with_its_rows() {
    let Some(bed) = Bed::postgres("a_postgres_ledger_of_migration_1_is_migrated") else { return };
    let Bed::Postgres { url, .. } = &bed else { unreachable!() };
    let mut client = postgres::Client::connect(url, postgres::NoTls).unwrap();
    client.batch_execute(include_str!("../migrations/postgres/0001_hosts_and_leases.sql")).unwrap();
    client
        .batch_execute(
            "CREATE TABLE ledger_migrations (version INTEGER PRIMARY KEY, applied_at TIMESTAMPTZ NOT NULL DEFAULT now());
             INSERT INTO ledger_migrations (version) VALUES (1);
             INSERT INTO leases (owner, run_id, state, provider_lease_id, driver_key, company_id, environment_id,
                 config_json, embedded_sim, last_hook, host_id, pid)
             VALUES ('lifecycle', 'run', 'active', 'sb-old', 'createos', 'c', 'e', '{}', true,
                 'acquire_lease', 'gone-host', 1);",
        )
        .unwrap();
    let rows = bed.host().list().unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].provider_lease_id.as_deref(), Some("sb-old"));
    assert!(rows[0].env.api_in_process);
    let applied: i32 = client.query_one("SELECT max(version) FROM ledger_migrations", &[]).unwrap().get(0);
    assert_eq!(applied, 2);
}

/// A new row records whether its API lived in the host's process, on both stores.
#[test]
fn a_row_records_whether_its_api_lived_in_the_hosts_process() {
    for bed in Bed::all("a_row_records_whether_its_api_lived_in_the_hosts_process") {
        let ledger = bed.host();
        let in_process = LeaseEnv { api_in_process: true, ..env() };
        let row = ledger.begin(Owner::Lifecycle, "run", &in_process, "acquire_lease").unwrap();
        let other = ledger.begin(Owner::Lifecycle, "run", &env(), "acquire_lease").unwrap();
        assert!(ledger.get(row).unwrap().unwrap().env.api_in_process, "{}", bed.name());
        assert!(!ledger.get(other).unwrap().unwrap().env.api_in_process, "{}", bed.name());
    }
}

#[test]
fn memory_round_trips_newest_first_per_provider_and_is_bounded() {
    use provider_abi::MemoryEntry;
    use std::time::SystemTime;
    let entry = |key: &str, value: &[u8]| MemoryEntry::new(key, value.to_vec());
    for bed in Bed::all("memory_round_trips_newest_first_per_provider_and_is_bounded") {
        let (first, second) = (bed.host(), bed.host());
        let name = bed.name();
        let now = SystemTime::now();
        let minute = Duration::from_secs(60);
        let keep_all = now - minute * 60;
        assert!(first.memory("createos").unwrap().is_empty(), "{name}: nothing saved yet");
        let binary = [0u8, 255, 10, 13, 0];
        first
            .save_memory("createos", &[entry("a", &binary), entry("b", b"1")], now - minute * 2, keep_all, 8)
            .unwrap();
        first.save_memory("fixture", &[entry("a", b"other provider")], now, keep_all, 8).unwrap();
        // Another host of the same ledger replaces `b` and adds `c`, later.
        second
            .save_memory("createos", &[entry("b", b"2"), entry("c", b"3")], now - minute, keep_all, 8)
            .unwrap();
        let read = |store: &dyn LeaseStore| -> Vec<(String, Vec<u8>)> {
            let saved = store.memory("createos").unwrap();
            saved.iter().map(|saved| (saved.entry.key.to_string(), saved.entry.value.to_vec())).collect()
        };
        let expected = [("b", b"2".to_vec()), ("c", b"3".to_vec()), ("a", binary.to_vec())]
            .map(|(key, value)| (key.to_owned(), value));
        assert_eq!(read(&*first), expected, "{name}: newest first, bytes as saved");
        let saved_at = first.memory("createos").unwrap()[0].saved_at;
        let off = saved_at.duration_since(now - minute).unwrap_or_else(|early| early.duration());
        assert!(off < Duration::from_millis(2), "{name}: saved at {saved_at:?}");
        // Forgetting: `a` (saved 2 minutes ago) is older than the cut-off;
        // then only the newest one is kept.
        first.save_memory("createos", &[], now, now - minute * 2 + Duration::from_secs(1), 8).unwrap();
        assert_eq!(read(&*first), expected[..2], "{name}: the entry before the cut-off is gone");
        first.save_memory("createos", &[entry("d", b"4")], now, keep_all, 1).unwrap();
        assert_eq!(read(&*first), [("d".to_owned(), b"4".to_vec())], "{name}: the newest one kept");
        assert_eq!(first.memory("fixture").unwrap().len(), 1, "{name}: another provider's memory is its own");
    }
}
