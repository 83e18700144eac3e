//! Group commit: concurrent writers of one SQLite database share one
//! transaction and one `fsync`, as PostgreSQL's backends share a WAL flush.
//!
//! A [`Committer`] is a thread that owns a write connection. A writer sends
//! its write (a closure over the connection) with where to answer; the
//! committer takes every write queued, runs `BEGIN IMMEDIATE`, each write in
//! a savepoint of its own (a write that fails rolls back only itself and
//! fails only its caller), one `COMMIT`, and only then answers each caller.
//! So a write is durable before its caller hears of it, and a crash at any
//! instant loses only writes whose callers were still waiting.
//!
//! A lone writer never waits for company: the committer begins as soon as a
//! write arrives. Only while many writers are in flight (the store counts
//! them: [`Committer::writer_started`], [`Committer::writer_finished`]) does
//! it wait for a tenth of them to queue, at most [`MAX_COMPANY_WAIT`], and
//! never while a caller blocks its thread for a write queued: that thread
//! may be the one the others' writes come from (the futures it polls).

use rusqlite::Connection;
use std::{
    sync::{
        atomic::{AtomicU64, AtomicUsize, Ordering},
        mpsc, Arc, Mutex,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

/// A write: statements on the committer's connection, inside a transaction
/// the committer began. Returns a number for the caller (a row id, or 0).
pub type Write = Box<dyn FnOnce(&Connection) -> rusqlite::Result<i64> + Send>;

/// Where a write's outcome goes, once it is durable (or failed).
pub type Answer = Box<dyn FnOnce(rusqlite::Result<i64>) + Send>;

/// The longest a transaction waits for writers to join it.
pub const MAX_COMPANY_WAIT: Duration = Duration::from_millis(20);

/// A transaction waits for one in this many of the writers in flight.
const COMPANY_SHARE: usize = 10;

/// How many transactions committed and the writes they held.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CommitCounts {
    /// Transactions committed (each one `fsync` of the write-ahead log).
    pub commits: u64,
    /// Writes those transactions held, failed writes not counted.
    pub writes: u64,
}

#[derive(Default)]
struct Counters {
    commits: AtomicU64,
    writes: AtomicU64,
}

struct Job {
    write: Write,
    answer: Answer,
    /// The caller blocks its thread until answered.
    blocking: bool,
}

/// The committer thread of one connection. Dropping it lets the thread
/// commit what is queued, close the connection and end, and waits for that.
pub struct Committer {
    queue: Mutex<Option<mpsc::Sender<Job>>>,
    counters: Arc<Counters>,
    writers: Arc<AtomicUsize>,
    thread: Option<JoinHandle<()>>,
}

impl Committer {
    /// Starts the thread that commits on `conn`.
    pub fn start(conn: Connection) -> std::io::Result<Committer> {
        let (queue, jobs) = mpsc::channel();
        let counters = Arc::new(Counters::default());
        let writers = Arc::new(AtomicUsize::new(0));
        let (counted, busy) = (Arc::clone(&counters), Arc::clone(&writers));
        let thread = std::thread::Builder::new()
            .name("ledger-commit".into())
            .spawn(move || run(&conn, &jobs, &counted, &busy))?;
        Ok(Committer { queue: Mutex::new(Some(queue)), counters, writers, thread: Some(thread) })
    }

    /// A writer began: it will write again soon (a lease in flight).
    pub fn writer_started(&self) {
        self.writers.fetch_add(1, Ordering::Relaxed);
    }

    /// A writer finished: it writes no more.
    pub fn writer_finished(&self) {
        let _ = self.writers.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
    }

    /// Queues `write`; `answer` gets its outcome once the transaction that
    /// holds it committed (or failed). `blocking` says the caller blocks its
    /// thread meanwhile. Without a committer thread (it ended), `answer` is
    /// dropped unanswered.
    pub fn submit(&self, write: Write, answer: Answer, blocking: bool) {
        let queue = self.queue.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(queue) = queue.as_ref() {
            drop(queue.send(Job { write, answer, blocking }));
        }
    }

    /// The transactions committed so far and the writes they held.
    pub fn counts(&self) -> CommitCounts {
        CommitCounts {
            commits: self.counters.commits.load(Ordering::Relaxed),
            writes: self.counters.writes.load(Ordering::Relaxed),
        }
    }
}

impl Drop for Committer {
    fn drop(&mut self) {
        drop(self.queue.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).take());
        if let Some(thread) = self.thread.take() {
            drop(thread.join());
        }
    }
}

/// The committer's loop: a transaction per batch until every sender is gone.
fn run(conn: &Connection, jobs: &mpsc::Receiver<Job>, counters: &Counters, writers: &AtomicUsize) {
    while let Ok(first) = jobs.recv() {
        let mut batch = vec![first];
        batch.extend(jobs.try_iter());
        wait_for_company(jobs, &mut batch, writers.load(Ordering::Relaxed) / COMPANY_SHARE);
        commit(conn, batch, counters);
    }
}

