//! A PID namespace per command: a sandbox's processes see each other only,
//! never the host's or another sandbox's (`ps`, `/proc`), as in a real
//! sandbox.
//!
//! `unshare(CLONE_NEWPID)` moves only the caller's later children into the
//! new namespace, so the forked child that is to run a command splits in
//! three before `exec` ([`enter`]):
//! - the *relay*, the process the simulator spawned (the tree's leader, in
//!   the host's namespace), waits for the command's wait status and ends the
//!   same way (its exit code, or the same signal), so the leader's status is
//!   the command's. It ignores every signal it may (a signal to the tree
//!   reaches the command itself), and SIGKILL ends it with the rest;
//! - the namespace's *init* (PID 1) mounts the namespace's own `/proc`,
//!   reaps every process orphaned in the namespace, reports the command's
//!   status to the relay and exits once no process of the namespace remains
//!   (the kernel kills what is left when an init exits, so it waits);
//! - the command (PID 2), the one process [`enter`] returns in, to `exec`.
//!
//! The relay and the init never `exec`, so they close every descriptor but
//! their status pipe: the command's output pipes then reach EOF when its own
//! processes close them, and the spawner's exec-error pipe when it execs.
//! Everything here runs between `fork` and `exec` of a multithreaded
//! process: async-signal-safe syscalls only.

use std::io;
use std::os::fd::RawFd;

/// The name the namespace's init shows in `ps`.
const INIT_NAME: &std::ffi::CStr = c"sandbox-init";

/// Moves the calling (forked, single-threaded) child's command into a new
/// PID namespace, whose `/proc` is mounted at `/proc` (the caller has
/// entered its private mount namespace and root already). Returns only in
/// the command's process; the relay and the init it leaves end with
/// `_exit`. With `wait_for_namespace` the relay ends only once the init
/// has (no process of the namespace remains), so nothing outlives it.
///
/// # Safety
/// Only in a child between `fork` and `exec`.
pub(crate) unsafe fn enter(wait_for_namespace: bool) -> io::Result<()> {
    if libc::unshare(libc::CLONE_NEWPID) != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut ends = [0; 2];
    if libc::pipe2(ends.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
        return Err(io::Error::last_os_error());
    }
    let [status_in, status_out] = ends;
    match libc::fork() {
        -1 => Err(io::Error::last_os_error()),
        0 => {
            libc::close(status_in);
            init(status_out)
        }
        init_pid => {
            libc::close(status_out);
            relay(status_in, init_pid, wait_for_namespace)
        }
    }
}

/// PID 1 of the namespace: mounts its `/proc`, forks the command (which
/// returns), then reaps until no process remains.
unsafe fn init(report: RawFd) -> io::Result<()> {
    let flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
    if libc::mount(c"proc".as_ptr(), c"/proc".as_ptr(), c"proc".as_ptr(), flags, std::ptr::null()) != 0 {
        return Err(io::Error::last_os_error());
    }
    let command = match libc::fork() {
        -1 => return Err(io::Error::last_os_error()),
        0 => {
            libc::close(report);
            return Ok(());
        }
        command => command,
    };
    libc::prctl(libc::PR_SET_NAME, INIT_NAME.as_ptr());
    keep_only(report);
    let mut report = Some(report);
    loop {
        let mut status = 0;
        let pid = libc::waitpid(-1, &mut status, 0);
        if pid == -1 {
            if io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            // ECHILD: no process of the namespace remains.
            libc::_exit(0);
        }
        if pid == command {
            if let Some(fd) = report.take() {
                let bytes = status.to_ne_bytes();
                libc::write(fd, bytes.as_ptr().cast(), bytes.len());
                libc::close(fd);
            }
        }
    }
}

/// The leader: waits for the command's status from the init (and for the
/// init itself with `wait_for_init`) and ends as the command did.
unsafe fn relay(status_in: RawFd, init_pid: libc::pid_t, wait_for_init: bool) -> ! {
    keep_only(status_in);
    for signal in 1..=64 {
        if !matches!(signal, libc::SIGKILL | libc::SIGSTOP | libc::SIGCHLD) {
            libc::signal(signal, libc::SIG_IGN);
        }
    }
    let mut bytes = [0u8; 4];
    let mut read = 0;
    while read < bytes.len() {
        let n = libc::read(status_in, bytes[read..].as_mut_ptr().cast(), bytes.len() - read);
        if n <= 0 {
            break;
        }
        read += n as usize;
    }
    let status = if read == bytes.len() {
        if wait_for_init {
            let mut ignored = 0;
            libc::waitpid(init_pid, &mut ignored, 0);
        }
        i32::from_ne_bytes(bytes)
    } else {
        // The init ended without reporting (killed with the tree): end as it did.
        let mut status = 0;
        if libc::waitpid(init_pid, &mut status, 0) != init_pid {
            libc::_exit(125);
        }
        status
    };
    end_as(status)
}

/// Ends this process with wait status `status`: the same exit code, or the
/// same signal (without a core dump).
unsafe fn end_as(status: libc::c_int) -> ! {
    if libc::WIFSIGNALED(status) {
        let signal = libc::WTERMSIG(status);
        let no_core = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        libc::setrlimit(libc::RLIMIT_CORE, &no_core);
        libc::signal(signal, libc::SIG_DFL);
        let mut set = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, signal);
        libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
        libc::kill(libc::getpid(), signal);
        libc::_exit(128 + signal);
    }
    libc::_exit(if libc::WIFEXITED(status) { libc::WEXITSTATUS(status) } else { 125 })
}

/// Closes every descriptor but `fd`.
unsafe fn keep_only(fd: RawFd) {
    let fd = fd as libc::c_uint;
    if fd > 0 {
        libc::close_range(0, fd - 1, 0);
    }
    libc::close_range(fd + 1, libc::c_uint::MAX, 0);
}
