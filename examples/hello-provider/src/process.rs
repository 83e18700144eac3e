//! Running one command: output streamed as it arrives, a deadline, and
//! termination of the command's whole process group.
//!
//! The provider owns its threads: a reader per output pipe and a waiter for
//! the exit status, feeding one channel that the command's own thread (the
//! one [`provider_abi::blocking`] started for the hook) drains, and a writer
//! that pulls standard input from the host's [`ByteSource`]. So the host's
//! output sink is only ever called from one thread, the hook never blocks on
//! a pipe or a child without a deadline, and a source read that blocks (a
//! terminal) blocks only the writer. (A provider built on async I/O does the
//! same with a runtime it creates once and owns; it never uses the host's
//! runtime, and no runtime type crosses the boundary.)

use nix::{
    errno::Errno,
    sys::signal::{killpg, Signal},
    unistd::Pid,
};
use provider_abi::{ByteSink, ByteSource, ExecuteResult, OutputStream};
use std::{
    io::{Read, Write},
    os::unix::process::{CommandExt, ExitStatusExt},
    process::{Command, ExitStatus, Stdio},
    sync::{
        atomic::{AtomicBool, Ordering},
        mpsc::{Receiver, RecvTimeoutError, Sender},
        Arc,
    },
    time::{Duration, Instant},
};

/// How long a terminated command gets between SIGTERM and SIGKILL.
pub const GRACE: Duration = Duration::from_millis(1000);
/// How long to wait for a SIGKILLed group to disappear before cleanup is
/// called unconfirmed. Cleanup runs on a fresh bound like this one: the
/// command's own deadline has passed by then.
pub const KILL_BOUND: Duration = Duration::from_secs(5);
/// The most output kept per stream in the result (its tail); everything is
/// streamed regardless.
pub const MAX_KEPT: usize = 1 << 20;

/// What the command's threads (and a release) tell the hook's thread.
#[derive(Debug)]
pub enum Event {
    /// Bytes from a pipe.
    Chunk(OutputStream, Vec<u8>),
    /// A pipe reached its end.
    Closed(OutputStream),
    /// The command's process exited.
    Exited(ExitStatus),
    /// Waiting for the process failed (it cannot be confirmed gone).
    WaitFailed,
    /// A release, destroy or shutdown cancels the command.
    Cancel,
}

/// The outcome of [`run`]: how the command ended, and whether its process
/// group was confirmed gone afterwards.
#[derive(Debug)]
pub struct Outcome {
    /// The command's result (it ran to its end or its deadline; the result
    /// says which); `None` when a release or destroy cancelled it.
    pub result: Option<ExecuteResult>,
    /// False when termination could not be confirmed: the lease must then
    /// be marked unconfirmed and never reused.
    pub cleanup_confirmed: bool,
}

/// Why [`run`] stopped waiting for the command to end by itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// Its deadline passed.
    TimedOut,
    /// A release, destroy or shutdown cancelled it.
    Cancelled,
}

