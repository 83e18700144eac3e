//! The worker's side: load the library, say hello, serve hooks until the
//! host closes the control socket.
//!
//! The main thread receives call sockets on the control socket and serves
//! each on two threads of its own (see [`super::protocol`]): a reader,
//! which routes every frame the host sends, and a runner, which runs one
//! call at a time, awaiting the hook's future, and writes its reply. Output
//! chunks, standard-input requests and the recorder's moments go out as
//! they come (a creating hook then waits for the host's answer, so a
//! write-ahead moment is durable before the provider goes on). The
//! provider's log events go back on the control socket.

use super::{
    fd_pass, lock,
    process::cancelled,
    protocol::{self, from_bytes, to_bytes, LogEvent, ToHost, ToWorker, Writer, MAX_STDIN_CHUNK},
    spawn::WORKER_FD,
};
use crate::{loader::LoadedProvider, staging::load_expecting};
use futures_util::{
    future::{self, Either},
    FutureExt,
};
use provider_abi::{
    ready, unsupported, ByteSink, ByteSource, CreationRecorder, Hook, HookFuture, HookResult, Lease,
    LogLevel, LogRecord, LogSink, OutputStream, Provider, ProviderError, RecordCreation, SetupParams,
};
use serde::Serialize;
use std::{
    io::{self, BufReader},
    os::{fd::FromRawFd, unix::net::UnixStream},
    path::{Path, PathBuf},
    sync::{mpsc, Arc, Mutex},
};
use tokio::sync::oneshot;

/// Stack size of the threads serving call sockets: hooks block on the
/// provider's own runtime, so they need little; a thousand calls in flight
/// stay cheap.
const CALL_THREAD_STACK: usize = 1 << 20;

/// The first argument of a worker process: `PROGRAM __worker LIBRARY
/// [--sha256 HEX]` is how the host starts one.
pub const WORKER_ARGUMENT: &str = "__worker";

/// Serves a provider's hooks and exits when this process was started as a
/// worker (its first argument is [`WORKER_ARGUMENT`]); returns at once
/// otherwise. A binary that isolates providers calls it first in `main`,
/// before it parses its own arguments or starts threads: a worker is the
/// host's own executable, started again.
///
/// A worker started by hand (without its control socket on file descriptor
/// 3, or without a library) says in one line on stderr what it lacks and
/// exits with status 2.
pub fn run_worker_if_requested() {
    let mut args = std::env::args_os().skip(1);
    if args.next().is_none_or(|first| first != WORKER_ARGUMENT) {
        return;
    }
    if let Err(lacking) = serve_worker(args) {
        eprintln!("provider worker: {lacking}");
    }
    std::process::exit(2);
}

/// The library and the SHA-256 it must have, from the arguments after
/// [`WORKER_ARGUMENT`]; what is wrong with them, in words, otherwise.
fn worker_arguments(
    mut args: impl Iterator<Item = std::ffi::OsString>,
) -> Result<(PathBuf, Option<String>), String> {
    const USAGE: &str = "(usage: PROGRAM __worker LIBRARY [--sha256 HEX]; the host starts its workers)";
    let library = args.next().ok_or_else(|| format!("no provider library given {USAGE}"))?;
    let sha256 = match args.next() {
        None => None,
        Some(flag) if flag == "--sha256" => {
            let hex = args.next().ok_or_else(|| format!("--sha256 without a hash {USAGE}"))?;
            Some(hex.into_string().map_err(|_| format!("a --sha256 that is not text {USAGE}"))?)
        }
        Some(other) => return Err(format!("unexpected argument {} {USAGE}", other.to_string_lossy())),
    };
    if let Some(extra) = args.next() {
        return Err(format!("unexpected argument {} {USAGE}", extra.to_string_lossy()));
    }
    Ok((PathBuf::from(library), sha256))
}

/// Runs the worker: serves the provider library `args` name on the control
/// socket at file descriptor 3 (see [`super::spawn`]), loading it only if
/// its SHA-256 is the one given, and exits (status 0) when the host closed
/// the socket. Returns when the library cannot be loaded (the hello told
/// the host why), or what is wrong with the arguments or the socket.
fn serve_worker(args: impl Iterator<Item = std::ffi::OsString>) -> Result<(), String> {
    let (library, sha256) = worker_arguments(args)?;
    // SAFETY: fstat on a descriptor number only reads its status.
    let mut status = unsafe { std::mem::zeroed::<libc::stat>() };
    if unsafe { libc::fstat(WORKER_FD, &mut status) } != 0 || status.st_mode & libc::S_IFMT != libc::S_IFSOCK
    {
        return Err(format!(
            "no control socket on file descriptor {WORKER_FD}; a worker is started by its host, which isolates the provider, not by hand"
        ));
    }
    // SAFETY: descriptor 3 is a socket (checked) that the spawner handed to
    // this process alone; nothing else in the process owns it. Served
    // through a copy closed on exec (descriptor 3 itself is closed): a
    // command the provider starts and leaves running must not keep the
    // socket open after this worker died, or the host would not learn that
    // it did until the command exited.
    let control =
        unsafe { UnixStream::from_raw_fd(WORKER_FD) }.try_clone().map_err(|error| error.to_string())?;
    match Worker::start(&library, sha256.as_deref(), &control).map_err(|error| error.to_string())? {
        Some(worker) => worker.serve(control),
        None => Ok(()),
    }
}

