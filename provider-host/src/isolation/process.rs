//! One worker process as the host holds it: started and handshaken, its
//! call sockets (each serving one call at a time, pooled), its control
//! socket's reader (the provider's log events; the worker's end), and how
//! it ended.
//!
//! A calling thread takes an idle call socket (or makes one and passes the
//! worker its other end), writes its call and reads everything about it
//! itself: output chunks, standard-input requests (served by a pump thread
//! of the call's own, so a blocking input never holds up its output), the
//! recorder's moments, the reply. A call's [`CallControl`] lets another
//! thread cancel it. When the worker dies every call socket ends; a caller
//! that sees its end waits for the control reader to reap the worker and
//! name how it ended.

use super::{
    client::{worker_error, WORKER_FAILURE_PREFIX},
    fd_pass, lock,
    protocol::{self, Environment, Hello, LogEvent, ToHost, ToWorker, Writer, MAX_STDIN_CHUNK},
    read, spawn, IsolationError, IsolationOptions, WORKER_ARGUMENT,
};
use nix::sys::signal::Signal;
use provider_abi::{
    ByteSink, ByteSource, CreationRecorder, ErrorKind, Hook, HookResult, LogField, LogLevel, LogRecord,
    LogSink, Manifest, ProviderError, SetupParams,
};
use serde_json::Value;
use std::{
    collections::BTreeSet,
    io::{self, BufReader},
    os::unix::{net::UnixStream, process::ExitStatusExt},
    path::Path,
    process::{Child, Command, ExitStatus},
    sync::{
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
        mpsc, Arc, Condvar, Mutex, PoisonError, RwLock,
    },
    time::{Duration, Instant},
};

/// What every worker of one isolated provider shares with its host side.
#[derive(Default)]
pub(super) struct Shared {
    /// Workers that died or were killed without being asked to stop.
    pub crashes: AtomicU64,
    /// The host's `setup` parameters and log level, once it called `setup`
    /// (replayed into every worker it starts), and where the provider's log
    /// events go.
    pub setup: RwLock<Option<(SetupParams, LogLevel, LogSink)>>,
}

/// What a call hands the worker besides its parameters, and what it
/// answers with: `execute`'s output sink and input source, a creating
/// hook's recorder; the least deadline it gets; what cancels it.
#[derive(Default)]
pub(super) struct CallIo {
    /// Lets another thread cancel the call.
    pub control: Arc<CallControl>,
    /// The call's deadline is at least this (`execute`'s own timeout).
    pub deadline: Duration,
    /// Where `execute`'s output goes.
    pub output: Option<ByteSink>,
    /// Where `execute`'s standard input comes from (none: empty).
    pub stdin: Option<ByteSource>,
    /// Who hears a creating hook's moments (none: accepted unrecorded).
    pub recorder: Option<CreationRecorder>,
}

/// A call's way to its worker while it runs, for the threads besides the
/// caller's: the call's future, dropped, cancels it; its standard-input
/// pump answers on it. Nothing is sent before the call nor after its
/// reply, so a late answer or cancellation never reaches the next call on
/// the same socket.
#[derive(Default)]
pub(super) struct CallControl {
    state: Mutex<ControlState>,
}

#[derive(Default)]
struct ControlState {
    cancelled: bool,
    /// The socket the call went out on, while it runs.
    writer: Option<Arc<Writer>>,
}

impl CallControl {
    /// Sends `call` on `writer` unless the call was cancelled first
    /// (`Ok(false)`): a cancellation is sent after its call, never before.
    fn open(&self, writer: &Arc<Writer>, call: &ToWorker<'_>) -> io::Result<bool> {
        let mut state = lock(&self.state);
        if state.cancelled {
            return Ok(false);
        }
        writer.send(call)?;
        state.writer = Some(Arc::clone(writer));
        Ok(true)
    }

    /// Sends `message` about the call while it runs; nothing once it ended.
    fn send(&self, message: &ToWorker<'_>) -> io::Result<()> {
        lock(&self.state).writer.as_ref().map_or(Ok(()), |writer| writer.send(message))
    }

    /// Cancels the call: not sent when it was not yet; the worker drops the
    /// hook's future when it runs; nothing once it ended.
    pub fn cancel(&self) {
        lock(&self.state).cancelled = true;
        let _ = self.send(&ToWorker::Cancel);
    }

