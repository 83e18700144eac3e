//! Opening the lease ledger: at once from many connections, read-only, a
//! database of another application, a missing directory.

use provider_host::{
    store::sqlite::Ledger,
    store::LeaseStore,
    store::{LeaseEnv, Owner},
};
use rusqlite::Connection;
use serde_json::{json, Value};
use std::{
    os::unix::{fs::PermissionsExt, process::CommandExt},
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    sync::Barrier,
};

#[test]
fn many_connections_creating_the_same_new_ledger_at_once_all_succeed() {
    const OPENERS: usize = 8;
    for round in 0..30 {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.sqlite3");
        let start = Barrier::new(OPENERS);
        let results: Vec<_> = std::thread::scope(|scope| {
            let openers: Vec<_> = (0..OPENERS)
                .map(|_| {
                    scope.spawn(|| {
                        start.wait();
                        Ledger::open(&path).map(|ledger| ledger.list().map(|rows| rows.len()))
                    })
                })
                .collect();
            openers.into_iter().map(|opener| opener.join().unwrap()).collect()
        });
        for result in results {
            match result {
                Ok(Ok(0)) => {}
                Ok(other) => panic!("round {round}: {other:?}"),
                Err(error) => panic!("round {round}: {error}"),
            }
        }
    }
}

/// Runs the harness with `args`; as an unprivileged user when the tests run
/// as root (for whom no permission bit is read-only), so a read-only file is
/// read-only to it.
fn harness(args: &[&str], home: &Path, unprivileged: bool) -> Output {
    let binary = Path::new(env!("CARGO_BIN_EXE_host-harness"));
    // SAFETY: geteuid has no preconditions.
    let as_nobody = unprivileged && unsafe { libc::geteuid() } == 0;
    let mut command = Command::new(if as_nobody { reachable_by_anyone(binary, home) } else { binary.into() });
    command.env("HOME", home).env("XDG_STATE_HOME", home.join("state")).args(args).stdin(Stdio::null());
    if as_nobody {
        command.uid(NOBODY).gid(NOBODY);
    }
    command.output().expect("run host-harness")
}

/// `binary` at a path an unprivileged user can reach: a hard link in `dir`
/// (which the caller made searchable) or a copy on another filesystem, since the checkout itself may sit
/// in a directory only root can enter (a `mktemp -d` clone). A link opens
/// no file, so no forked child can hold it open for writing when it runs.
fn reachable_by_anyone(binary: &Path, dir: &Path) -> std::path::PathBuf {
    let link = dir.join("host-harness");
    if !link.exists() {
        // Another filesystem: a copy (nothing else runs it yet).
        if std::fs::hard_link(binary, &link).is_err() {
            std::fs::copy(binary, &link)
                .unwrap_or_else(|error| panic!("copy {} into {}: {error}", binary.display(), dir.display()));
        }
    }
    link
}

const NOBODY: u32 = 65534;

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn set_mode(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn env() -> LeaseEnv {
    LeaseEnv {
        driver_key: "createos".into(),
        company_id: "c".into(),
        environment_id: "e".into(),
        config: json!({"shape": "s-1vcpu-1gb"}),
        api_in_process: false,
    }
}

/// Every file in `dir` with its contents.
fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .map(|path| {
            let bytes = std::fs::read(&path).unwrap();
            (path, bytes)
        })
        .collect();
    files.sort();
    files
}

#[test]
fn inspect_health_and_validate_open_no_ledger() {
    let dir = tempfile::tempdir().unwrap();
    // Nobody, root included, can create a directory below a regular file.
    let blocker = dir.path().join("not-a-directory");
    std::fs::write(&blocker, "").unwrap();
    let ledger = blocker.join("ledger.sqlite3");
    let config = dir.path().join("config.json");
    std::fs::write(&config, r#"{"shape":"s-1vcpu-1gb","apiKey":"k"}"#).unwrap();
    let ledger_arg = ["--ledger", ledger.to_str().unwrap()];
    for args in [vec!["inspect"], vec!["health"], vec!["validate", "--config", config.to_str().unwrap()]] {
        let output = harness(&[&ledger_arg[..], &args].concat(), dir.path(), false);
        assert_eq!(output.status.code(), Some(0), "{args:?}: {}", stderr(&output));
        assert!(stderr(&output).is_empty(), "{args:?}: {}", stderr(&output));
    }
    // A command that records leases needs the ledger, and says why in one line.
    let output = harness(&[&ledger_arg[..], &["sweep"]].concat(), dir.path(), false);
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(2), "{text}");
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(text.contains(blocker.to_str().unwrap()), "{text}");
}

