//! Group commit: concurrent writers of one SQLite database share one
//! transaction and one `fsync`, as PostgreSQL's backends share a WAL flush.
//!
//! A [`Committer`] is a thread that owns a write connection. A writer sends
//! its write (a closure over the connection) with where to answer; the
//! committer runs `BEGIN IMMEDIATE` when a write arrives, runs each write as
//! it arrives in a savepoint of its own (a write that fails rolls back only
//! itself and fails only its caller), one `COMMIT` for all of them, and only
//! then answers each caller. So a write is durable before its caller hears
//! of it, and a crash at any instant loses only writes whose callers were
//! still waiting.
//!
//! A queued write ([`Waiting::Queued`]) is answered as soon as it ran (a
//! row id its caller needs at once), before it is durable: its caller
//! awaits the durability of a later write instead, which commits in the
//! same transaction or a later one. A transaction that fails after it
//! answered a queued write leaves the committer failing every later write:
//! the row ids it handed out were rolled back and may be given to other
//! rows, which a write meant for a lost row must never change; and so a
//! later write is durable only if the queued one is.
//!
//! A lone writer never waits for company: the committer commits as soon as
//! the writes queued have run. Only while other writers are in flight (the
//! store counts them: [`Committer::writer_started`],
//! [`Committer::writer_finished`]) does a transaction wait for a third of
//! them to join, at most [`MAX_COMPANY_WAIT`], and never while a caller
//! blocks its thread for a write queued: that thread may be the one the
//! others' writes come from (the futures it polls).