    fn finished(&self) {
        lock(&self.state).writer = None;
    }
}

/// Why a call has no reply: the error it gets (one line naming the worker,
/// how it failed and the hook).
pub(super) struct Failure {
    /// The worker was dead before the call was sent: another worker may take it.
    pub retry: bool,
    /// The call's error.
    pub error: ProviderError,
}

#[derive(Default)]
struct State {
    /// The hooks of the calls in flight.
    in_flight: Vec<Hook>,
    /// How the worker ended, once the control reader reaped it.
    died: Option<String>,
    /// Why the host killed it, when it did.
    killed_because: Option<String>,
}

/// One worker process.
pub(super) struct WorkerProcess {
    /// Its process id.
    pub pid: u32,
    /// The manifest its hello carried.
    pub manifest: Manifest,
    control: UnixStream,
    idle: Mutex<Vec<CallSocket>>,
    child: Mutex<Child>,
    state: Mutex<State>,
    ended: Condvar,
    dead: AtomicBool,
    closing: AtomicBool,
    /// Creating calls in flight on it (a creation worker serves one at a
    /// time, unless the bound on creation workers is reached).
    pub creations: AtomicUsize,
}

impl WorkerProcess {
    /// Starts a worker, runs the handshake and starts its control reader.
    pub fn open(
        library: &Path,
        options: &IsolationOptions,
        shared: &Arc<Shared>,
    ) -> Result<Arc<WorkerProcess>, IsolationError> {
        let program = options.program.clone().map_or_else(std::env::current_exe, Ok).map_err(|error| {
            IsolationError(format!("cannot find this program to start a provider worker: {error}"))
        })?;
        let failed = |error: io::Error| {
            IsolationError(format!("cannot start the provider worker {}: {error}", program.display()))
        };
        let (host_end, worker_end) = UnixStream::pair().map_err(failed)?;
        let mut command = Command::new(&program);
        command.arg(WORKER_ARGUMENT).arg(library);
        if let Some(sha256) = &options.library_sha256 {
            command.args(["--sha256", sha256]);
        }
        let mut child = spawn::spawn(command, &options.limits, worker_end).map_err(failed)?;
        let pid = child.id();
        let manifest = match handshake(&host_end, options.deadline) {
            Ok(Ok(manifest)) => manifest,
            Ok(Err(refused)) => {
                let _ = child.wait();
                return Err(IsolationError(refused));
            }
            Err(error) => {
                let _ = child.kill();
                let how = child.wait().map(describe).unwrap_or_else(|_| "ended".into());
                let library = library.display();
                return Err(IsolationError(format!(
                    "the provider worker (pid {pid}) {how} while loading {library}: {error}"
                )));
            }
        };
        host_end.set_read_timeout(None).map_err(failed)?;
        let reader = BufReader::new(host_end.try_clone().map_err(failed)?);
        let worker = Arc::new(WorkerProcess {
            pid,
            manifest,
            control: host_end,
            idle: Mutex::new(Vec::new()),
            child: Mutex::new(child),
            state: Mutex::new(State::default()),
            ended: Condvar::new(),
            dead: AtomicBool::new(false),
            closing: AtomicBool::new(false),
            creations: AtomicUsize::new(0),
        });
        let (watched, shared) = (Arc::clone(&worker), Arc::clone(shared));
        std::thread::Builder::new()
            .name(format!("provider-worker-{pid}"))
            .spawn(move || watched.read_control(reader, &shared))
            .map_err(failed)?;
        Ok(worker)
    }

    /// True once the worker died or was killed.
    pub fn is_dead(&self) -> bool {
        self.dead.load(Ordering::SeqCst)
    }