/// Runs `command` (its program, arguments, working directory and
/// environment already checked and set) in its own process group, with
/// `timeout` as its deadline, its standard input pulled from `stdin` and its
/// output written to `sink` as raw bytes as it arrives (the host decodes
/// it). `events` must be the receiver of the sender the lease registered for
/// this command (so a release, or the host dropping the hook's future, can
/// cancel it); `sender` is a clone of it.
pub fn run(
    command: &mut Command,
    timeout: Duration,
    stdin: ByteSource,
    sender: Sender<Event>,
    events: &Receiver<Event>,
    sink: &mut ByteSink,
) -> std::io::Result<Outcome> {
    let mut deadline = Instant::now() + timeout;
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own process group, so that a timeout or release can terminate
        // everything the command started, not just the first process.
        .process_group(0)
        .spawn()?;
    // The group the command leads (made with `process_group(0)`).
    let pgid = Pid::from_raw(child.id() as i32);
    // Set once the command is over: the writer then starts no new read.
    let ended = Arc::new(AtomicBool::new(false));
    if let Some(pipe) = child.stdin.take() {
        let ended = Arc::clone(&ended);
        std::thread::spawn(move || feed_stdin(stdin, pipe, &ended));
    }
    let (stdout, stderr, out_sender, err_sender) =
        (child.stdout.take(), child.stderr.take(), sender.clone(), sender.clone());
    std::thread::spawn(move || read_pipe(OutputStream::Stdout, stdout, &out_sender));
    std::thread::spawn(move || read_pipe(OutputStream::Stderr, stderr, &err_sender));
    std::thread::spawn(move || {
        let event = child.wait().map_or(Event::WaitFailed, Event::Exited);
        let _ = sender.send(event);
    });

    let mut output = Collected::default();
    let (mut open_pipes, mut status, mut stopped) = (2, None, None);
    // Past the deadline or once cancelled, the group is terminated: SIGTERM,
    // a grace period, SIGKILL, a bound; given up on (unconfirmed) after that.
    let mut terminate = [(Signal::SIGTERM, GRACE), (Signal::SIGKILL, KILL_BOUND)].into_iter();
    let cleanup_confirmed = loop {
        if status.is_some() && (open_pipes == 0 || stopped.is_some()) {
            break wait_group_gone(pgid, Instant::now() + KILL_BOUND);
        }
        let event = match deadline.checked_duration_since(Instant::now()) {
            Some(left) => events.recv_timeout(left),
            None => Err(RecvTimeoutError::Timeout),
        };
        match event {
            Ok(Event::Chunk(stream, bytes)) => output.push(stream, &bytes, sink),
            Ok(Event::Closed(_)) => open_pipes -= 1,
            Ok(Event::Exited(exit)) => {
                status = Some(exit);
                // The command is over; anything it left running in its group
                // must not outlive it (nor hold its pipes open).
                let _ = killpg(pgid, Signal::SIGKILL);
            }
            // Its process cannot be confirmed gone.
            Ok(Event::WaitFailed) => break false,
            Ok(Event::Cancel) if stopped.is_none() => {
                (stopped, deadline) = (Some(Stop::Cancelled), Instant::now())
            }
            Ok(Event::Cancel) => {}
            // It exited, but a process that escaped the group holds the
            // pipes open past the deadline: it did not run out of time.
            Err(_) if status.is_some() => break wait_group_gone(pgid, Instant::now() + KILL_BOUND),
            Err(_) => {
                stopped.get_or_insert(Stop::TimedOut);
                ended.store(true, Ordering::Relaxed);
                let Some((signal, bound)) = terminate.next() else { break false };
                let _ = killpg(pgid, signal);
                deadline = Instant::now() + bound;
            }
        }
    };
    ended.store(true, Ordering::Relaxed);
    if stopped == Some(Stop::Cancelled) {
        return Ok(Outcome { result: None, cleanup_confirmed });
    }
    let timed_out = stopped == Some(Stop::TimedOut);
    let (stdout, stderr, truncated) = output.finish();
    let result = ExecuteResult {
        // A timeout reports no exit code even if the command died of the
        // termination signal: the host must see `timed_out`.
        exit_code: status.filter(|_| !timed_out).and_then(|status| status.code()).into(),
        signal: status.and_then(|status| status.signal()).map(|signal| signal_name(signal).into()).into(),
        timed_out,
        stdout: stdout.into(),
        stderr: stderr.into(),
        metadata_json: serde_json::json!({"outputTruncated": truncated}).to_string().into(),
    };
    Ok(Outcome { result: Some(result), cleanup_confirmed })
}

