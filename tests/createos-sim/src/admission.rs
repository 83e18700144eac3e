//! Admission: how much of the process's open-file limit connections and
//! commands may take, so that a load past it waits instead of failing.
//!
//! Every connection holds a socket and every running command about
//! [`FILES_PER_COMMAND`] files (two output pipes, their duplicates for the
//! unread-bytes probe, a pidfd, its mount namespace). Without a bound, ten
//! thousand lifecycles in flight ran the simulator out of open files (10,749
//! sockets and 2,358 commands running against a limit of 20,000) and
//! requests failed. With one:
//!
//! - a connection past the bound is not accepted yet: it waits, handshake
//!   done and request sent, in the kernel's listen queue
//!   ([`LISTEN_BACKLOG`]), where it costs the simulator no file; while the
//!   bound is reached, every response closes its connection
//!   ([`Admission::connections_exhausted`]), so a queued connection gets the
//!   next turn instead of waiting for a client to give up one it keeps
//!   reusing (at 10,000 lifecycles in flight, without this, a request waited
//!   up to 13 minutes in the queue while 8,000 kept-alive connections were
//!   served in turn, and 1,735 lifecycles timed out);
//! - a command past [`Admission::commands`] waits for a running one to end
//!   before it is spawned (its request stays open meanwhile).
//!
//! A real server bounds its connections and workers the same way; a client
//! sees latency, never an error. The bounds are far above what any test
//! reaches (8,000 connections and 1,333 commands at a limit of 20,000).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Open files one running command holds.
pub(crate) const FILES_PER_COMMAND: usize = 6;
/// Connections the kernel queues, handshake done, until they are accepted
/// (capped by `net.core.somaxconn`).
pub(crate) const LISTEN_BACKLOG: i32 = 4096;
/// The share of the open-file limit for connections, and again for running
/// commands, in fifths; the last fifth is for everything else (state files,
/// `/proc` reads, the ledger, the embedding process's own files).
const FIFTHS_EACH: usize = 2;
/// Bounds kept whatever the limit.
const MIN_CONNECTIONS: usize = 256;
const MIN_COMMANDS: usize = 64;

/// The two bounds, as semaphores whose permits are held for as long as a
/// connection is open or a command's files are.
#[derive(Debug)]
pub(crate) struct Admission {
    connections: Arc<Semaphore>,
    /// True while a connection waits for room: every one admitted is open.
    connections_full: AtomicBool,
    commands: Arc<Semaphore>,
}

impl Admission {
    /// Bounds for a process whose soft limit of open files is `open_files`.
    pub(crate) fn for_open_files(open_files: usize) -> Admission {
        let share = open_files / 5 * FIFTHS_EACH;
        Admission::bounded(share.max(MIN_CONNECTIONS), (share / FILES_PER_COMMAND).max(MIN_COMMANDS))
    }

    /// At most `connections` open connections and `commands` running commands.
    pub(crate) fn bounded(connections: usize, commands: usize) -> Admission {
        Admission {
            connections: Arc::new(Semaphore::new(connections)),
            connections_full: AtomicBool::new(false),
            commands: Arc::new(Semaphore::new(commands)),
        }
    }

    /// Bounds for this process's soft limit of open files now.
    pub(crate) fn for_this_process() -> Admission {
        Admission::for_open_files(soft_open_files_limit())
    }

    /// Waits for room for one more connection (one caller at a time: the
    /// accept loop).
    pub(crate) async fn connection(&self) -> OwnedSemaphorePermit {
        if let Ok(room) = self.connections.clone().try_acquire_owned() {
            return room;
        }
        self.connections_full.store(true, Ordering::SeqCst);
        let room = self.connections.clone().acquire_owned().await.expect("the semaphore is never closed");
        self.connections_full.store(false, Ordering::SeqCst);
        room
    }

    /// True while every connection the bound admits is open and the next
    /// one waits for room in the listen queue: a response should close its
    /// connection and let that one in.
    pub(crate) fn connections_exhausted(&self) -> bool {
        self.connections_full.load(Ordering::SeqCst)
    }

    /// Waits for room for one more running command.
    pub(crate) async fn command(&self) -> OwnedSemaphorePermit {
        self.commands.clone().acquire_owned().await.expect("the semaphore is never closed")
    }

    /// Connections admitted at once.
    #[cfg(test)]
    fn connections(&self) -> usize {
        self.connections.available_permits()
    }

    /// Commands admitted at once.
    #[cfg(test)]
    fn commands(&self) -> usize {
        self.commands.available_permits()
    }
}

/// This process's soft `RLIMIT_NOFILE` (1,024 if it cannot be read).
fn soft_open_files_limit() -> usize {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit only writes the struct we pass.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0 {
        usize::try_from(limit.rlim_cur).unwrap_or(usize::MAX)
    } else {
        1024
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_follow_the_open_file_limit() {
        let a = Admission::for_open_files(20_000);
        assert_eq!((a.connections(), a.commands()), (8_000, 1_333));
        let small = Admission::for_open_files(1_024);
        assert_eq!((small.connections(), small.commands()), (408, 68));
        let tiny = Admission::for_open_files(100);
        assert_eq!((tiny.connections(), tiny.commands()), (MIN_CONNECTIONS, MIN_COMMANDS));
    }

    #[tokio::test]
    async fn a_command_past_the_bound_waits_for_one_to_end() {
        let a = Admission::for_open_files(0);
        let mut running = Vec::new();
        for _ in 0..MIN_COMMANDS {
            running.push(a.command().await);
        }
        assert!(a.commands.clone().try_acquire_owned().is_err(), "admitted past the bound");
        running.pop();
        assert!(a.commands.clone().try_acquire_owned().is_ok(), "not admitted once one ended");
    }

    #[tokio::test]
    async fn connections_are_exhausted_while_one_waits_for_room() {
        let a = Admission::bounded(2, 1);
        let first = a.connection().await;
        let _second = a.connection().await;
        assert!(!a.connections_exhausted(), "two of two open, none waiting");
        let mut third = std::pin::pin!(a.connection());
        assert!(futures_util::poll!(third.as_mut()).is_pending());
        assert!(a.connections_exhausted(), "a third waits");
        drop(first);
        let _third = third.await;
        assert!(!a.connections_exhausted(), "the third got in");
    }
}
