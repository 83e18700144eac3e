//! Real OS processes: spawning, process trees, output journals.
//!
//! A *tree* is the process group created by the child's `setsid` plus every
//! process sharing the child's private mount namespace (so even a descendant
//! that started its own session is found). The simulator process is made a
//! child subreaper, so orphaned descendants are re-parented to it and reaped
//! here. The leader alone stays a zombie after it exits, until its tree is
//! gone, so the group's number is never another process's while the tree
//! may signal it (see [`crate::pidfd`]).

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::ExitStatusExt;
use std::process::{ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::{ChildStderr, ChildStdout};
use tokio::sync::{watch, OwnedSemaphorePermit};

use crate::isolation::{Child, ChildSetup, SandboxDirs};
use crate::pidfd::{Leader, Pidfd};
use crate::proctable::{ProcEntry, ProcTable};

/// How long to wait for pipes to reach EOF after the leader exited.
const DRAIN_AFTER_EXIT: Duration = Duration::from_millis(200);
/// Maximum bytes kept per stream of an `/exec` result.
const EXEC_OUTPUT_CAP: usize = 8 * 1024 * 1024;

/// Become a child subreaper so orphaned descendants are re-parented to us.
pub(crate) fn become_subreaper() {
    // SAFETY: prctl with integer arguments.
    unsafe {
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
    }
}

/// A process tree rooted at a leader that called `setsid`.
#[derive(Debug)]
pub(crate) struct Tree {
    /// Its number is the group's; unreaped until the tree is gone.
    leader: Leader,
    mnt_ns: Option<u64>,
    /// Keeps the namespace (and so its inode number) alive while the tree
    /// may still have members; namespace inodes are reused once freed.
    ns_fd: Mutex<Option<std::fs::File>>,
    /// Held while signalling and while declaring the tree gone (which
    /// releases the leader's number): no signal outlives the number.
    life: Mutex<()>,
    gone: AtomicBool,
}

impl Tree {
    fn new(leader: Leader) -> Tree {
        let own = std::fs::metadata("/proc/self/ns/mnt").ok().map(|m| m.ino());
        // Only a private namespace identifies the tree.
        let ns_fd = std::fs::File::open(format!("/proc/{}/ns/mnt", leader.pid())).ok().and_then(|f| {
            let ino = f.metadata().ok()?.ino();
            (Some(ino) != own).then_some((f, ino))
        });
        Tree {
            leader,
            mnt_ns: ns_fd.as_ref().map(|(_, ino)| *ino),
            ns_fd: Mutex::new(ns_fd.map(|(f, _)| f)),
            life: Mutex::new(()),
            gone: AtomicBool::new(false),
        }
    }

    fn pgid(&self) -> i32 {
        self.leader.pid()
    }

    fn life(&self) -> std::sync::MutexGuard<'_, ()> {
        self.life.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Live members (the leader until it exits), reaping zombie orphans
    /// that are ours; the leader is only ever reaped by [`Leader::release`].
    /// The table is taken after this call began, so a member that existed
    /// when it was asked is in it.
    fn members(&self) -> Vec<ProcEntry> {
        let me = std::process::id() as i32;
        let table = ProcTable::taken_since(Instant::now());
        let mut out = Vec::new();
        for entry in table.entries() {
            let member = entry.pgrp == self.pgid() || (self.mnt_ns.is_some() && entry.mnt_ns == self.mnt_ns);
            if !member {
                continue;
            }
            if entry.pid == self.pgid() {
                if !entry.zombie && self.leader.exit_status().is_none() {
                    out.push(*entry);
                }
                continue;
            }
            if entry.zombie && entry.ppid == me {
                // An orphan re-parented to us (subreaper): reap it if it
                // still is one (another call may have reaped it already).
                let still_ours = |now: &ProcEntry| now.zombie && now.ppid == me && now.pgrp == self.pgid();
                if let Some(orphan) = Pidfd::open_if(entry.pid, still_ours) {
                    orphan.exit_status(true);
                }
                continue;
            }
            out.push(*entry);
        }
        out
    }

    /// Send `sig` to every member of the tree.
    pub(crate) fn signal(&self, sig: i32) {
        let _life = self.life();
        if self.gone.load(Ordering::SeqCst) {
            return;
        }
        // SAFETY: signalling our own process group, whose number the
        // unreleased leader keeps ours.
        unsafe { libc::kill(-self.pgid(), sig) };
        if self.mnt_ns.is_none() {
            return;
        }
        // Members that left the group (their own session) but not the
        // namespace, each through a pidfd: never a process that took a
        // member's id.
        for entry in self.members().into_iter().filter(|e| e.pgrp != self.pgid()) {
            if let Some(member) = Pidfd::open_if(entry.pid, |now| now.mnt_ns == self.mnt_ns) {
                member.signal(sig);
            }
        }
    }

    /// True once no member remains (the leader exited, nothing else
    /// alive); the leader is then reaped and its number freed.
    pub(crate) fn is_gone(&self) -> bool {
        if self.gone.load(Ordering::SeqCst) {
            return true;
        }
        if self.leader.exit_status().is_none() || !self.members().is_empty() {
            return false;
        }
        let _life = self.life();
        self.gone.store(true, Ordering::SeqCst);
        self.leader.release();
        self.ns_fd.lock().unwrap_or_else(|e| e.into_inner()).take();
        true
    }

    /// Poll until the tree is gone or `deadline` passes.
    pub(crate) async fn wait_gone(&self, deadline: Instant) -> bool {
        loop {
            if self.is_gone() {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// SIGTERM (+SIGCONT), wait up to `grace`, SIGKILL, wait; true if the
    /// whole tree is confirmed gone.
    pub(crate) async fn terminate(&self, grace: Duration) -> bool {
        if self.is_gone() {
            return true;
        }
        self.signal(libc::SIGTERM);
        self.signal(libc::SIGCONT);
        if self.wait_gone(Instant::now() + grace).await {
            return true;
        }
        self.kill_and_wait(Duration::from_secs(3)).await
    }

    /// SIGKILL everything and wait up to `limit` for it to disappear.
    pub(crate) async fn kill_and_wait(&self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        loop {
            if self.is_gone() {
                return true;
            }
            self.signal(libc::SIGKILL);
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// Why spawning failed.
#[derive(Debug)]
pub(crate) enum SpawnError {
    /// The command could not be executed (not found, not executable, bad cwd).
    BadCommand(io::Error),
    /// Anything else: a server-side failure.
    Internal(io::Error),
}

impl std::fmt::Display for SpawnError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SpawnError::BadCommand(e) => write!(f, "cannot start command: {e}"),
            SpawnError::Internal(e) => write!(f, "process creation failed: {e}"),
        }
    }
}

fn spawn(
    dirs: &SandboxDirs,
    cmd: &str,
    args: &[String],
    cwd: Option<&str>,
) -> Result<(Pipes, Arc<Tree>), SpawnError> {
    use std::os::unix::process::CommandExt;
    let setup = ChildSetup::new(dirs, cwd).map_err(SpawnError::BadCommand)?;
    let mut c = std::process::Command::new(cmd);
    c.args(args)
        .env_clear()
        .env("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
        // The sandbox's own workspace, never the host user's home: a login
        // shell (`bash -l`) must not run the host's dotfiles (a `pyenv init`
        // there, killed mid-rehash with its tree, leaves a lock that stalls
        // every later login shell).
        .env("HOME", crate::isolation::WORKSPACE)
        .env("LANG", "C.UTF-8")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: `apply` only performs async-signal-safe syscalls.
    unsafe {
        c.pre_exec(move || setup.apply(Child::Command));
    }
    let mut child = c.spawn().map_err(|e| match e.raw_os_error() {
        Some(libc::ENOENT | libc::EACCES | libc::ENOTDIR | libc::ENOEXEC) => SpawnError::BadCommand(e),
        _ => SpawnError::Internal(e),
    })?;
    // The child is never waited for through `child`: its leader holds it.
    let leader = match Leader::new(child.id() as i32) {
        Ok(leader) => leader,
        Err(e) => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(SpawnError::Internal(e));
        }
    };
    let pipes = Pipes {
        stdout: child.stdout.take().map(ChildStdout::from_std).transpose().map_err(SpawnError::Internal)?,
        stderr: child.stderr.take().map(ChildStderr::from_std).transpose().map_err(SpawnError::Internal)?,
    };
    Ok((pipes, Arc::new(Tree::new(leader))))
}

/// A started command's output pipes.
struct Pipes {
    stdout: Option<ChildStdout>,
    stderr: Option<ChildStderr>,
}

/// Result of a synchronous `/exec`.
#[derive(Debug)]
pub(crate) struct ExecOutput {
    pub exit_code: i32,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

/// A running `/exec` command, registered with its sandbox so it can be killed.
pub(crate) struct ExecRun {
    pub tree: Arc<Tree>,
    pipes: Pipes,
    /// Its room among the running commands, held until it is finished.
    _room: OwnedSemaphorePermit,
}

/// Start an `/exec` command in the `room` admission gave it.
pub(crate) fn start_exec(
    dirs: &SandboxDirs,
    cmd: &str,
    args: &[String],
    cwd: Option<&str>,
    room: OwnedSemaphorePermit,
) -> Result<ExecRun, SpawnError> {
    let (pipes, tree) = spawn(dirs, cmd, args, cwd)?;
    Ok(ExecRun { tree, pipes, _room: room })
}

impl ExecRun {
    /// Wait for the command, collect its output and kill what it left behind.
    pub(crate) async fn finish(mut self) -> io::Result<ExecOutput> {
        let out_buf = Arc::new(Mutex::new(Vec::new()));
        let err_buf = Arc::new(Mutex::new(Vec::new()));
        let out_task = tokio::spawn(collect(self.pipes.stdout.take(), out_buf.clone()));
        let err_task = tokio::spawn(collect(self.pipes.stderr.take(), err_buf.clone()));
        let status = self.tree.leader.exited().await?;
        // Pipes reach EOF unless a leftover descendant holds them.
        finished(&out_task, &err_task, DRAIN_AFTER_EXIT).await;
        // A short command: whatever it left running is killed when it
        // returns, which also closes the pipes it held.
        self.tree.kill_and_wait(Duration::from_secs(3)).await;
        finished(&out_task, &err_task, Duration::from_secs(3)).await;
        out_task.abort();
        err_task.abort();
        let take =
            |b: &Arc<Mutex<Vec<u8>>>| std::mem::take(&mut *b.lock().unwrap_or_else(|e| e.into_inner()));
        Ok(ExecOutput { exit_code: exit_code(status), stdout: take(&out_buf), stderr: take(&err_buf) })
    }
}

/// Poll until both tasks finished (true) or `limit` passed (false).
/// Duplicates of a process's output pipes, asking the kernel how many bytes
/// wait unread in them. Duplicates, so the pumps may close their own ends.
struct UnreadProbe {
    pipes: Vec<OwnedFd>,
}

impl UnreadProbe {
    fn new(fds: [Option<RawFd>; 2]) -> Self {
        let pipes = fds
            .into_iter()
            .flatten()
            // SAFETY: `fd` is open (its owner is alive here); dup returns a new
            // descriptor we own, or -1.
            .filter_map(|fd| match unsafe { libc::dup(fd) } {
                -1 => None,
                // SAFETY: a fresh descriptor nobody else owns.
                copy => Some(unsafe { OwnedFd::from_raw_fd(copy) }),
            })
            .collect();
        Self { pipes }
    }

    /// Bytes written to the pipes and not read yet.
    fn bytes(&self) -> usize {
        self.pipes
            .iter()
            .map(|pipe| {
                let mut unread: libc::c_int = 0;
                // SAFETY: FIONREAD writes one int.
                let ok = unsafe { libc::ioctl(pipe.as_raw_fd(), libc::FIONREAD, &mut unread) } == 0;
                if ok {
                    unread.max(0) as usize
                } else {
                    0
                }
            })
            .sum()
    }
}

async fn finished<T>(
    a: &tokio::task::JoinHandle<T>,
    b: &tokio::task::JoinHandle<T>,
    limit: Duration,
) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if a.is_finished() && b.is_finished() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

async fn collect<R: AsyncRead + Unpin>(r: Option<R>, buf: Arc<Mutex<Vec<u8>>>) {
    let Some(mut r) = r else { return };
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        match r.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                let mut b = buf.lock().unwrap_or_else(|e| e.into_inner());
                let room = EXEC_OUTPUT_CAP.saturating_sub(b.len());
                b.extend_from_slice(&chunk[..n.min(room)]);
            }
        }
    }
}

fn exit_code(status: ExitStatus) -> i32 {
    match (status.code(), status.signal()) {
        (Some(c), _) => c,
        (None, Some(s)) => 128 + s,
        _ => -1,
    }
}

/// Name of a signal number (`SIGKILL`), or `SIG<n>`.
pub(crate) fn signal_name(sig: i32) -> String {
    let name = match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        _ => return format!("SIG{sig}"),
    };
    name.to_string()
}

/// One journal entry.
#[derive(Debug, Clone)]
pub(crate) struct Frame {
    pub seq: u64,
    pub stderr: bool,
    pub data: Bytes,
}

impl Frame {
    /// Appends the NDJSON line (with trailing newline) to `out`, the base64
    /// encoded straight into it: no field needs escaping.
    pub(crate) fn write_line(&self, out: &mut Vec<u8>) {
        use std::io::Write as _;
        let stream = if self.stderr { "stderr" } else { "stdout" };
        let _ = write!(out, r#"{{"type":"data","seq":{},"stream":"{stream}","data_base64":""#, self.seq);
        let start = out.len();
        out.resize(start + base64::encoded_len(self.data.len(), true).unwrap_or(0), 0);
        let written = base64::engine::general_purpose::STANDARD
            .encode_slice(&self.data, &mut out[start..])
            .unwrap_or(0);
        out.truncate(start + written);
        out.extend_from_slice(b"\"}\n");
    }

    /// At most the length of its NDJSON line.
    pub(crate) fn line_len_bound(&self) -> usize {
        const FIELDS: usize =
            r#"{"type":"data","seq":18446744073709551615,"stream":"stdout","data_base64":""}"#.len() + 1;
        FIELDS + base64::encoded_len(self.data.len(), true).unwrap_or(usize::MAX - FIELDS)
    }
}

/// How a managed process ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Exit {
    Code(i32),
    Signal(String),
}

impl Exit {
    /// The NDJSON exit line (with trailing newline).
    pub(crate) fn to_line(&self) -> Vec<u8> {
        let v = match self {
            Exit::Code(c) => serde_json::json!({"type": "exit", "exit_code": c}),
            Exit::Signal(s) => serde_json::json!({"type": "exit", "signal": s}),
        };
        let mut l = serde_json::to_vec(&v).unwrap_or_default();
        l.push(b'\n');
        l
    }
}

/// Bounded output journal with sequence numbers.
#[derive(Debug)]
pub(crate) struct Journal {
    frames: VecDeque<Frame>,
    bytes: usize,
    cap: usize,
    next_seq: u64,
    exit: Option<Exit>,
}

/// What a reader at cursor `after` gets now.
#[derive(Debug)]
pub(crate) enum ReadResult {
    /// Frames with seq > after (maybe none) and the exit, if reached.
    Frames(Vec<Frame>, Option<Exit>),
    /// Frame `after + 1` was evicted.
    Evicted,
}

impl Journal {
    pub(crate) fn new(cap: usize) -> Journal {
        Journal { frames: VecDeque::new(), bytes: 0, cap: cap.max(1), next_seq: 1, exit: None }
    }

    fn push(&mut self, stderr: bool, data: Bytes) {
        if self.exit.is_some() || data.is_empty() {
            return;
        }
        while self.bytes + data.len() > self.cap {
            match self.frames.pop_front() {
                Some(f) => self.bytes -= f.data.len(),
                None => break,
            }
        }
        self.bytes += data.len();
        self.frames.push_back(Frame { seq: self.next_seq, stderr, data });
        self.next_seq += 1;
    }

    pub(crate) fn read(&self, after: u64) -> ReadResult {
        let first = self.frames.front().map_or(self.next_seq, |f| f.seq);
        if after + 1 < first {
            return ReadResult::Evicted;
        }
        let frames = self.frames.iter().filter(|f| f.seq > after).cloned().collect();
        ReadResult::Frames(frames, self.exit.clone())
    }

    /// Whether `n` more bytes fit without evicting a frame after `taken`.
    fn has_room(&self, n: usize, taken: u64) -> bool {
        let untaken: usize = self.frames.iter().filter(|f| f.seq > taken).map(|f| f.data.len()).sum();
        untaken + n <= self.cap
    }
}

/// A managed process (`POST /processes`).
#[derive(Debug)]
pub(crate) struct ManagedProcess {
    pub tree: Arc<Tree>,
    journal: Mutex<Journal>,
    changed: watch::Sender<u64>,
    /// [`crate::SimConfig::pace_output`].
    paced: bool,
    /// The last frame a reader has taken from the journal.
    taken: watch::Sender<u64>,
    stdin_closed: AtomicBool,
    /// True once the leader has exited.
    exited: watch::Sender<bool>,
}

impl ManagedProcess {
    /// Spawn the command in the `room` admission gave it (held until its
    /// output is drained and its tree gone) and start journaling its output
    /// in a journal of `journal_bytes`, `paced` or not.
    pub(crate) fn spawn(
        dirs: &SandboxDirs,
        cmd: &str,
        args: &[String],
        cwd: Option<&str>,
        (journal_bytes, paced): (usize, bool),
        room: OwnedSemaphorePermit,
    ) -> Result<Arc<ManagedProcess>, SpawnError> {
        let (pipes, tree) = spawn(dirs, cmd, args, cwd)?;
        let p = Arc::new(ManagedProcess {
            tree,
            journal: Mutex::new(Journal::new(journal_bytes)),
            changed: watch::channel(0).0,
            paced,
            taken: watch::channel(0).0,
            stdin_closed: AtomicBool::new(false),
            exited: watch::channel(false).0,
        });
        let chunk = journal_bytes.clamp(1, 64 * 1024);
        let Pipes { stdout: out, stderr: err } = pipes;
        let unread =
            UnreadProbe::new([out.as_ref().map(AsRawFd::as_raw_fd), err.as_ref().map(AsRawFd::as_raw_fd)]);
        let out_task = tokio::spawn(pump(p.clone(), out, false, chunk));
        let err_task = tokio::spawn(pump(p.clone(), err, true, chunk));
        let pw = p.clone();
        tokio::spawn(async move {
            let status = pw.tree.leader.exited().await;
            pw.exited.send_replace(true);
            // Wait for EOF on both pipes, or until they have been idle for
            // DRAIN_AFTER_EXIT with nothing left unread in them (a leftover
            // descendant may hold them open). "Nothing unread" matters under
            // load, when the pumps may not run for longer than the window.
            loop {
                let before = *pw.changed.borrow();
                if finished(&out_task, &err_task, DRAIN_AFTER_EXIT).await {
                    break;
                }
                if *pw.changed.borrow() == before && unread.bytes() == 0 {
                    break;
                }
            }
            let exit = match status {
                Ok(s) => match (s.code(), s.signal()) {
                    (Some(c), _) => Exit::Code(c),
                    (None, Some(sig)) => Exit::Signal(signal_name(sig)),
                    _ => Exit::Code(-1),
                },
                Err(_) => Exit::Code(-1),
            };
            pw.lock().exit = Some(exit);
            pw.changed.send_modify(|v| *v += 1);
            // A tree with no member left lets go of its namespace's file now,
            // not when its sandbox goes: ten thousand sandboxes alive would
            // otherwise hold tens of thousands of open files.
            pw.tree.is_gone();
            drop(room);
        });
        Ok(p)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Journal> {
        self.journal.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Read the journal after cursor `after`.
    pub(crate) fn read(&self, after: u64) -> ReadResult {
        self.lock().read(after)
    }

    /// Journal `data` unless the journal is paced and it would evict a
    /// frame after `taken`; whether it did.
    fn push(&self, stderr: bool, data: &Bytes, taken: u64) -> bool {
        let mut journal = self.lock();
        let room = !self.paced || journal.has_room(data.len(), taken);
        if room {
            journal.push(stderr, data.clone());
        }
        room
    }

    /// A reader has taken the frames up to `seq`.
    pub(crate) fn taken(&self, seq: u64) {
        self.taken.send_if_modified(|t| {
            let later = seq > *t;
            *t = (*t).max(seq);
            later
        });
    }

    /// Subscribe to journal changes.
    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// Mark stdin closed; false if it already was.
    pub(crate) fn close_stdin(&self) -> bool {
        !self.stdin_closed.swap(true, Ordering::SeqCst)
    }

    /// Wait (bounded) until the leader has exited.
    pub(crate) async fn wait_exited(&self, limit: Duration) -> bool {
        let mut rx = self.exited.subscribe();
        let ok = tokio::time::timeout(limit, async { rx.wait_for(|r| *r).await.is_ok() }).await;
        ok.unwrap_or(false)
    }
}

async fn pump<R: AsyncRead + Unpin>(p: Arc<ManagedProcess>, r: Option<R>, stderr: bool, chunk: usize) {
    let Some(mut r) = r else { return };
    let mut buf = vec![0u8; chunk];
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                let data = Bytes::copy_from_slice(&buf[..n]);
                // Paced, the piece (and so the command, once its pipe
                // fills) waits until it evicts nothing a reader has not
                // taken.
                let mut taken = p.taken.subscribe();
                while !p.push(stderr, &data, *taken.borrow()) {
                    let _ = taken.changed().await;
                }
                p.changed.send_modify(|v| *v += 1);
                // A pipe that always has data would keep this task running
                // for its whole cooperative budget (over a hundred reads)
                // while the journal's readers it woke wait on this worker:
                // they run after each piece, or a fast command evicts its
                // output before anyone could read it.
                tokio::task::yield_now().await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Starts `sleep 30` in a session of its own, asking the kernel for
    /// process id `pid` (the next after `ns_last_pid`): what any new
    /// sandbox command does, at the moment a finished tree's number is free.
    fn start_session_leader_at(pid: i32) -> std::process::Child {
        use std::os::unix::process::CommandExt;
        let mut sleep = std::process::Command::new("sleep");
        sleep.arg("30");
        // SAFETY: setsid is async-signal-safe.
        unsafe {
            sleep.pre_exec(|| match libc::setsid() {
                -1 => Err(io::Error::last_os_error()),
                _ => Ok(()),
            });
        }
        std::fs::write("/proc/sys/kernel/ns_last_pid", (pid - 1).to_string()).expect("write ns_last_pid");
        sleep.spawn().expect("spawn sleep")
    }

    #[tokio::test]
    async fn a_finished_tree_never_signals_the_process_that_takes_its_number() {
        let state = tempfile::tempdir().expect("tempdir");
        let dirs = SandboxDirs::new(state.path(), "reuse");
        dirs.create().expect("sandbox dirs");
        let (_pipes, tree) = spawn(&dirs, "sh", &["-c".into(), "exit 0".into()], None).expect("spawn");
        tree.leader.exited().await.expect("the leader exits");
        // The tree is not known to be gone yet (its output may still be
        // draining) when a new command starts and a pause or a delete of
        // the sandbox signals every tree it has.
        let mut newcomer = start_session_leader_at(tree.pgid());
        tree.signal(libc::SIGKILL);
        // SAFETY: signalling the child we started.
        unsafe { libc::kill(newcomer.id() as i32, libc::SIGTERM) };
        let status = newcomer.wait().expect("wait for the newcomer");
        assert_eq!(
            status.signal(),
            Some(libc::SIGTERM),
            "the newcomer (pid {}) was hit by the old tree",
            newcomer.id()
        );
    }

    #[test]
    fn journal_evicts_and_reports() {
        let mut j = Journal::new(10);
        j.push(false, Bytes::from_static(b"12345"));
        j.push(true, Bytes::from_static(b"67890"));
        j.push(false, Bytes::from_static(b"ab"));
        assert!(matches!(j.read(0), ReadResult::Evicted));
        match j.read(1) {
            ReadResult::Frames(f, None) => {
                assert_eq!(f.iter().map(|f| f.seq).collect::<Vec<_>>(), vec![2, 3])
            }
            other => panic!("{other:?}"),
        }
        match j.read(7) {
            ReadResult::Frames(f, None) => assert!(f.is_empty()),
            other => panic!("{other:?}"),
        }
    }
}