#[test]
fn leases_reads_a_ledger_it_cannot_write_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    set_mode(dir.path(), 0o755);
    let ledger_dir = dir.path().join("ledgers");
    let path = ledger_dir.join("ledger.sqlite3");
    {
        let ledger = Ledger::open(&path).unwrap();
        ledger.begin(Owner::Command, "run", &env(), "acquire_lease").unwrap();
    }
    set_mode(&path, 0o444);
    set_mode(&ledger_dir, 0o555);
    let before = snapshot(&ledger_dir);

    let output = harness(&["--ledger", path.to_str().unwrap(), "leases", "--json"], dir.path(), true);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let rows: Vec<Value> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["state"], "acquiring");
    assert_eq!(snapshot(&ledger_dir), before, "the ledger and its directory are unchanged");

    // No ledger at all: no rows, and none created.
    let missing = dir.path().join("missing/ledger.sqlite3");
    let output = harness(&["--ledger", missing.to_str().unwrap(), "leases", "--json"], dir.path(), true);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(output.stdout.is_empty());
    assert!(!missing.parent().unwrap().exists());
    set_mode(&ledger_dir, 0o755);
}

#[test]
fn a_sqlite_file_of_another_schema_is_refused_and_left_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let tables = dir.path().join("notes.db");
    Connection::open(&tables).unwrap().execute_batch("CREATE TABLE notes (body TEXT);").unwrap();
    let marked = dir.path().join("marked.db");
    Connection::open(&marked).unwrap().execute_batch("PRAGMA application_id = 1234;").unwrap();
    let text = dir.path().join("text.db");
    std::fs::write(&text, "not a database, just text that is long enough to have a header".repeat(10))
        .unwrap();
    let newer = dir.path().join("newer.db");
    Ledger::open(&newer).unwrap();
    Connection::open(&newer).unwrap().execute_batch("PRAGMA user_version = 99;").unwrap();
    let cases = [
        (&tables, "another application (tables notes)"),
        (&marked, "another application (application id 0x4d2)"),
        (&text, "not a SQLite database"),
        (&newer, "newer host-harness (ledger schema version 99"),
    ];
    for (path, words) in cases {
        let before = std::fs::read(path).unwrap();
        for error in [Ledger::open(path).err(), Ledger::open_read_only(path).err()] {
            let error = error.expect("refused").to_string();
            assert!(error.contains(path.to_str().unwrap()) && error.contains(words), "{error}");
            assert!(!error.contains('\n'), "{error}");
        }
        assert_eq!(std::fs::read(path).unwrap(), before, "{} unchanged", path.display());
        let output = harness(&["--ledger", path.to_str().unwrap(), "sweep"], dir.path(), false);
        let text = stderr(&output);
        assert_eq!(output.status.code(), Some(2), "{text}");
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(text.contains(words), "{text}");
    }
    let schema: Vec<String> = Connection::open(&tables)
        .unwrap()
        .prepare("SELECT name FROM sqlite_master")
        .unwrap()
        .query_map([], |row| row.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(schema, ["notes"], "no table added");
}

/// The `leases` table of ledger schema version 1, as that harness created it.
const LEASES_V1: &str = "
CREATE TABLE leases (
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
CREATE INDEX leases_state ON leases(state);
CREATE INDEX leases_provider_lease_id ON leases(provider_lease_id);
";

/// Writes a ledger of schema version 1 at `path` (marked, with its `hosts`
/// table, unless `unmarked`: what a harness wrote before ledgers were
/// marked) holding one active lifecycle lease of a process that is gone,
/// whose API lived in that process.
fn write_v1_ledger(path: &Path, unmarked: bool) {
    let conn = Connection::open(path).unwrap();
    conn.execute_batch(LEASES_V1).unwrap();
    if !unmarked {
        conn.execute_batch(
            "CREATE TABLE hosts (pid INTEGER NOT NULL, pid_start INTEGER NOT NULL, PRIMARY KEY (pid, pid_start));
             PRAGMA application_id = 1212697703; PRAGMA user_version = 1;",
        )
        .unwrap();
    }
    conn.execute(
        "INSERT INTO leases (owner, run_id, state, provider_lease_id, metadata_json, driver_key, company_id,
             environment_id, config_json, embedded_sim, last_hook, pid, pid_start, created_at, updated_at)
         VALUES ('lifecycle', 'run', 'active', 'sb-1', '{}', 'createos', 'c', 'e', '{}', 1,
             'acquire_lease', 2147483647, 1, '2026-01-01T00:00:00Z', '2026-01-01T00:00:00Z')",
        [],
    )
    .unwrap();
}

/// The ledger's schema version and the columns of its `leases` table.
fn schema(path: &Path) -> (i64, Vec<String>) {
    let conn = Connection::open(path).unwrap();
    let version = conn.query_row("PRAGMA user_version", [], |row| row.get(0)).unwrap();
    let columns = conn
        .prepare("SELECT name FROM pragma_table_info('leases')")
        .unwrap()
        .query_map([], |row| row.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    (version, columns)
}

#[test]
fn a_ledger_from_before_ledgers_were_marked_is_adopted() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.sqlite3");
    write_v1_ledger(&path, true);
    let rows = Ledger::open_read_only(&path).unwrap().unwrap().list().unwrap();
    assert_eq!(rows.len(), 1);
    assert!(rows[0].env.api_in_process);
    let rows = Ledger::open(&path).unwrap().list().unwrap();
    assert_eq!(rows.len(), 1);
    assert!(rows[0].env.api_in_process);
    let (version, columns) = schema(&path);
    assert_eq!(version, 2);
    assert!(columns.iter().any(|column| column == "api_in_process"), "{columns:?}");
}