    /// Runs `hook` with `params` (their postcard) on this worker within
    /// `deadline`, delivering output, standard input and the recorder's
    /// moments through `io` as they come; `io.control` may cancel
    /// it. The reply is the postcard of the hook's value.
    pub fn call(
        &self,
        hook: Hook,
        params: &[u8],
        io: &mut CallIo,
        deadline: Duration,
    ) -> Result<HookResult<Vec<u8>>, Failure> {
        // The deadline runs from the call, not from when a socket is ready.
        let until = Instant::now() + deadline;
        {
            let mut state = lock(&self.state);
            if let Some(how) = &state.died {
                return Err(self.failure(true, format!("{how} during the `{hook}` hook")));
            }
            state.in_flight.push(hook);
        }
        let _in_flight = scopeguard::guard((), |()| {
            let mut state = lock(&self.state);
            if let Some(at) = state.in_flight.iter().position(|running| *running == hook) {
                state.in_flight.swap_remove(at);
            }
        });
        let mut socket = match lock(&self.idle).pop() {
            Some(socket) => socket,
            None => {
                let (mine, theirs) = UnixStream::pair()
                    .and_then(|(mine, theirs)| Ok((CallSocket::new(mine)?, theirs)))
                    .map_err(|error| Failure {
                        retry: false,
                        error: worker_error(format!("cannot open a socket to the provider worker: {error}")),
                    })?;
                // A failure means the worker is gone (or going; killed, so its end comes).
                fd_pass::send_socket(&self.control, &theirs).map_err(|_| self.end(hook, None, true))?;
                mine
            }
        };
        let call = ToWorker::Call(hook.name().into(), params.into());
        match io.control.open(&socket.writer, &call) {
            Ok(true) => {}
            Ok(false) => {
                lock(&self.idle).push(socket);
                return Ok(Err(cancelled(hook)));
            }
            Err(_) => return Err(self.end(hook, None, true)),
        }
        let outcome = self.follow(hook, io, &mut socket, until, deadline);
        io.control.finished();
        if outcome.is_ok() {
            lock(&self.idle).push(socket);
        }
        outcome
    }

    /// Reads what the worker sends about the call it is running until its
    /// reply, answering what it asks for.
    fn follow(
        &self,
        hook: Hook,
        io: &mut CallIo,
        socket: &mut CallSocket,
        until: Instant,
        deadline: Duration,
    ) -> Result<HookResult<Vec<u8>>, Failure> {
        let mut pump = None;
        let mut first = true;
        loop {
            // The first read waits the whole deadline (usually the timeout
            // the socket has already: no system call), later ones what is
            // left of it once the last message was handled: answering one
            // (a ledger commit, a slow output reader) spends the deadline too.
            let timeout = if std::mem::take(&mut first) {
                deadline
            } else {
                until.saturating_duration_since(Instant::now()).max(Duration::from_millis(1))
            };
            let received = socket.receive(timeout);
            match received {
                Ok(Some(ToHost::Bytes { stream, bytes })) => {
                    if let Some(sink) = io.output.as_mut() {
                        sink.write(stream, &bytes);
                    }
                }
                Ok(Some(ToHost::StdinWanted(wanted))) => {
                    if let (None, Some(source)) = (&pump, io.stdin.take()) {
                        pump = Some(stdin_pump(source, &io.control));
                    }
                    let answer = match &pump {
                        Some(Ok(requests)) => {
                            let _ = requests.send(wanted.min(MAX_STDIN_CHUNK));
                            continue;
                        }
                        Some(Err(error)) => Err(error.clone()),
                        // No source: the input is empty.
                        None => Ok(Vec::new()),
                    };
                    let _ = io.control.send(&ToWorker::Answer(answer));
                }
                Ok(Some(moment @ (ToHost::Sending | ToHost::Created(_)))) => {
                    let answer = match (io.recorder.as_mut(), moment) {
                        (None, _) => Ok(()),
                        (Some(recorder), ToHost::Created(lease)) => {
                            pollster::block_on(recorder.record(&lease))
                        }
                        (Some(recorder), _) => pollster::block_on(recorder.sending()),
                    };
                    // A failed send means the worker died: its end comes next.
                    let _ = io.control.send(&ToWorker::Answer(answer.map(|()| Vec::new())));
                }
                Ok(Some(ToHost::Reply(result))) => return Ok(result),
                Err(error) if matches!(error.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                    let how =
                        format!("was killed when the `{hook}` hook passed its deadline of {deadline:?}");
                    self.kill(Some(&how));
                    let why = format!("was killed: the `{hook}` hook passed its deadline of {deadline:?}");
                    return Err(self.failure(false, why));
                }
                // The end of the socket, or a frame that is no message: the
                // worker ended (or closed it, which it never does while
                // alive: it is killed).
                other => {
                    let broke = matches!(other, Err(error) if error.kind() == io::ErrorKind::InvalidData);
                    return Err(self.end(hook, broke.then_some("broke the protocol"), false));
                }
            }
        }
    }

