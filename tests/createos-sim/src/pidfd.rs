//! Processes held by a pidfd, so that a process id is never mistaken for the
//! process that held it before.
//!
//! A command's leader is observed through its pidfd without being reaped:
//! once it exits it stays a zombie until its tree is gone, so its process id
//! (which is also the number of the group `kill(-pgid)` signals) cannot be
//! given to a new process while the tree may still signal that group. When
//! the leader was reaped at once, a tree still draining its output (or
//! paused, or deleted with its sandbox) signalled whichever newcomer had been
//! given the freed number: a command of another sandbox died of SIGKILL
//! before it wrote a byte.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use tokio::io::unix::AsyncFd;

use crate::proctable::{read_entry, ProcEntry};

/// A pidfd of one process.
#[derive(Debug)]
pub(crate) struct Pidfd(OwnedFd);

impl Pidfd {
    /// A pidfd of the process that holds `pid` now, if any.
    pub(crate) fn open(pid: i32) -> io::Result<Pidfd> {
        // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor nobody else owns.
        Ok(Pidfd(unsafe { OwnedFd::from_raw_fd(fd as i32) }))
    }

    /// A pidfd of `pid` if the process holding `pid`, looked at after the
    /// pidfd was opened, still passes `still`: so it never names a process
    /// that took the id since the caller last looked.
    pub(crate) fn open_if(pid: i32, still: impl FnOnce(&ProcEntry) -> bool) -> Option<Pidfd> {
        let pidfd = Pidfd::open(pid).ok()?;
        read_entry(pid).is_some_and(|now| still(&now)).then_some(pidfd)
    }

    /// Send `sig` to this process (never to one that took its id later).
    pub(crate) fn signal(&self, sig: i32) {
        // SAFETY: pidfd_send_signal with a pidfd we own and no siginfo.
        unsafe {
            libc::syscall(libc::SYS_pidfd_send_signal, self.0.as_raw_fd(), sig, std::ptr::null::<u8>(), 0)
        };
    }

    /// The exit status of this process (a child of ours) if it has exited.
    /// With `reap` the zombie is released and its id freed; without, it
    /// stays a zombie.
    pub(crate) fn exit_status(&self, reap: bool) -> Option<ExitStatus> {
        let flags = libc::WEXITED | libc::WNOHANG | if reap { 0 } else { libc::WNOWAIT };
        // SAFETY: siginfo_t is plain data; waitid fills it.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: waitid on a pidfd we own, writing into `info`.
        let result =
            unsafe { libc::waitid(libc::P_PIDFD, self.0.as_raw_fd() as libc::id_t, &mut info, flags) };
        // SAFETY: waitid filled the SIGCHLD fields (si_pid stays 0 if nothing exited).
        let (pid, status) = unsafe { (info.si_pid(), info.si_status()) };
        if result != 0 || pid == 0 {
            return None;
        }
        let raw = match info.si_code {
            libc::CLD_EXITED => (status & 0xff) << 8,
            libc::CLD_DUMPED => status | 0x80,
            _ => status,
        };
        Some(ExitStatus::from_raw(raw))
    }
}

impl AsRawFd for Pidfd {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.0.as_raw_fd()
    }
}

/// The leader of a process tree: a child of ours, left unreaped after it
/// exits until [`Leader::release`], which also closes its pidfd (ten
/// thousand sandboxes keep many finished trees).
#[derive(Debug)]
pub(crate) struct Leader {
    pid: i32,
    /// `None` once released.
    fd: Mutex<Option<Arc<AsyncFd<Pidfd>>>>,
    exit: OnceLock<ExitStatus>,
}

/// Leaders whose tree was dropped while they still ran; reaped by the next
/// [`Leader::new`] once they have exited.
static PARKED: Mutex<Vec<Pidfd>> = Mutex::new(Vec::new());

impl Leader {
    /// Hold the child `pid` we just started (not yet waited for). Must run
    /// inside a tokio runtime.
    pub(crate) fn new(pid: i32) -> io::Result<Leader> {
        reap_parked();
        // SAFETY: the pidfd is owned by the AsyncFd and never closed or
        // replaced while it is.
        let fd =
            unsafe { AsyncFd::register_with_interest(Pidfd::open(pid)?, tokio::io::Interest::READABLE)? };
        Ok(Leader { pid, fd: Mutex::new(Some(Arc::new(fd))), exit: OnceLock::new() })
    }

    /// Its process id, which is also its group's number.
    pub(crate) fn pid(&self) -> i32 {
        self.pid
    }

    fn fd(&self) -> MutexGuard<'_, Option<Arc<AsyncFd<Pidfd>>>> {
        self.fd.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Its exit status once it has exited (it is not reaped).
    pub(crate) fn exit_status(&self) -> Option<ExitStatus> {
        if let Some(status) = self.exit.get() {
            return Some(*status);
        }
        let status = self.fd().as_ref()?.get_ref().exit_status(false)?;
        Some(*self.exit.get_or_init(|| status))
    }

    /// Wait until it exits (it is not reaped).
    pub(crate) async fn exited(&self) -> io::Result<ExitStatus> {
        loop {
            if let Some(status) = self.exit_status() {
                return Ok(status);
            }
            // Released only after it exited: the pidfd is still here.
            let Some(fd) = self.fd().clone() else {
                return Err(io::Error::other("leader released before it exited"));
            };
            // A pidfd becomes readable when its process exits.
            fd.readable().await?.clear_ready();
        }
    }

    /// Reap the exited leader, freeing its number. Only for a tree that
    /// will signal nothing again.
    pub(crate) fn release(&self) {
        if self.exit_status().is_none() {
            return;
        }
        if let Some(fd) = self.fd().take() {
            fd.get_ref().exit_status(true);
        }
    }
}

impl Drop for Leader {
    fn drop(&mut self) {
        // Nothing can signal through this leader any more: reap it now, or,
        // still running, in a later spawn once it has exited.
        let Some(fd) = self.fd().take().and_then(|fd| Arc::try_unwrap(fd).ok()) else { return };
        let pidfd = fd.into_inner();
        if pidfd.exit_status(true).is_none() {
            PARKED.lock().unwrap_or_else(|e| e.into_inner()).push(pidfd);
        }
    }
}

fn reap_parked() {
    PARKED.lock().unwrap_or_else(|e| e.into_inner()).retain(|pidfd| pidfd.exit_status(true).is_none());
}
