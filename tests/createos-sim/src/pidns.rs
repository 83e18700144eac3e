//! A PID namespace per command: a sandbox's processes see each other only,
//! never the host's or another sandbox's (`ps`, `/proc`), as in a real
//! sandbox.
//!
//! `unshare(CLONE_NEWPID)` moves only the caller's later children into the
//! new namespace, the first of them its PID 1. So the forked child that is
//! to run a command forks twice before `exec` ([`enter`]):
//! - it stays the *relay*, the process the simulator spawned (the tree's
//!   leader, in the host's namespace): it waits for the command, its own
//!   child, and ends the same way (its exit code, or the same signal), so
//!   the leader's status is the command's. It ignores every signal it may
//!   (a signal to the tree reaches the command itself), and SIGKILL ends it
//!   with the rest;
//! - its first child is the namespace's *init* (PID 1), which adopts every
//!   process orphaned in the namespace. It waits until the relay has gone
//!   (the end of a pipe), then reaps until no process of the namespace
//!   remains and exits (the kernel kills what is left when an init exits,
//!   so it waits: a command's leftovers outlive it as before);
//! - its second child is the command (PID 2), which mounts the namespace's
//!   own `/proc` and is the one process [`enter`] returns in, to `exec`.
//!
//! The relay and the init never `exec`, so they close every descriptor but
//! their end of the pipe: the command's output pipes then reach EOF when its
//! own processes close them, and the spawner's exec-error pipe when it
//! execs. Everything here runs between `fork` and `exec` of a multithreaded
//! process: async-signal-safe syscalls only.

use std::io;
use std::os::fd::RawFd;

/// The name the namespace's init shows in `ps`.
const INIT_NAME: &std::ffi::CStr = c"sandbox-init";

/// Moves the calling (forked, single-threaded) child's command into a new
/// PID namespace, whose own `/proc` it mounts at `/proc` (the caller has
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
    let [relay_gone, relay_alive] = ends;
    let init = match libc::fork() {
        -1 => return Err(io::Error::last_os_error()),
        0 => init(relay_gone),
        init => init,
    };
    libc::close(relay_gone);
    let command = match libc::fork() {
        -1 => return Err(io::Error::last_os_error()),
        0 => {
            libc::close(relay_alive);
            let flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
            let proc = c"proc".as_ptr();
            if libc::mount(proc, c"/proc".as_ptr(), proc, flags, std::ptr::null()) != 0 {
                return Err(io::Error::last_os_error());
            }
            return Ok(());
        }
        command => command,
    };
    relay(command, relay_alive, wait_for_namespace.then_some(init))
}

/// PID 1 of the namespace: waits for the relay to go (`relay_gone` reads
/// EOF), then reaps until no process of the namespace remains.
unsafe fn init(relay_gone: RawFd) -> ! {
    libc::prctl(libc::PR_SET_NAME, INIT_NAME.as_ptr());
    keep_only(relay_gone);
    let mut byte = 0u8;
    while libc::read(relay_gone, (&mut byte as *mut u8).cast(), 1) != 0 {
        if io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            break;
        }
    }
    loop {
        let mut status = 0;
        if libc::waitpid(-1, &mut status, 0) == -1
            && io::Error::last_os_error().raw_os_error() != Some(libc::EINTR)
        {
            // ECHILD: no process of the namespace remains.
            libc::_exit(0);
        }
    }
}

/// The leader: waits for the command (and for the init, when given) and
/// ends as the command did. Its end of the pipe closes as it ends.
unsafe fn relay(command: libc::pid_t, relay_alive: RawFd, init: Option<libc::pid_t>) -> ! {
    keep_only(relay_alive);
    for signal in 1..=64 {
        if !matches!(signal, libc::SIGKILL | libc::SIGSTOP | libc::SIGCHLD) {
            libc::signal(signal, libc::SIG_IGN);
        }
    }
    let status = wait_for(command);
    if let Some(init) = init {
        libc::close(relay_alive);
        wait_for(init);
    }
    end_as(status)
}

/// The wait status of child `pid` once it has ended (125 as an exit code
/// when it cannot be had).
unsafe fn wait_for(pid: libc::pid_t) -> libc::c_int {
    let mut status = 0;
    loop {
        if libc::waitpid(pid, &mut status, 0) == pid {
            return status;
        }
        if io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return 125 << 8;
        }
    }
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