    /// Kills the worker (`because`: why, if it misbehaved) and waits until
    /// it was reaped: the failure of the `hook` call (`retry`: not sent).
    fn end(&self, hook: Hook, because: Option<&str>, retry: bool) -> Failure {
        self.kill(because);
        self.failure(retry, format!("{} during the `{hook}` hook", self.death()))
    }

    /// The failure of a call whose worker `what` (died how, and when).
    fn failure(&self, retry: bool, what: String) -> Failure {
        let message =
            format!("{WORKER_FAILURE_PREFIX}{}) {what}; the next call starts a new worker.", self.pid);
        Failure { retry, error: worker_error(message) }
    }

    /// Waits until the control reader reaped the worker; how it ended.
    fn death(&self) -> String {
        let state = self.ended.wait_while(lock(&self.state), |state| state.died.is_none());
        state.unwrap_or_else(PoisonError::into_inner).died.clone().unwrap_or_default()
    }

    /// Kills the worker (`because`: why, for the calls still in flight);
    /// calls from now on go to a new one.
    pub fn kill(&self, because: Option<&str>) {
        self.dead.store(true, Ordering::SeqCst);
        if let Some(because) = because {
            lock(&self.state).killed_because.get_or_insert_with(|| because.to_owned());
        }
        let _ = lock(&self.child).kill();
    }

    /// Asks the worker to exit (it reads the end of its control socket).
    pub fn close(&self) {
        self.closing.store(true, Ordering::SeqCst);
        let _ = self.control.shutdown(std::net::Shutdown::Both);
    }

    /// The control reader: the provider's log events until the worker
    /// ends; then reaps it, records how it ended and, unless it was asked
    /// to stop with nothing in flight, reports the crash.
    fn read_control(self: Arc<Self>, mut reader: BufReader<UnixStream>, shared: &Shared) {
        let mut buffer = Vec::new();
        let ended = loop {
            match protocol::read::<LogEvent>(&mut reader, &mut buffer) {
                Ok(Some(event)) => {
                    if let Some((.., sink)) = &*read(&shared.setup) {
                        let fields: Vec<LogField<'_>> = event
                            .fields
                            .iter()
                            .map(|(name, value)| LogField {
                                name: name.as_str().into(),
                                value: value.as_str().into(),
                            })
                            .collect();
                        sink.log(&LogRecord::new(event.level, &event.target, &event.message, &fields));
                    }
                }
                Err(error) if error.kind() == io::ErrorKind::InvalidData => break Some("broke the protocol"),
                Ok(None) | Err(_) => break None,
            }
        };
        if ended.is_some() {
            self.kill(ended);
        }
        let status = self.reap();
        self.dead.store(true, Ordering::SeqCst);
        let mut state = lock(&self.state);
        let how = state
            .killed_because
            .clone()
            .unwrap_or_else(|| status.map(describe).unwrap_or_else(|| "ended".into()));
        state.died = Some(how.clone());
        let in_flight = std::mem::take(&mut state.in_flight);
        drop(state);
        self.ended.notify_all();
        lock(&self.idle).clear();
        if self.closing.load(Ordering::SeqCst) && in_flight.is_empty() {
            return;
        }
        shared.crashes.fetch_add(1, Ordering::SeqCst);
        let hooks: Vec<_> = in_flight.iter().map(|hook| format!("`{hook}`")).collect();
        let during = if hooks.is_empty() {
            "between calls".to_owned()
        } else {
            format!("during {}", hooks.join(", "))
        };
        tracing::warn!(
            "the provider worker (pid {}) {how} {during}; the next call starts a new worker",
            self.pid
        );
    }

    /// Waits for the worker to end (a second at most after its control
    /// socket closed, then it is killed).
    fn reap(&self) -> Option<ExitStatus> {
        for _ in 0..100 {
            match lock(&self.child).try_wait() {
                Ok(Some(status)) => return Some(status),
                Ok(None) => std::thread::sleep(Duration::from_millis(10)),
                Err(_) => return None,
            }
        }
        let mut child = lock(&self.child);
        let _ = child.kill();
        child.wait().ok()
    }
}

/// One call socket on the host's side, with the buffers its frames reuse.
struct CallSocket {
    reader: BufReader<UnixStream>,
    writer: Arc<Writer>,
    buffer: Vec<u8>,
    /// The read timeout set on the socket now.
    timeout: Option<Duration>,
}