/// Copies the host's standard input into the command's pipe until either
/// ends, on a thread of its own: a read may block (a terminal). The source is
/// dropped here, once its last read has returned; no read starts after the
/// command is over. Closing the pipe is the command's end of input.
fn feed_stdin(mut stdin: ByteSource, mut pipe: std::process::ChildStdin, ended: &AtomicBool) {
    let mut buffer = vec![0; 64 * 1024];
    while !ended.load(Ordering::Relaxed) {
        match stdin.read(&mut buffer) {
            // A command that exits without reading its input closes the
            // pipe: the write fails, which ends the copy.
            Ok(read @ 1..) if pipe.write_all(&buffer[..read]).is_ok() => {}
            // The end of the input, a write that failed, or a host error
            // (which the command sees as the end of its input).
            _ => break,
        }
    }
}

fn read_pipe(stream: OutputStream, pipe: Option<impl Read>, sender: &Sender<Event>) {
    if let Some(mut pipe) = pipe {
        let mut buffer = vec![0; 64 * 1024];
        loop {
            match pipe.read(&mut buffer) {
                Ok(read @ 1..) if sender.send(Event::Chunk(stream, buffer[..read].to_vec())).is_ok() => {}
                Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
                // The end, an error other than interruption (which ends the
                // stream like EOF does), or a hook no longer listening.
                _ => break,
            }
        }
    }
    let _ = sender.send(Event::Closed(stream));
}

/// Waits until no process is left in the group, at most until `deadline`.
/// Orphaned members are reaped by init (or a subreaper), so this polls.
fn wait_group_gone(pgid: Pid, deadline: Instant) -> bool {
    loop {
        // No signal only checks whether the group still exists.
        if killpg(pgid, None) == Err(Errno::ESRCH) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The conventional name of a signal (`SIGKILL`), or `SIG` and its number.
pub fn signal_name(signal: i32) -> String {
    Signal::try_from(signal).map_or_else(|_| format!("SIG{signal}"), |signal| signal.as_str().to_owned())
}

/// Each stream's output: written to the sink as it arrives, its tail kept
/// for the result.
#[derive(Default)]
struct Collected {
    streams: [Tail; 2],
}

#[derive(Default)]
struct Tail {
    kept: Vec<u8>,
    truncated: bool,
}

impl Collected {
    fn push(&mut self, stream: OutputStream, bytes: &[u8], sink: &mut ByteSink) {
        if bytes.is_empty() {
            return;
        }
        // Raw bytes, exactly as the command wrote them: a chunk may end
        // inside a UTF-8 character, and decoding is the host's business.
        sink.write(stream, bytes);
        let tail = &mut self.streams[stream as usize];
        tail.kept.extend_from_slice(bytes);
        if tail.kept.len() > MAX_KEPT {
            let cut = tail.kept.len() - MAX_KEPT;
            tail.kept.drain(..cut);
            tail.truncated = true;
        }
    }

    /// Stdout's and stderr's tails as text (a character cut at the start of
    /// a truncated tail is dropped, invalid bytes become U+FFFD) and whether
    /// either was truncated.
    fn finish(self) -> (String, String, bool) {
        let [out, err] = self.streams.map(|tail| {
            let start =
                if tail.truncated { tail.kept.iter().take_while(|&&b| b & 0xC0 == 0x80).count() } else { 0 };
            (String::from_utf8_lossy(&tail.kept[start..]).into_owned(), tail.truncated)
        });
        (out.0, err.0, out.1 || err.1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_truncated_tail_starts_at_a_whole_character() {
        let mut collected = Collected::default();
        let mut sink = ByteSink::discard();
        // The cut falls inside a character: its second byte is dropped too.
        collected.push(OutputStream::Stdout, "é".repeat(MAX_KEPT / 2 + 1).as_bytes(), &mut sink);
        collected.push(OutputStream::Stdout, b"a", &mut sink);
        collected.push(OutputStream::Stderr, b"a\xffb", &mut sink);
        let (stdout, stderr, truncated) = collected.finish();
        assert!(truncated);
        assert_eq!(stdout, format!("{}a", "é".repeat(MAX_KEPT / 2 - 1)));
        assert_eq!(stderr, "a\u{FFFD}b");
    }
}