/// Adds to `batch` the writes that arrive until it holds `wanted`, waiting
/// at most [`MAX_COMPANY_WAIT`], and not at all once it holds a write whose
/// caller blocks.
fn wait_for_company(jobs: &mpsc::Receiver<Job>, batch: &mut Vec<Job>, wanted: usize) {
    let deadline = Instant::now() + MAX_COMPANY_WAIT;
    while batch.len() < wanted && !batch.iter().any(|job| job.blocking) {
        let Some(left) = deadline.checked_duration_since(Instant::now()) else { return };
        match jobs.recv_timeout(left) {
            Ok(job) => {
                batch.push(job);
                batch.extend(jobs.try_iter());
            }
            Err(_) => return,
        }
    }
}

/// Runs `batch` in one transaction, a savepoint per write, and answers each.
fn commit(conn: &Connection, batch: Vec<Job>, counters: &Counters) {
    if let Err(error) = conn.execute_batch("BEGIN IMMEDIATE") {
        return fail_all(batch.into_iter().map(|job| job.answer), &error);
    }
    let mut done: Vec<(Answer, rusqlite::Result<i64>)> = Vec::with_capacity(batch.len());
    let mut jobs = batch.into_iter();
    while let Some(Job { write, answer, .. }) = jobs.next() {
        match in_savepoint(conn, write) {
            // The error ended the transaction (SQLite does so on an I/O
            // error or a full disk): the writes before it are gone too.
            Err(error) if conn.is_autocommit() => {
                let answers = done.into_iter().map(|(answer, _)| answer).chain([answer]);
                return fail_all(answers.chain(jobs.map(|job| job.answer)), &error);
            }
            outcome => done.push((answer, outcome)),
        }
    }
    if let Err(error) = conn.execute_batch("COMMIT") {
        let _ = conn.execute_batch("ROLLBACK");
        return fail_all(done.into_iter().map(|(answer, _)| answer), &error);
    }
    counters.commits.fetch_add(1, Ordering::Relaxed);
    let written = done.iter().filter(|(_, outcome)| outcome.is_ok()).count();
    counters.writes.fetch_add(written as u64, Ordering::Relaxed);
    for (answer, outcome) in done {
        answer(outcome);
    }
}

/// Runs `write` in a savepoint: released when it succeeds, rolled back when
/// it fails.
fn in_savepoint(conn: &Connection, write: Write) -> rusqlite::Result<i64> {
    conn.prepare_cached("SAVEPOINT write")?.execute([])?;
    let outcome = write(conn);
    if outcome.is_err() && !conn.is_autocommit() {
        conn.prepare_cached("ROLLBACK TO write")?.execute([])?;
    }
    if !conn.is_autocommit() {
        conn.prepare_cached("RELEASE write")?.execute([])?;
    }
    outcome
}

fn fail_all(answers: impl Iterator<Item = Answer>, error: &rusqlite::Error) {
    for answer in answers {
        answer(Err(duplicate(error)));
    }
}

/// `error` again, for each caller a failed transaction fails.
fn duplicate(error: &rusqlite::Error) -> rusqlite::Error {
    match error {
        rusqlite::Error::SqliteFailure(code, message) => {
            rusqlite::Error::SqliteFailure(*code, message.clone())
        }
        other => rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_ERROR),
            Some(other.to_string()),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn committer() -> (tempfile::TempDir, Committer) {
        let dir = tempfile::tempdir().unwrap();
        let conn = Connection::open(dir.path().join("db.sqlite3")).unwrap();
        conn.execute_batch("PRAGMA journal_mode = WAL; CREATE TABLE t (v INTEGER NOT NULL UNIQUE)").unwrap();
        (dir, Committer::start(conn).unwrap())
    }

    fn insert(v: i64) -> Write {
        Box::new(move |conn| {
            conn.execute("INSERT INTO t (v) VALUES (?1)", [v])?;
            Ok(conn.last_insert_rowid())
        })
    }

    fn wait(committer: &Committer, write: Write) -> rusqlite::Result<i64> {
        let (sender, answer) = mpsc::sync_channel(1);
        committer.submit(write, Box::new(move |outcome| drop(sender.send(outcome))), true);
        answer.recv().unwrap()
    }

    /// A write that fails fails alone: the others of its transaction commit.
    #[test]
    fn a_failing_write_fails_only_its_caller() {
        let (_dir, committer) = committer();
        let answers: Vec<_> = [1, 2, 1, 3]
            .into_iter()
            .map(|v| {
                let (sender, answer) = mpsc::sync_channel(1);
                committer.submit(insert(v), Box::new(move |outcome| drop(sender.send(outcome))), false);
                answer
            })
            .collect();
        let outcomes: Vec<bool> = answers.into_iter().map(|answer| answer.recv().unwrap().is_ok()).collect();
        assert_eq!(outcomes, [true, true, false, true]);
        let count =
            wait(&committer, Box::new(|conn| conn.query_row("SELECT count(*) FROM t", [], |row| row.get(0))));
        assert_eq!(count.unwrap(), 3);
        assert_eq!(committer.counts().writes, 4, "three inserts and the count: {:?}", committer.counts());
    }

    /// Each write is answered after its own commit when writers take turns.
    #[test]
    fn a_lone_writer_commits_each_write() {
        let (_dir, committer) = committer();
        for v in 0..5 {
            wait(&committer, insert(v)).unwrap();
        }
        assert_eq!(committer.counts(), CommitCounts { commits: 5, writes: 5 });
    }
}