struct Worker {
    provider: LoadedProvider,
    /// The control socket's writing side: log events.
    control: Arc<Writer>,
}

impl Worker {
    /// Loads the library, says hello and runs the handshake; `None` when
    /// the library did not load (the hello told the host why).
    fn start(
        library: &Path,
        sha256: Option<&str>,
        mut control: &UnixStream,
    ) -> io::Result<Option<Arc<Worker>>> {
        let writer = Writer::new(control.try_clone()?);
        let loaded = match sha256 {
            Some(sha256) => load_expecting(library, sha256),
            None => LoadedProvider::load(library),
        };
        let hello = loaded.as_ref().map(|provider| provider.manifest()).map_err(|error| error.to_string());
        writer.send(&hello)?;
        let Ok(provider) = loaded else { return Ok(None) };
        let Some(env) = protocol::read::<protocol::Environment>(&mut control, &mut Vec::new())? else {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "the host did not start the worker"));
        };
        for (name, value) in env {
            // Before any hook runs; Rust's own readers of the environment
            // (the provider's `std::env::var`) take the same lock.
            std::env::set_var(name, value);
        }
        Ok(Some(Arc::new(Worker { provider, control: Arc::new(writer) })))
    }

    /// Serves every call socket the host hands over until it closes the
    /// control socket (or it breaks).
    fn serve(self: Arc<Self>, control: UnixStream) -> ! {
        while let Ok(Some(socket)) = fd_pass::receive_socket(&control) {
            let worker = Arc::clone(&self);
            let started = std::thread::Builder::new()
                .name("call-reader".into())
                .stack_size(CALL_THREAD_STACK)
                .spawn(move || worker.serve_calls(socket));
            // Without a thread the socket is dropped: the host's call sees
            // its end and reports the worker's death once it is killed.
            if started.is_err() {
                break;
            }
        }
        // The host is gone or closed the connection: nothing more to do.
        // Hooks still running would answer no one.
        std::process::exit(0);
    }

    /// Serves one call socket: this thread reads every frame the host
    /// sends and routes it (a call to the runner thread, which runs one
    /// call at a time and writes its reply; the answers the running call
    /// waits for; a cancellation) until the host closes the socket.
    fn serve_calls(self: Arc<Self>, socket: UnixStream) {
        let Ok(reader) = socket.try_clone() else { return };
        let mut reader = BufReader::new(reader);
        let link =
            Arc::new(Link { writer: Writer::new(socket), pending: Mutex::new(Some(Pending::default())) });
        let (jobs, queued) = mpsc::channel::<(String, Vec<u8>, oneshot::Receiver<()>)>();
        let runner = {
            let (worker, link) = (Arc::clone(&self), Arc::clone(&link));
            std::thread::Builder::new().name("call".into()).stack_size(CALL_THREAD_STACK).spawn(move || {
                for (hook, params, cancel) in queued {
                    let result = worker.run(&hook, &params, &link, cancel);
                    // A host that went away ends the worker through the control socket.
                    if link.writer.send(&ToHost::Reply(result)).is_err() {
                        return;
                    }
                }
            })
        };
        if runner.is_err() {
            return;
        }
        let mut buffer = Vec::new();
        while let Ok(Some(message)) = protocol::read::<ToWorker<'static>>(&mut reader, &mut buffer) {
            let mut pending = lock(&link.pending);
            // Only this thread empties it, once it stops.
            let Some(pending) = pending.as_mut() else { break };
            match message {
                ToWorker::Call(hook, params) => {
                    let (cancel, cancelled) = oneshot::channel();
                    *pending = Pending { answer: None, cancel: Some(cancel) };
                    if jobs.send((hook.into_owned(), params.into_owned(), cancelled)).is_err() {
                        break;
                    }
                }
                ToWorker::Answer(answer) => {
                    if let Some(waiting) = pending.answer.take() {
                        let _ = waiting.send(answer);
                    }
                }
                ToWorker::Cancel => {
                    if let Some(cancel) = pending.cancel.take() {
                        let _ = cancel.send(());
                    }
                }
            }
        }
        // The host closed the socket (or sent what this worker cannot
        // read): the running call is cancelled, and what it waits for, or
        // asks for from now on, answers that the host is gone.
        *lock(&link.pending) = None;
    }

    /// `setup`, the provider's events going back on the control socket.
    fn setup(&self, params: &SetupParams, level: LogLevel) -> HookResult<()> {
        let control = Arc::clone(&self.control);
        let sink = LogSink::new(move |record: &LogRecord<'_>| {
            let event = LogEvent {
                level: record.level,
                target: record.target.to_string(),
                message: record.message.to_string(),
                fields: record.fields.iter().map(|f| (f.name.to_string(), f.value.to_string())).collect(),
            };
            // A host that went away ends the worker through the control socket.
            let _ = control.send(&event);
        });
        self.provider.setup(params, sink, level)
    }

    /// Runs the hook named `name` with `params` (their postcard): its
    /// output, standard input and recorded moments cross on `link`;
    /// `cancel` drops its future. Replies with the postcard of its value.
    fn run(
        &self,
        name: &str,
        params: &[u8],
        link: &Arc<Link>,
        cancel: oneshot::Receiver<()>,
    ) -> HookResult<Vec<u8>> {
        let provider = &self.provider;
        let Some(hook) = Hook::from_name(name) else {
            return Err(ProviderError::internal(format!("The provider worker knows no `{name}` hook.")));
        };
        let recorder = || CreationRecorder::new(Forward(Arc::clone(link)));
        let future = match hook {
            Hook::Setup => {
                let (params, level): (SetupParams, LogLevel) = from_bytes(params)?;
                ready(reply(self.setup(&params, level)))
            }
            Hook::Shutdown => ready(reply(provider.shutdown())),
            Hook::Health => ready(reply(provider.health())),
            Hook::ValidateConfig => ready(reply(provider.validate_config(&from_bytes(params)?))),
            Hook::RealizeWorkspace => ready(reply(provider.realize_workspace(&from_bytes(params)?))),
            Hook::ImportUnconfirmed => ready(reply(provider.import_unconfirmed(&from_bytes(params)?))),
            Hook::Probe => later(provider.probe(from_bytes(params)?, recorder())),
            Hook::AcquireLease => later(provider.acquire_lease(from_bytes(params)?, recorder())),
            Hook::ResumeLease => later(provider.resume_lease(from_bytes(params)?)),
            Hook::ReleaseLease => later(provider.release_lease(from_bytes(params)?)),
            Hook::DestroyLease => later(provider.destroy_lease(from_bytes(params)?)),
            Hook::InspectLease => later(provider.inspect_lease(from_bytes(params)?)),
            Hook::SyncFiles => later(provider.sync_files(from_bytes(params)?)),
            Hook::Execute => {
                let output = Arc::clone(link);
                let sink = ByteSink::new(move |stream: OutputStream, bytes: &[u8]| {
                    // A host that went away ends the worker through the control socket.
                    let _ = output.writer.send(&ToHost::Bytes { stream, bytes: bytes.to_vec() });
                });
                let source = stdin_source(Arc::clone(link));
                later(provider.execute(from_bytes(params)?, source, sink))
            }
            // `manifest` and the hooks that stay in the host never cross.
            other => return Err(unsupported(other)),
        };
        until_cancelled(hook, future, cancel)
    }
}