impl CallSocket {
    fn new(socket: UnixStream) -> io::Result<CallSocket> {
        let reader = BufReader::new(socket.try_clone()?);
        Ok(CallSocket { reader, writer: Arc::new(Writer::new(socket)), buffer: Vec::new(), timeout: None })
    }

    /// The next frame, waiting `timeout` at most (a system call only when
    /// it is not the one set already: a call's first read waits its whole
    /// deadline, usually the last call's).
    fn receive(&mut self, timeout: Duration) -> io::Result<Option<ToHost>> {
        if self.timeout != Some(timeout) {
            self.reader.get_ref().set_read_timeout(Some(timeout))?;
            self.timeout = Some(timeout);
        }
        protocol::read(&mut self.reader, &mut self.buffer)
    }
}

/// Reads `execute`'s standard input on a thread of the call's own, a chunk
/// per request of the worker, so that a source that blocks (a terminal, a
/// pipe) never holds up the output. Returns where to ask it for at most so
/// many more bytes (the pump answers the worker). It ends when the call
/// does (after the read it is blocked in, if any).
fn stdin_pump(mut source: ByteSource, control: &Arc<CallControl>) -> HookResult<mpsc::Sender<u32>> {
    let (requests, wanted) = mpsc::channel::<u32>();
    let control = Arc::clone(control);
    let pump = move || {
        for count in wanted {
            let mut chunk = vec![0; count as usize];
            let answer = source.read(&mut chunk).map(|read| {
                chunk.truncate(read);
                chunk
            });
            if control.send(&ToWorker::Answer(answer)).is_err() {
                return;
            }
        }
    };
    std::thread::Builder::new().name("provider-stdin".into()).spawn(pump).map_err(|error| {
        ProviderError::internal(format!("cannot start a thread for the command's standard input: {error}"))
    })?;
    Ok(requests)
}

/// The error of a call cancelled before it was sent.
pub(super) fn cancelled(hook: Hook) -> ProviderError {
    ProviderError::new(ErrorKind::CANCELLED, format!("The host cancelled the `{hook}` call."))
}

/// Reads the worker's hello and sends it the environment; `Ok(Err(line))`
/// when the library did not load.
fn handshake(mut socket: &UnixStream, deadline: Duration) -> io::Result<Hello> {
    socket.set_read_timeout(Some(deadline))?;
    let ended = || io::Error::new(io::ErrorKind::UnexpectedEof, "it closed its connection");
    let hello = protocol::read::<Hello>(&mut socket, &mut Vec::new())?.ok_or_else(ended)?;
    if let Ok(manifest) = &hello {
        protocol::write(&mut socket, &environment_for(manifest))?;
    }
    Ok(hello)
}

/// The variables the provider's configuration schema names: every
/// top-level property's `x-env` (a name or a list of names), with the
/// host's value, when set. The host knows no key of the configuration.
pub fn environment_for(manifest: &Manifest) -> Environment {
    let schema: Value = serde_json::from_str(&manifest.config_schema_json).unwrap_or_default();
    let properties = schema["properties"].as_object().into_iter().flat_map(|properties| properties.values());
    let names: BTreeSet<&str> = properties
        .flat_map(|property| match &property["x-env"] {
            Value::Array(list) => list.iter().filter_map(Value::as_str).collect(),
            name => name.as_str().into_iter().collect::<Vec<_>>(),
        })
        .collect();
    let value = |name: &str| std::env::var(name).ok().map(|value| (name.to_owned(), value));
    names.into_iter().filter_map(value).collect()
}
/// How a worker ended, in words: `was killed by signal SIGSEGV
/// (segmentation fault)`, `exited with status 3`.
fn describe(status: ExitStatus) -> String {
    if let Some(signal) = status.signal() {
        let name =
            Signal::try_from(signal).map_or_else(|_| signal.to_string(), |name| name.as_str().to_owned());
        let cause = match signal {
            libc::SIGSEGV => " (segmentation fault)",
            libc::SIGABRT => " (abort)",
            libc::SIGBUS => " (bus error)",
            libc::SIGILL => " (illegal instruction)",
            libc::SIGFPE => " (arithmetic fault)",
            libc::SIGXCPU => " (CPU time limit)",
            _ => "",
        };
        return format!("was killed by signal {name}{cause}");
    }
    match status.code() {
        Some(0) => "exited".to_owned(),
        Some(code) => format!("exited with status {code}"),
        None => "ended".to_owned(),
    }
}