#[test]
fn a_version_1_ledger_is_read_as_it_is_and_migrated_by_the_first_writer() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.sqlite3");
    write_v1_ledger(&path, false);
    let ledger = ["--ledger", path.to_str().unwrap()];

    // `leases` only reads: the row as a current ledger shows it, the file unchanged.
    let output = harness(&[&ledger[..], &["leases", "--json"]].concat(), dir.path(), false);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let row: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!((&row["providerLeaseId"], &row["apiInProcess"]), (&json!("sb-1"), &json!(true)), "{row}");
    assert_eq!(schema(&path).0, 1, "a reader migrates nothing");

    // `sweep` writes: the ledger is migrated, and the lease, whose API lived
    // in its gone process, is closed without a request.
    let output = harness(&[&ledger[..], &["sweep", "--json"]].concat(), dir.path(), false);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let lines: Vec<Value> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(lines[0]["outcome"], "gone_with_its_process", "{lines:?}");
    assert_eq!(lines[1]["goneWithItsProcess"], 1, "{lines:?}");
    let (version, columns) = schema(&path);
    assert_eq!(version, 2);
    assert!(columns.iter().any(|column| column == "api_in_process"), "{columns:?}");
    assert!(!columns.iter().any(|column| column == "embedded_sim"), "{columns:?}");
    let rows = Ledger::open(&path).unwrap().list().unwrap();
    assert_eq!(rows[0].state, provider_host::store::LeaseState::Destroyed);

    // The text form says what happened.
    write_v1_ledger(&dir.path().join("second.sqlite3"), false);
    let second = dir.path().join("second.sqlite3");
    let output = harness(&["--ledger", second.to_str().unwrap(), "sweep"], dir.path(), false);
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(text.contains("sb-1: gone with its process"), "{text}");
    assert!(text.contains("1 gone with their process"), "{text}");
}

#[test]
fn a_missing_ledger_directory_is_created_and_said_so() {
    let dir = tempfile::tempdir().unwrap();
    let ledger_dir = dir.path().join("state/deeper");
    let path = ledger_dir.join("ledger.sqlite3");
    let args = ["--ledger", path.to_str().unwrap(), "sweep", "--json"];
    let first = harness(&args, dir.path(), false);
    assert_eq!(first.status.code(), Some(0), "{}", stderr(&first));
    assert_eq!(stderr(&first), format!("created ledger directory {}\n", ledger_dir.display()));
    assert!(path.is_file());
    let second = harness(&args, dir.path(), false);
    assert_eq!(second.status.code(), Some(0), "{}", stderr(&second));
    assert_eq!(stderr(&second), "", "said once, when created");
}

#[test]
fn leases_escapes_control_characters_shortens_long_ids_and_aligns_columns() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.sqlite3");
    {
        let ledger = Ledger::open(&path).unwrap();
        let hostile = "sb-\u{1b}[31mred\nline";
        let long = format!("sb-{}", "0123456789".repeat(8));
        for id in [hostile, long.as_str(), "sb-short"] {
            let row = ledger.begin(Owner::Command, "run", &env(), "acquire_lease").unwrap();
            let lease =
                provider_abi::Lease { provider_lease_id: Some(id.into()).into(), ..Default::default() };
            ledger.set_lease(row, provider_host::store::LeaseState::Active, "acquire_lease", &lease).unwrap();
        }
    }
    let output = harness(&["--ledger", path.to_str().unwrap(), "leases"], dir.path(), false);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let text = String::from_utf8(output.stdout).unwrap();
    assert!(!text.contains('\u{1b}'), "no raw escape reaches the terminal: {text:?}");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 4, "a header and one line per row, the newline escaped: {text}");
    assert!(text.contains(r"sb-\u{1b}[31mred\nline"), "{text}");
    assert!(
        text.contains("sb-01234567890123456…1234567890123456789"),
        "long ids shortened in the middle: {text}"
    );
    let column = |line: &str| line.find("command").expect("owner column");
    assert!(lines[1..].iter().all(|line| column(line) == column(lines[1])), "aligned: {text}");
    let state = lines[0].find("state").unwrap();
    assert!(lines[1..].iter().all(|line| line[state..].starts_with("active")), "{text}");

    let json = harness(&["--ledger", path.to_str().unwrap(), "leases", "--json"], dir.path(), false);
    let rows: Vec<Value> = String::from_utf8(json.stdout)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(rows.len(), 3);
    assert_eq!(rows[0]["providerLeaseId"], "sb-\u{1b}[31mred\nline", "JSON keeps the exact id");
}