/// The postcard of what a hook returned.
fn reply<T: Serialize>(result: HookResult<T>) -> HookResult<Vec<u8>> {
    to_bytes(&result?)
}

/// The postcard of what a hook's future returns.
fn later<T: Serialize + Send + 'static>(future: HookFuture<T>) -> HookFuture<Vec<u8>> {
    Box::pin(async move { reply(future.await) })
}

/// Awaits `future` on this thread, or drops it (cancelling the hook) when
/// the host cancels the call or closes its socket.
fn until_cancelled<T>(hook: Hook, future: HookFuture<T>, cancel: oneshot::Receiver<()>) -> HookResult<T> {
    match pollster::block_on(future::select(future, cancel)) {
        Either::Left((result, _)) => result,
        // The hook's future, handed back unfinished, is dropped here.
        Either::Right(_) => Err(cancelled(hook)),
    }
}

/// One call socket, as the worker's threads share it: its writing side,
/// and where the host's frames about the running call go.
struct Link {
    writer: Writer,
    /// `None` once the socket's reader stopped: no answer will come.
    pending: Mutex<Option<Pending>>,
}

/// What the host's frames about the running call go to: its answer to the
/// call's request (a recorded moment, a chunk of standard input; one is
/// outstanding at a time: the provider awaits each), and the cancellation
/// (taken by the first).
#[derive(Default)]
struct Pending {
    answer: Option<oneshot::Sender<HookResult<Vec<u8>>>>,
    cancel: Option<oneshot::Sender<()>>,
}

