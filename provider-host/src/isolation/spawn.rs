//! Starting a worker process: what it inherits and the limits it runs under.
//!
//! The worker gets its end of a Unix socket pair as file descriptor 3,
//! `/dev/null` as stdin, the host's stderr as stdout and stderr (a provider
//! printing cannot corrupt the host's output), an empty environment (the
//! variables the provider needs come in the handshake), resource limits
//! (`setrlimit`; no core dumps: a provider's memory may hold secrets), a
//! process group of its own (a terminal's Ctrl-C is the host's to handle)
//! and `PR_SET_PDEATHSIG`, so it dies with the host.
//!
//! The parent-death signal fires when the *thread* that forked the worker
//! ends, not the process; hooks run on whatever thread the host calls them
//! from (a soak's lifecycle threads come and go), so every worker is forked
//! by one spawner thread that lives as long as the process.

use nix::{
    sys::{
        prctl,
        resource::{getrlimit, setrlimit, Resource},
        signal::Signal,
    },
    unistd::{getpid, getppid, setpgid, Pid},
};
use std::{
    io,
    os::{fd::AsRawFd, unix::net::UnixStream, unix::process::CommandExt},
    process::{Child, Command, Stdio},
    sync::{mpsc, OnceLock},
};

/// The file descriptor the worker finds its socket on.
pub const WORKER_FD: i32 = 3;

/// Resource limits of a worker process; `None` leaves the host's own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Address space in bytes (`RLIMIT_AS`): a runaway allocation fails
    /// (and the worker aborts) instead of exhausting the machine.
    pub address_space: Option<u64>,
    /// CPU time in seconds (`RLIMIT_CPU`), over the worker's whole life; past
    /// it the worker is killed (`SIGXCPU`) and the next call starts another.
    pub cpu_seconds: Option<u64>,
    /// Open file descriptors (`RLIMIT_NOFILE`), capped at the host's hard limit.
    pub open_files: Option<u64>,
}

impl Default for Limits {
    /// 16 GiB of address space (a provider's runtime reserves far more
    /// virtual memory than it touches: thread stacks, malloc arenas), one
    /// hour of CPU, 8192 open files.
    fn default() -> Self {
        Limits { address_space: Some(16 << 30), cpu_seconds: Some(3600), open_files: Some(8192) }
    }
}

/// Starts `command` (a worker: a program whose `main` calls
/// [`run_worker_if_requested`](super::run_worker_if_requested), and its
/// arguments) with `socket` as its file descriptor 3, under `limits`.
pub fn spawn(command: Command, limits: &Limits, socket: UnixStream) -> io::Result<Child> {
    type Job = Box<dyn FnOnce() + Send>;
    static SPAWNER: OnceLock<mpsc::Sender<Job>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (jobs, incoming) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("provider-worker-spawner".into())
            .spawn(move || incoming.into_iter().for_each(|job| job()))
            .expect("start the worker spawner thread");
        jobs
    });
    let (reply, answer) = mpsc::channel();
    let limits = limits.clone();
    let job: Job = Box::new(move || {
        let _ = reply.send(spawn_here(command, limits, socket));
    });
    spawner
        .send(job)
        .ok()
        .and_then(|()| answer.recv().ok())
        .ok_or_else(|| io::Error::other("the worker spawner thread is gone"))?
}

fn spawn_here(mut command: Command, limits: Limits, socket: UnixStream) -> io::Result<Child> {
    let stderr = std::io::stderr();
    let stdout: Stdio = std::os::fd::AsFd::as_fd(&stderr).try_clone_to_owned()?.into();
    command.env_clear().stdin(Stdio::null()).stdout(stdout).stderr(Stdio::inherit());
    let fd = socket.as_raw_fd();
    let parent = getpid();
    // SAFETY: async-signal-safe calls only (prctl, getppid, setpgid, dup2,
    // fcntl, close_range, getrlimit/setrlimit), no allocation, between fork and exec.
    unsafe {
        command.pre_exec(move || {
            prctl::set_pdeathsig(Signal::SIGKILL)?;
            if getppid() != parent {
                return Err(io::Error::other("the host exited while its worker started"));
            }
            // Its own process group: a terminal's Ctrl-C reaches the host,
            // which cleans up through the worker, never the worker itself.
            setpgid(Pid::from_raw(0), Pid::from_raw(0))?;
            // On descriptor 3 already, it only loses its close-on-exec flag.
            let moved =
                if fd == WORKER_FD { libc::fcntl(fd, libc::F_SETFD, 0) } else { libc::dup2(fd, WORKER_FD) };
            if moved < 0 {
                return Err(io::Error::last_os_error());
            }
            // Nothing else of the host's reaches the worker (or the commands
            // it starts), whether or not it was opened close-on-exec.
            // The system call, not glibc's wrapper (2.34 and later only).
            let marked =
                libc::syscall(libc::SYS_close_range, WORKER_FD + 1, u32::MAX, libc::CLOSE_RANGE_CLOEXEC);
            if marked != 0 {
                // A kernel before 5.11 lacks it or the flag: mark each one.
                let (open_files, _) = getrlimit(Resource::RLIMIT_NOFILE)?;
                for other in WORKER_FD + 1..open_files.min(1 << 20) as i32 {
                    libc::fcntl(other, libc::F_SETFD, libc::FD_CLOEXEC);
                }
            }
            set_limit(Resource::RLIMIT_AS, limits.address_space, 0)?;
            // A second more of hard limit: the soft one's SIGXCPU names the
            // cause; the hard one's is a plain SIGKILL.
            set_limit(Resource::RLIMIT_CPU, limits.cpu_seconds, 1)?;
            set_limit(Resource::RLIMIT_NOFILE, limits.open_files, 0)?;
            // No core dump: a crashed provider's memory may hold secrets.
            set_limit(Resource::RLIMIT_CORE, Some(0), 0)?;
            Ok(())
        });
    }
    command.spawn()
}

/// Lowers `resource`'s soft limit to `value` and its hard limit to `value +
/// headroom` (never above the current hard limit, which an unprivileged
/// process cannot raise).
fn set_limit(resource: Resource, value: Option<u64>, headroom: u64) -> io::Result<()> {
    let Some(value) = value else { return Ok(()) };
    let (_, hard) = getrlimit(resource)?;
    Ok(setrlimit(resource, value.min(hard), value.saturating_add(headroom).min(hard))?)
}
