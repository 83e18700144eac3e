//! A private PostgreSQL cluster for a test: `initdb` in a temporary
//! directory, the server listening on a Unix socket in that directory only
//! (no TCP), stopped and removed when dropped. As root (CI), the cluster
//! runs as the `postgres` user (or `nobody`): PostgreSQL refuses root.
//!
//! [`PgCluster::for_test`] says in one line when PostgreSQL cannot start
//! and the test is skipped; under CI (`CI` set) that is a failure instead.

use std::{
    io::{BufRead, BufReader},
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::Duration,
};

/// A running private cluster.
pub struct PgCluster {
    dir: tempfile::TempDir,
    server: Child,
}

/// Where PostgreSQL's server programs are: `$PG_BINDIR`, else the newest
/// `/usr/lib/postgresql/*/bin` (Debian's layout), else `$PATH`.
fn bin_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("PG_BINDIR") {
        return Some(PathBuf::from(dir));
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            bin.join("initdb").exists().then_some((version, bin))
        })
        .collect();
    versions.sort();
    if let Some((_, bin)) = versions.pop() {
        return Some(bin);
    }
    std::env::var_os("PATH")
        .and_then(|path| std::env::split_paths(&path).find(|dir| dir.join("initdb").exists()))
}

/// The user and group the cluster runs as: ours, or when we are root the
/// `postgres` user (or `nobody`).
fn run_as() -> Option<(u32, u32)> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return None;
    }
    ["postgres", "nobody"].iter().find_map(|name| {
        let name = std::ffi::CString::new(*name).ok()?;
        // SAFETY: a valid C string; the result is read at once, before any
        // other call could reuse getpwnam's static buffer (tests that start
        // clusters at once read the same, constant entries).
        let entry = unsafe { libc::getpwnam(name.as_ptr()) };
        // SAFETY: non-null entries point to a valid passwd record.
        (!entry.is_null()).then(|| unsafe { ((*entry).pw_uid, (*entry).pw_gid) })
    })
}

impl PgCluster {
    /// Starts a cluster: durable (`fsync` on, as in production) or not (the
    /// tests: the same SQL, without waiting for the disk).
    pub fn start(durable: bool) -> Result<PgCluster, String> {
        let bin = bin_dir().ok_or("no PostgreSQL server programs (initdb) found")?;
        let dir = tempfile::Builder::new()
            .prefix("pg-cluster-")
            .tempdir()
            .map_err(|error| format!("cannot create a temporary directory: {error}"))?;
        let user = run_as();
        if let Some((uid, gid)) = user {
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid)).map_err(|error| {
                format!("cannot hand {} to the cluster's user: {error}", dir.path().display())
            })?;
        }
        let as_user = |command: &mut Command| {
            if let Some((uid, gid)) = user {
                command.uid(uid).gid(gid);
            }
        };
        let data = dir.path().join("data");
        let mut initdb = Command::new(bin.join("initdb"));
        initdb
            .args(["-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-locale", "--no-sync", "-D"])
            .arg(&data);
        as_user(&mut initdb);
        let output = initdb.output().map_err(|error| format!("cannot run initdb: {error}"))?;
        if !output.status.success() {
            let stderr = String::from_utf8_lossy(&output.stderr);
            return Err(format!("initdb failed: {}", stderr.lines().last().unwrap_or("").trim()));
        }
        let mut server = Command::new(bin.join("postgres"));
        server
            .arg("-D")
            .arg(&data)
            .arg("-k")
            .arg(dir.path())
            .args(["-c", "listen_addresses=", "-c", "max_connections=300", "-c", "log_min_messages=warning"])
            .args(["-c", if durable { "fsync=on" } else { "fsync=off" }])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        as_user(&mut server);
        // SAFETY: prctl only sets this child's parent-death signal, between
        // fork and exec: the server stops when the test that started it dies.
        unsafe {
            server.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGQUIT);
                Ok(())
            });
        }
        let mut server = server.spawn().map_err(|error| format!("cannot start postgres: {error}"))?;
        let stderr = server.stderr.take().expect("piped");
        let (ready, is_ready) = mpsc::channel();
        std::thread::spawn(move || {
            let mut last = String::new();
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if line.contains("ready to accept connections") {
                    let _ = ready.send(Ok(()));
                }
                last = line;
            }
            let _ = ready.send(Err(last));
        });
        let cluster = PgCluster { dir, server };
        match is_ready.recv_timeout(Duration::from_secs(120)) {
            Ok(Ok(())) => Ok(cluster),
            Ok(Err(last)) => Err(format!("postgres exited: {last}")),
            Err(_) => Err("postgres did not get ready within 120 s".into()),
        }
    }

    /// A cluster for `test`, or `None` after saying in one line why it could
    /// not start; under CI (`CI` set) a cluster that cannot start fails the test.
    pub fn for_test(test: &str) -> Option<PgCluster> {
        match PgCluster::start(false) {
            Ok(cluster) => Some(cluster),
            Err(error) if std::env::var_os("CI").is_some() => {
                panic!("{test}: cannot start PostgreSQL, and CI must run this test: {error}")
            }
            Err(error) => {
                // Past the test harness's output capture: the line shows in a passing run.
                use std::io::Write;
                let line =
                    format!("SKIPPED {test}: cannot start PostgreSQL ({error}); `.ci/run` installs it\n");
                let _ = std::io::stderr().write_all(line.as_bytes());
                None
            }
        }
    }

    /// The directory holding the server's socket.
    pub fn socket_dir(&self) -> &Path {
        self.dir.path()
    }

    /// The URL of database `db` on this cluster.
    pub fn url(&self, db: &str) -> String {
        format!("postgresql:///{db}?host={}&user=postgres", self.socket_dir().display())
    }

    /// Creates database `db` and returns its URL.
    pub fn create_database(&self, db: &str) -> String {
        let mut client = postgres::Client::connect(&self.url("postgres"), postgres::NoTls)
            .expect("connect to the cluster");
        client.batch_execute(&format!("CREATE DATABASE \"{db}\"")).expect("create a database");
        self.url(db)
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        // SIGINT: PostgreSQL's fast shutdown.
        // SAFETY: kill only signals our own child.
        unsafe { libc::kill(self.server.id() as i32, libc::SIGINT) };
        let _ = self.server.wait();
    }
}