impl Link {
    /// Sends `request` about the running call; the host's answer, or
    /// [`lost`] once the socket's reader stopped.
    fn ask(&self, request: &ToHost) -> HookFuture<Vec<u8>> {
        let (answer, answered) = oneshot::channel();
        match lock(&self.pending).as_mut() {
            Some(pending) => pending.answer = Some(answer),
            None => return ready(Err(lost())),
        }
        if self.writer.send(request).is_err() {
            return ready(Err(lost()));
        }
        Box::pin(async move { answered.await.unwrap_or_else(|_| Err(lost())) })
    }
}

/// The worker's recorder: each moment crosses to the host, and the hook
/// goes on once the host answered.
struct Forward(Arc<Link>);

impl RecordCreation for Forward {
    fn sending(&mut self) -> HookFuture<()> {
        Box::pin(self.0.ask(&ToHost::Sending).map(|answer| answer.map(drop)))
    }

    fn created(&mut self, lease: &Lease) -> HookFuture<()> {
        Box::pin(self.0.ask(&ToHost::Created(lease.clone())).map(|answer| answer.map(drop)))
    }
}

fn lost() -> ProviderError {
    ProviderError::internal("The host closed the worker's connection during the call.")
}

/// `execute`'s standard input, pulled from the host a chunk at a time
/// (at most what the provider's buffer holds, which the host never
/// exceeds): bounded memory on both sides, nothing held between reads.
fn stdin_source(link: Arc<Link>) -> ByteSource {
    let mut ended = false;
    ByteSource::new(move |buffer: &mut [u8]| {
        if ended || buffer.is_empty() {
            return Ok(0);
        }
        let wanted = u32::try_from(buffer.len()).unwrap_or(u32::MAX).min(MAX_STDIN_CHUNK);
        let chunk = pollster::block_on(link.ask(&ToHost::StdinWanted(wanted)))?;
        let count = chunk.len().min(buffer.len());
        buffer[..count].copy_from_slice(&chunk[..count]);
        ended = chunk.is_empty();
        Ok(count)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use provider_abi::ExecuteParams;
    use std::{borrow::Cow, time::Duration};

    /// The fixture provider's library, which cargo builds beside this test
    /// binary (a dev-dependency).
    fn fixture_library() -> PathBuf {
        let file = crate::loader::library_file_name("fixture_provider");
        let deps = std::env::current_exe().unwrap().parent().unwrap().to_path_buf();
        [deps.join(&file), deps.join("..").join(&file)]
            .into_iter()
            .find(|path| path.exists())
            .unwrap_or_else(|| panic!("{file} was not built beside {}", deps.display()))
    }

    /// A call socket's reader that stops while the call runs (here on a
    /// frame it cannot decode) leaves no request unanswered: the fixture's
    /// `execute` first streams its (large) argument, which the host reads
    /// only after the reader stopped, and then pulls its standard input,
    /// which must fail at once as a lost host, not wait for ever.
    #[test]
    fn a_request_after_the_call_socket_reader_stopped_fails_as_a_lost_host() {
        let (control, mut host_control) = UnixStream::pair().unwrap();
        protocol::write(&mut host_control, &protocol::Environment::new()).unwrap();
        let worker = Worker::start(&fixture_library(), None, &control).unwrap().expect("the fixture loads");
        let (socket, mut host) = UnixStream::pair().unwrap();
        std::thread::spawn(move || worker.serve_calls(socket));

        // Larger than the socket's buffer: the runner's output blocks until
        // the host reads it, well after the reader met the garbage frame.
        let argument = "x".repeat(4 << 20);
        let params = ExecuteParams {
            command: "echo".into(),
            args: vec![argument.as_str().into()].into(),
            ..Default::default()
        };
        let params = to_bytes(&params).unwrap();
        let mut frames = Vec::new();
        protocol::write(&mut frames, &ToWorker::Call("execute".into(), Cow::Borrowed(&params))).unwrap();
        frames.extend_from_slice(&[1, 0, 0, 0, 9]); // a `ToWorker` of no known variant
        std::io::Write::write_all(&mut host, &frames).unwrap();

        host.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut buffer = Vec::new();
        let reply = loop {
            match protocol::read::<ToHost>(&mut host, &mut buffer) {
                Ok(Some(ToHost::Reply(reply))) => break reply,
                Ok(Some(ToHost::Bytes { .. } | ToHost::StdinWanted(_))) => {}
                other => panic!("no reply within 20 s (the call hangs): {other:?}"),
            }
        };
        assert_eq!(reply.map(drop), Err(lost()));
    }
}