use crate::store::CommitCounts;
use rusqlite::Connection;
use std::{
    sync::{
        atomic::{AtomicU64, AtomicUsize, Ordering},
        mpsc, Arc,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

/// A write: statements on the committer's connection, inside a transaction
/// the committer began. Returns a number for the caller (a row id, or 0).
pub type Write = Box<dyn FnOnce(&Connection) -> rusqlite::Result<i64> + Send>;

/// A write's outcome: its number, or its error as text (one error fails
/// every write of a transaction, and a SQLite error cannot be cloned).
pub type Outcome = Result<i64, String>;

/// Where a write's outcome goes, once it is durable (or failed).
pub type Answer = Box<dyn FnOnce(Outcome) + Send>;

/// The longest a transaction waits for writers to join it.
pub const MAX_COMPANY_WAIT: Duration = Duration::from_millis(100);

/// A transaction waits for one in this many of the writers in flight.
const COMPANY_SHARE: usize = 3;

/// What the committer counts, and the writers in flight the store counts.
#[derive(Default)]
struct Counters {
    commits: AtomicU64,
    writes: AtomicU64,
    writers: AtomicUsize,
}

/// How a write's caller waits for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waiting {
    /// Its task awaits the answer, given once the write is durable.
    Task,
    /// It blocks its thread until answered, once the write is durable.
    Thread,
    /// It hears as soon as the write ran, and awaits durability apart.
    Queued,
}

struct Job {
    write: Write,
    answer: Answer,
    waiting: Waiting,
}

/// The committer thread of one connection. Dropping it lets the thread
/// commit what is queued, close the connection and end, and waits for that.
pub struct Committer {
    /// The queue and the thread reading it (taken by `drop`).
    running: Option<(mpsc::Sender<Job>, JoinHandle<()>)>,
    counters: Arc<Counters>,
}

impl Committer {
    /// Starts the thread that commits on `conn`.
    pub fn start(conn: Connection) -> std::io::Result<Committer> {
        let (queue, jobs) = mpsc::channel();
        let counters = Arc::new(Counters::default());
        let counted = Arc::clone(&counters);
        let thread = std::thread::Builder::new()
            .name("ledger-commit".into())
            .spawn(move || run(&conn, &jobs, &counted))?;
        Ok(Committer { running: Some((queue, thread)), counters })
    }

    /// A writer began: it will write again soon (a lease in flight).
    pub fn writer_started(&self) {
        self.counters.writers.fetch_add(1, Ordering::Relaxed);
    }

    /// A writer finished: it writes no more.
    pub fn writer_finished(&self) {
        let _ =
            self.counters.writers.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
    }

    /// Queues `write`; `answer` gets its outcome once the transaction that
    /// holds it committed (or failed), or for [`Waiting::Queued`] as soon as
    /// it ran, in a transaction not yet committed: a write sent after that
    /// answer commits in the same transaction or a later one, and fails if
    /// this one's transaction failed, so whoever awaits it awaits this one
    /// too. Without a committer thread (it ended), `answer` is dropped
    /// unanswered.
    pub fn send(&self, write: Write, answer: Answer, waiting: Waiting) {
        if let Some((queue, _)) = &self.running {
            drop(queue.send(Job { write, answer, waiting }));
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
        if let Some((queue, thread)) = self.running.take() {
            drop(queue);
            drop(thread.join());
        }
    }
}

/// The committer's loop: a transaction per batch until every sender is gone.
fn run(conn: &Connection, jobs: &mpsc::Receiver<Job>, counters: &Counters) {
    // Set once a transaction failed after naming rows to a queued write.
    let mut broken: Option<String> = None;
    while let Ok(first) = jobs.recv() {
        if let Some(error) = &broken {
            fail_all([first].into_iter().chain(jobs.try_iter()).map(|job| job.answer), error);
            continue;
        }
        let wanted = counters.writers.load(Ordering::Relaxed) / COMPANY_SHARE;
        let mut batch = match Batch::begin(conn) {
            Ok(batch) => batch,
            Err(error) => {
                (first.answer)(Err(error.to_string()));
                continue;
            }
        };
        batch.add(first);
        while batch.ended.is_none() {
            let Ok(job) = jobs.try_recv() else { break };
            batch.add(job);
        }
        let deadline = Instant::now() + MAX_COMPANY_WAIT;
        while batch.ended.is_none() && batch.done.len() < wanted && !batch.blocking {
            let Some(left) = deadline.checked_duration_since(Instant::now()) else { break };
            let Ok(job) = jobs.recv_timeout(left) else { break };
            batch.add(job);
        }
        broken = batch.commit(counters);
    }
}

/// The writes of one open transaction, each run as it arrives.
struct Batch<'c> {
    conn: &'c Connection,
    /// The writes run so far: where each answer goes, and its outcome.
    done: Vec<(Answer, Outcome)>,
    /// Some caller blocks its thread for a write of this batch.
    blocking: bool,
    /// A queued write of this batch was answered before the commit.
    named: bool,
    /// The error that ended the transaction, every write in it failed.
    ended: Option<String>,
}

impl<'c> Batch<'c> {
    fn begin(conn: &'c Connection) -> rusqlite::Result<Batch<'c>> {
        conn.prepare_cached("BEGIN IMMEDIATE")?.execute([])?;
        Ok(Batch { conn, done: Vec::new(), blocking: false, named: false, ended: None })
    }

    /// Runs `job`'s write in the transaction (it must be open: not `ended`).
    fn add(&mut self, Job { write, answer, waiting }: Job) {
        let outcome = in_savepoint(self.conn, write).map_err(|error| error.to_string());
        if let (Err(error), true) = (&outcome, self.conn.is_autocommit()) {
            // The error ended the transaction (SQLite does so on an I/O
            // error or a full disk): the writes before it are gone too.
            self.ended = Some(error.clone());
        }
        self.blocking |= waiting == Waiting::Thread;
        let answer = match waiting {
            Waiting::Queued => {
                self.named |= outcome.is_ok();
                answer(outcome.clone());
                Box::new(drop)
            }
            Waiting::Task | Waiting::Thread => answer,
        };
        self.done.push((answer, outcome));
    }

    /// Commits, and answers each write. Returns the error that leaves the
    /// committer broken: a failed transaction that named rows.
    fn commit(self, counters: &Counters) -> Option<String> {
        let committed = match self.ended {
            Some(error) => Err(error),
            None => self
                .conn
                .prepare_cached("COMMIT")
                .and_then(|mut commit| commit.execute([]))
                .map_err(|error| error.to_string()),
        };
        if let Err(error) = committed {
            let _ = self.conn.execute_batch("ROLLBACK");
            fail_all(self.done.into_iter().map(|(answer, _)| answer), &error);
            return self
                .named
                .then(|| format!("a transaction that named rows failed ({error}); reopen the ledger"));
        }
        counters.commits.fetch_add(1, Ordering::Relaxed);
        let written = self.done.iter().filter(|(_, outcome)| outcome.is_ok()).count();
        counters.writes.fetch_add(written as u64, Ordering::Relaxed);
        for (answer, outcome) in self.done {
            answer(outcome);
        }
        None
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

fn fail_all(answers: impl Iterator<Item = Answer>, error: &str) {
    for answer in answers {
        answer(Err(error.to_owned()));
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

    fn wait(committer: &Committer, write: Write) -> Outcome {
        let (sender, answer) = mpsc::sync_channel(1);
        committer.send(write, Box::new(move |outcome| drop(sender.send(outcome))), Waiting::Thread);
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
                committer.send(insert(v), Box::new(move |outcome| drop(sender.send(outcome))), Waiting::Task);
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

    /// Writes that arrive while a transaction runs join it: one commit
    /// (one `fsync`) for all of them, each answered after it.
    #[test]
    fn writes_that_arrive_while_a_transaction_runs_share_its_commit() {
        let (_dir, committer) = committer();
        let (gate, opened) = mpsc::sync_channel::<()>(1);
        let held: Write = Box::new(move |conn: &Connection| {
            opened.recv().unwrap();
            conn.execute("INSERT INTO t (v) VALUES (0)", [])?;
            Ok(conn.last_insert_rowid())
        });
        let answers: Vec<_> = std::iter::once(held)
            .chain((1..=10).map(insert))
            .map(|write| {
                let (sender, answer) = mpsc::sync_channel(1);
                committer.send(write, Box::new(move |outcome| drop(sender.send(outcome))), Waiting::Task);
                answer
            })
            .collect();
        gate.send(()).unwrap();
        for answer in answers {
            answer.recv().unwrap().unwrap();
        }
        assert_eq!(committer.counts(), CommitCounts { commits: 1, writes: 11 });
    }

    /// A queued write is answered once it ran; a write sent after that
    /// answer commits with it or after it.
    #[test]
    fn a_queued_write_is_answered_before_its_commit_and_a_later_write_commits_after_it() {
        let (_dir, committer) = committer();
        let (sender, executed) = mpsc::sync_channel(1);
        committer.send(insert(7), Box::new(move |outcome| drop(sender.send(outcome))), Waiting::Queued);
        let row = executed.recv().unwrap().unwrap();
        wait(&committer, insert(8)).unwrap();
        let rows = wait(
            &committer,
            Box::new(move |conn| {
                conn.query_row("SELECT count(*) FROM t WHERE rowid <= ?1", [row], |r| r.get(0))
            }),
        );
        assert_eq!(rows.unwrap(), 1);
        assert_eq!(committer.counts().writes, 3, "{:?}", committer.counts());
    }

    /// A transaction that ends on an error after a queued write was
    /// answered fails that write's later writes and every write after: the
    /// row id it handed out may be given to another row.
    #[test]
    fn a_transaction_lost_after_naming_a_row_fails_every_later_write() {
        let (_dir, committer) = committer();
        let (gate, opened) = mpsc::sync_channel::<()>(1);
        let held = Box::new(move |conn: &Connection| {
            opened.recv().unwrap();
            conn.execute("INSERT INTO t (v) VALUES (1)", [])?;
            Ok(conn.last_insert_rowid())
        });
        let (sender, executed) = mpsc::sync_channel(1);
        committer.send(held, Box::new(move |outcome| drop(sender.send(outcome))), Waiting::Queued);
        // Queued behind the held write, so the same transaction runs it: it
        // ends the transaction, as an I/O error does.
        let (sender, ending) = mpsc::sync_channel(1);
        let end: Write = Box::new(|conn| {
            conn.execute_batch("ROLLBACK")?;
            Err(rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_IOERR), None))
        });
        committer.send(end, Box::new(move |outcome| drop(sender.send(outcome))), Waiting::Task);
        gate.send(()).unwrap();

        assert_eq!(executed.recv().unwrap().unwrap(), 1, "the queued write named its row");
        assert!(ending.recv().unwrap().is_err());
        let later = wait(&committer, insert(2)).unwrap_err();
        assert!(later.to_string().contains("reopen the ledger"), "{later}");
        assert_eq!(committer.counts().commits, 0);
    }
}
