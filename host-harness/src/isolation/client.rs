//! The host's side: [`IsolatedProvider`], the [`Provider`] trait over a
//! worker process, restarted after a crash.

use super::{
    protocol::{self, Call, Hello, Reply, ToHost, ToWorker},
    spawn::{self, Limits, SpawnSpec},
};
use provider_abi::{
    AcquireParams, CreationRecorder, EnvironmentParams, ExecuteParams, ExecuteResult, HealthReport, Hook,
    HookResult, Lease, LeaseParams, LeaseStatus, Manifest, OutputSink, OutputStream, ProbeReport, Provider,
    ProviderError, ReleaseReport, SetupParams, ValidationReport, Workspace,
};
use serde_json::Value;
use std::{
    borrow::Cow,
    collections::HashMap,
    ffi::OsString,
    fmt,
    io::{self, BufReader},
    os::unix::{net::UnixStream, process::ExitStatusExt},
    path::{Path, PathBuf},
    process::{Child, ExitStatus},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        mpsc, Arc, Mutex, MutexGuard,
    },
    time::{Duration, Instant},
};

/// The operation label of the errors a worker's death or deadline gives
/// the calls in flight (see [`is_worker_failure`]).
pub const WORKER_OPERATION: &str = "provider worker";

/// How the message of every error a worker's death gives begins.
pub const WORKER_FAILURE_PREFIX: &str = "The provider worker (pid ";

/// True for the error of a call whose worker died or was killed under it:
/// what the hook did before is unknown (a command it ran may still run).
pub fn is_worker_failure(error: &ProviderError) -> bool {
    error.operation() == Some(WORKER_OPERATION)
}

/// True for the message of such an error, as a ledger row keeps it.
pub fn is_worker_failure_message(message: &str) -> bool {
    message.starts_with(WORKER_FAILURE_PREFIX)
}

/// How isolated providers start and watch their workers.
#[derive(Debug, Clone)]
pub struct IsolationOptions {
    /// The worker program: `None` runs this process's own executable (the
    /// harness binary, whose hidden `__worker` subcommand serves the hooks).
    pub program: Option<PathBuf>,
    /// The arguments before the library path (default `__worker`).
    pub args: Vec<OsString>,
    /// How long a hook may run before its worker is killed and restarted
    /// (default 15 minutes). An `execute` with its own timeout gets that
    /// timeout plus a minute when that is longer.
    pub deadline: Duration,
    /// The worker's resource limits.
    pub limits: Limits,
}

impl Default for IsolationOptions {
    fn default() -> Self {
        IsolationOptions {
            program: None,
            args: vec!["__worker".into()],
            deadline: Duration::from_secs(15 * 60),
            limits: Limits::default(),
        }
    }
}

/// Why an isolated provider could not start; displays as one line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IsolationError(String);

impl fmt::Display for IsolationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for IsolationError {}

/// A provider library served by a worker process, behind the [`Provider`]
/// trait: a segmentation fault, abort, stack overflow or runaway allocation
/// in the provider kills the worker, never the host.
///
/// A worker that dies fails the calls in flight with an `internal` error
/// naming how it ended and the hook (operation label [`WORKER_OPERATION`]);
/// the next call starts a new worker, with the same environment and
/// `setup`. What the dead worker knew only in memory (leases whose cleanup
/// was unconfirmed) is gone with it: the host's ledger keeps that, and
/// [`crate::host::Host`] refuses to reuse such leases whichever worker serves.
pub struct IsolatedProvider {
    library: PathBuf,
    options: IsolationOptions,
    hello: Hello,
    setup: Mutex<Option<SetupParams>>,
    current: Mutex<Option<Arc<Connection>>>,
    next_id: AtomicU64,
    started: AtomicU64,
    crashes: Arc<AtomicU64>,
}

impl IsolatedProvider {
    /// Starts a worker serving the provider library at `library` and reads
    /// its manifest. Load errors are the worker's one line.
    pub fn start(library: impl AsRef<Path>, options: IsolationOptions) -> Result<Self, IsolationError> {
        let library = library.as_ref();
        let library = std::path::absolute(library).unwrap_or_else(|_| library.to_path_buf());
        let crashes = Arc::new(AtomicU64::new(0));
        let (connection, hello) = Connection::open(&library, &options, None, &crashes)?;
        Ok(IsolatedProvider {
            library,
            options,
            hello,
            setup: Mutex::new(None),
            current: Mutex::new(Some(connection)),
            next_id: AtomicU64::new(1),
            started: AtomicU64::new(1),
            crashes,
        })
    }

    /// The library the workers load.
    pub fn library(&self) -> &Path {
        &self.library
    }

    /// True when the worker's build can call `hook` on the library.
    /// True when the worker's library has `hook` and the worker protocol
    /// forwards it (the hooks up to ABI 1.2; later ones report `unsupported`,
    /// and hosts fall back as for an older provider).
    pub fn supports(&self, hook: Hook) -> bool {
        hook.since() <= provider_abi::ABI_1_2 && self.hello.supported.iter().any(|name| name == hook.name())
    }

    /// Workers started so far (1 + restarts).
    pub fn workers_started(&self) -> u64 {
        self.started.load(Ordering::SeqCst)
    }

    /// Workers that died or were killed without being asked to stop.
    pub fn crashes(&self) -> u64 {
        self.crashes.load(Ordering::SeqCst)
    }

    /// The process id of the worker serving now, if one is alive.
    pub fn worker_pid(&self) -> Option<u32> {
        lock(&self.current)
            .as_ref()
            .filter(|connection| !connection.is_dead())
            .map(|connection| connection.pid)
    }

    /// The live worker, or a new one.
    fn connection(&self) -> HookResult<Arc<Connection>> {
        let mut current = lock(&self.current);
        if let Some(connection) = current.as_ref().filter(|connection| !connection.is_dead()) {
            return Ok(Arc::clone(connection));
        }
        let setup = lock(&self.setup).clone();
        let (connection, hello) = Connection::open(&self.library, &self.options, setup, &self.crashes)
            .map_err(|error| worker_error(error.to_string()))?;
        self.started.fetch_add(1, Ordering::SeqCst);
        let manifest = &self.hello.manifest;
        if (&hello.manifest.id, &hello.manifest.version) != (&manifest.id, &manifest.version) {
            connection.close();
            return Err(worker_error(format!(
                "The provider library {} changed on disk: it was {} {}, the new worker loaded {} {}.",
                self.library.display(),
                manifest.id,
                manifest.version,
                hello.manifest.id,
                hello.manifest.version
            )));
        }
        *current = Some(Arc::clone(&connection));
        Ok(connection)
    }

    /// The deadline of `call`.
    fn deadline(&self, call: &Call<'_>) -> Duration {
        match call {
            Call::Execute(params) => match params.timeout_ms.into_option() {
                Some(ms) => self.options.deadline.max(Duration::from_millis(ms) + Duration::from_secs(60)),
                None => self.options.deadline,
            },
            _ => self.options.deadline,
        }
    }

    /// Runs `call` on the worker, delivering output chunks to `output` and
    /// created leases to `recorder` as they arrive.
    fn call(
        &self,
        call: Call<'_>,
        mut output: Option<&mut OutputSink<'_>>,
        mut recorder: Option<&mut CreationRecorder<'_>>,
    ) -> HookResult<Reply> {
        let hook = call.hook();
        let deadline = self.deadline(&call);
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (events, incoming) = mpsc::channel();
        // A worker that died between `connection` and `register` is
        // replaced once.
        let mut connection = self.connection()?;
        if let Err(how) = connection.register(id, hook, events.clone()) {
            connection = self.connection()?;
            connection.register(id, hook, events).map_err(|_| crash_error(connection.pid, &how, hook))?;
        }
        if connection.send(&ToWorker::Call { id, call }).is_err() {
            // The reader sees the broken connection and reports the death.
            connection.kill(None);
        }
        let until = Instant::now() + deadline;
        loop {
            let event = match next_event(&incoming, until) {
                Ok(event) => event,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    let how =
                        format!("was killed when the `{hook}` hook passed its deadline of {deadline:?}");
                    connection.unregister(id);
                    connection.kill(Some(how));
                    return Err(worker_error(format!(
                        "{WORKER_FAILURE_PREFIX}{}) was killed: the `{hook}` hook passed its deadline of {deadline:?}; the next call starts a new worker.",
                        connection.pid
                    )));
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => Event::Died("ended without a reply".to_owned()),
            };
            match event {
                Event::Chunk(stream, text) => {
                    if let Some(output) = output.as_deref_mut() {
                        output.write(stream, &text);
                    }
                }
                Event::Record(lease) => {
                    let result = match recorder.as_deref_mut() {
                        Some(recorder) => recorder.record(&lease),
                        None => Ok(()),
                    };
                    // A failed send means the worker died: its death comes next.
                    let _ = connection.send(&ToWorker::Recorded { id, result });
                }
                Event::Reply(result) => return result,
                Event::Died(how) => return Err(crash_error(connection.pid, &how, hook)),
            }
        }
    }
}

impl Drop for IsolatedProvider {
    /// Closes the worker's connection: it exits when it reads the end.
    fn drop(&mut self) {
        if let Some(connection) = lock(&self.current).take() {
            connection.close();
        }
    }
}

/// The next event of a call: polled for a few microseconds first (a
/// cheap hook's reply is usually that close, and a thread put to sleep
/// costs more to wake than the poll), then waited for until `until`.
fn next_event(incoming: &mpsc::Receiver<Event>, until: Instant) -> Result<Event, mpsc::RecvTimeoutError> {
    for _ in 0..SPIN_POLLS {
        match incoming.try_recv() {
            Ok(event) => return Ok(event),
            Err(mpsc::TryRecvError::Empty) => std::thread::yield_now(),
            Err(mpsc::TryRecvError::Disconnected) => return Err(mpsc::RecvTimeoutError::Disconnected),
        }
    }
    incoming.recv_timeout(until.saturating_duration_since(Instant::now()))
}

/// How many times a caller polls for its reply before it sleeps.
const SPIN_POLLS: usize = 50;

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn worker_error(message: String) -> ProviderError {
    ProviderError::internal(message).with_http(None, Some(WORKER_OPERATION))
}

/// The one line a call gets when its worker ended under it.
fn crash_error(pid: u32, how: &str, hook: Hook) -> ProviderError {
    worker_error(format!(
        "{WORKER_FAILURE_PREFIX}{pid}) {how} during the `{hook}` hook; the next call starts a new worker."
    ))
}

/// What the reader hands a waiting call.
enum Event {
    Chunk(OutputStream, String),
    Record(Lease),
    Reply(HookResult<Reply>),
    Died(String),
}

#[derive(Default)]
struct Calls {
    /// Calls in flight: their hook and where their events go.
    pending: HashMap<u64, (Hook, mpsc::Sender<Event>)>,
    /// How the worker ended, once it has.
    died: Option<String>,
    /// Why the host killed it, when it did.
    killed_because: Option<String>,
}

/// One worker process and its socket.
struct Connection {
    pid: u32,
    writer: Mutex<UnixStream>,
    calls: Mutex<Calls>,
    child: Mutex<Child>,
    dead: AtomicBool,
    closing: AtomicBool,
}

impl Connection {
    /// Starts a worker, runs the handshake and starts its reader thread.
    fn open(
        library: &Path,
        options: &IsolationOptions,
        setup: Option<SetupParams>,
        crashes: &Arc<AtomicU64>,
    ) -> Result<(Arc<Connection>, Hello), IsolationError> {
        let program = match &options.program {
            Some(program) => program.clone(),
            None => std::env::current_exe().map_err(|error| {
                IsolationError(format!("cannot find this program to start a provider worker: {error}"))
            })?,
        };
        let failed = |error: io::Error| {
            IsolationError(format!("cannot start the provider worker {}: {error}", program.display()))
        };
        let (host_end, worker_end) = UnixStream::pair().map_err(failed)?;
        let mut args = options.args.clone();
        args.push(library.as_os_str().to_owned());
        let spec = SpawnSpec { program: program.clone(), args, limits: options.limits.clone() };
        let mut child = spawn::spawn(&spec, worker_end).map_err(failed)?;
        let pid = child.id();
        match handshake(&host_end, options.deadline, setup) {
            Ok(Ok(hello)) => {
                host_end.set_read_timeout(None).map_err(failed)?;
                let reader = BufReader::new(host_end.try_clone().map_err(failed)?);
                let connection = Arc::new(Connection {
                    pid,
                    writer: Mutex::new(host_end),
                    calls: Mutex::new(Calls::default()),
                    child: Mutex::new(child),
                    dead: AtomicBool::new(false),
                    closing: AtomicBool::new(false),
                });
                let watched = Arc::clone(&connection);
                let crashes = Arc::clone(crashes);
                std::thread::Builder::new()
                    .name(format!("provider-worker-{pid}"))
                    .spawn(move || watched.read_replies(reader, &crashes))
                    .map_err(failed)?;
                Ok((connection, hello))
            }
            Ok(Err(refused)) => {
                let _ = child.wait();
                Err(IsolationError(refused))
            }
            Err(error) => {
                let _ = child.kill();
                let how = child.wait().map(describe).unwrap_or_else(|_| "ended".into());
                Err(IsolationError(format!(
                    "the provider worker (pid {pid}) {how} while loading {}: {error}",
                    library.display()
                )))
            }
        }
    }

    fn is_dead(&self) -> bool {
        self.dead.load(Ordering::SeqCst)
    }

    fn register(&self, id: u64, hook: Hook, events: mpsc::Sender<Event>) -> Result<(), String> {
        let mut calls = lock(&self.calls);
        match &calls.died {
            Some(how) => Err(how.clone()),
            None => {
                calls.pending.insert(id, (hook, events));
                Ok(())
            }
        }
    }

    fn unregister(&self, id: u64) {
        lock(&self.calls).pending.remove(&id);
    }

    fn send(&self, message: &ToWorker<'_>) -> io::Result<()> {
        let frame = protocol::encode(message)?;
        io::Write::write_all(&mut *lock(&self.writer), &frame)
    }

    /// Kills the worker (`because`: why, for the calls still in flight);
    /// calls from now on start a new one.
    fn kill(&self, because: Option<String>) {
        self.dead.store(true, Ordering::SeqCst);
        if let Some(because) = because {
            lock(&self.calls).killed_because.get_or_insert(because);
        }
        let _ = lock(&self.child).kill();
    }

    /// Asks the worker to exit (it reads the end of its socket).
    fn close(&self) {
        self.closing.store(true, Ordering::SeqCst);
        let _ = lock(&self.writer).shutdown(std::net::Shutdown::Both);
    }

    /// The reader thread: routes every frame to its call until the worker
    /// ends, then fails the calls still in flight.
    fn read_replies(self: Arc<Self>, mut reader: BufReader<UnixStream>, crashes: &AtomicU64) {
        let mut buffer = Vec::new();
        let ended = loop {
            let (id, event, last) = match protocol::read::<ToHost>(&mut reader, &mut buffer) {
                Ok(Some(ToHost::Chunk { id, stream, text })) => (id, Event::Chunk(stream, text), false),
                Ok(Some(ToHost::Record { id, lease })) => (id, Event::Record(lease), false),
                Ok(Some(ToHost::Reply { id, result })) => (id, Event::Reply(result), true),
                Ok(Some(_)) => break Some("sent a message out of turn"),
                Ok(None) => break None,
                Err(error) if error.kind() == io::ErrorKind::InvalidData => break Some("broke the protocol"),
                Err(_) => break None,
            };
            let mut calls = lock(&self.calls);
            let target = if last { calls.pending.remove(&id) } else { calls.pending.get(&id).cloned() };
            drop(calls);
            if let Some((_, events)) = target {
                let _ = events.send(event);
            }
        };
        if ended.is_some() {
            self.kill(ended.map(str::to_owned));
        }
        let status = self.reap();
        let mut calls = lock(&self.calls);
        let how = calls
            .killed_because
            .clone()
            .unwrap_or_else(|| status.map(describe).unwrap_or_else(|| "ended".into()));
        calls.died = Some(how.clone());
        self.dead.store(true, Ordering::SeqCst);
        let in_flight: Vec<_> = calls.pending.drain().map(|(_, call)| call).collect();
        drop(calls);
        if self.closing.load(Ordering::SeqCst) && in_flight.is_empty() {
            return;
        }
        crashes.fetch_add(1, Ordering::SeqCst);
        let hooks: Vec<_> = in_flight.iter().map(|(hook, _)| format!("`{hook}`")).collect();
        let during = if hooks.is_empty() {
            "between calls".to_owned()
        } else {
            format!("during {}", hooks.join(", "))
        };
        tracing::warn!(
            "the provider worker (pid {}) {how} {during}; the next call starts a new worker",
            self.pid
        );
        for (_, events) in in_flight {
            let _ = events.send(Event::Died(how.clone()));
        }
    }

    /// Waits for the worker to end (a second at most after its socket
    /// closed, then it is killed).
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

/// Reads the worker's hello, sends it the environment and `setup`, and
/// reads `setup`'s outcome; `Ok(Err(line))` when the worker refused.
fn handshake(
    socket: &UnixStream,
    deadline: Duration,
    setup: Option<SetupParams>,
) -> io::Result<Result<Hello, String>> {
    socket.set_read_timeout(Some(deadline))?;
    let mut reader = socket;
    let mut writer = socket;
    let mut buffer = Vec::new();
    let unexpected = || io::Error::new(io::ErrorKind::InvalidData, "unexpected handshake message");
    let ended = || io::Error::new(io::ErrorKind::UnexpectedEof, "it closed its connection");
    let hello = match protocol::read::<ToHost>(&mut reader, &mut buffer)?.ok_or_else(ended)? {
        ToHost::Hello(Ok(hello)) => hello,
        ToHost::Hello(Err(refused)) => return Ok(Err(refused)),
        _ => return Err(unexpected()),
    };
    let env = environment_for(&hello.manifest);
    protocol::write(&mut writer, &ToWorker::Start { env, setup })?;
    match protocol::read::<ToHost>(&mut reader, &mut buffer)?.ok_or_else(ended)? {
        ToHost::Ready(Ok(())) => Ok(Ok(hello)),
        ToHost::Ready(Err(error)) => Ok(Err(format!("the provider failed to start: {error}"))),
        _ => Err(unexpected()),
    }
}

/// The variables the provider's configuration schema names: every
/// top-level property's `x-env` (a name or a list of names), with the
/// host's value, when set. The host knows no key of the configuration.
pub fn environment_for(manifest: &Manifest) -> Vec<(String, String)> {
    let schema: Value = serde_json::from_str(&manifest.config_schema_json).unwrap_or_default();
    let mut names: Vec<String> = Vec::new();
    for property in schema["properties"].as_object().into_iter().flat_map(|properties| properties.values()) {
        match &property["x-env"] {
            Value::String(name) => names.push(name.clone()),
            Value::Array(list) => names.extend(list.iter().filter_map(Value::as_str).map(str::to_owned)),
            _ => {}
        }
    }
    names.sort();
    names.dedup();
    names.into_iter().filter_map(|name| std::env::var(&name).ok().map(|value| (name, value))).collect()
}

/// How a worker ended, in words: `was killed by signal SIGSEGV
/// (segmentation fault)`, `exited with status 3`.
fn describe(status: ExitStatus) -> String {
    if let Some(signal) = status.signal() {
        let name = match signal {
            libc::SIGSEGV => "SIGSEGV (segmentation fault)",
            libc::SIGABRT => "SIGABRT (abort)",
            libc::SIGKILL => "SIGKILL",
            libc::SIGBUS => "SIGBUS (bus error)",
            libc::SIGILL => "SIGILL (illegal instruction)",
            libc::SIGFPE => "SIGFPE (arithmetic fault)",
            libc::SIGXCPU => "SIGXCPU (CPU time limit)",
            libc::SIGTERM => "SIGTERM",
            libc::SIGINT => "SIGINT",
            libc::SIGPIPE => "SIGPIPE",
            libc::SIGTRAP => "SIGTRAP",
            libc::SIGSYS => "SIGSYS",
            other => return format!("was killed by signal {other}"),
        };
        return format!("was killed by signal {name}");
    }
    match status.code() {
        Some(0) => "exited".to_owned(),
        Some(code) => format!("exited with status {code}"),
        None => "ended".to_owned(),
    }
}

fn reply_mismatch(hook: Hook) -> ProviderError {
    worker_error(format!("The provider worker answered the `{hook}` hook with another hook's result."))
}

macro_rules! expect_reply {
    ($reply:expr, $hook:expr, $variant:ident) => {
        match $reply? {
            Reply::$variant(value) => Ok(value),
            _ => Err(reply_mismatch($hook)),
        }
    };
    ($reply:expr, $hook:expr) => {
        match $reply? {
            Reply::Unit => Ok(()),
            _ => Err(reply_mismatch($hook)),
        }
    };
}

impl Provider for IsolatedProvider {
    fn manifest(&self) -> Manifest {
        self.hello.manifest.clone()
    }

    /// Runs `setup` on the worker, and on every worker started later.
    fn setup(&self, params: &SetupParams) -> HookResult<()> {
        *lock(&self.setup) = Some(params.clone());
        expect_reply!(self.call(Call::Setup(Cow::Borrowed(params)), None, None), Hook::Setup)
    }

    fn shutdown(&self) -> HookResult<()> {
        expect_reply!(self.call(Call::Shutdown, None, None), Hook::Shutdown)
    }

    fn health(&self) -> HookResult<HealthReport> {
        expect_reply!(self.call(Call::Health, None, None), Hook::Health, Health)
    }

    fn validate_config(&self, params: &EnvironmentParams) -> HookResult<ValidationReport> {
        let call = Call::ValidateConfig(Cow::Borrowed(params));
        expect_reply!(self.call(call, None, None), Hook::ValidateConfig, Validation)
    }

    fn probe(&self, params: &EnvironmentParams) -> HookResult<ProbeReport> {
        expect_reply!(self.call(Call::Probe(Cow::Borrowed(params)), None, None), Hook::Probe, Probe)
    }

    fn acquire_lease(&self, params: &AcquireParams) -> HookResult<Lease> {
        let call = Call::AcquireLease(Cow::Borrowed(params));
        expect_reply!(self.call(call, None, None), Hook::AcquireLease, Lease)
    }

    fn resume_lease(&self, params: &LeaseParams) -> HookResult<Lease> {
        let call = Call::ResumeLease(Cow::Borrowed(params));
        expect_reply!(self.call(call, None, None), Hook::ResumeLease, Lease)
    }

    fn release_lease(&self, params: &LeaseParams) -> HookResult<()> {
        expect_reply!(self.call(Call::ReleaseLease(Cow::Borrowed(params)), None, None), Hook::ReleaseLease)
    }

    fn destroy_lease(&self, params: &LeaseParams) -> HookResult<()> {
        expect_reply!(self.call(Call::DestroyLease(Cow::Borrowed(params)), None, None), Hook::DestroyLease)
    }

    fn realize_workspace(&self, params: &LeaseParams) -> HookResult<Workspace> {
        let call = Call::RealizeWorkspace(Cow::Borrowed(params));
        expect_reply!(self.call(call, None, None), Hook::RealizeWorkspace, Workspace)
    }

    fn execute(&self, params: &ExecuteParams, output: &mut OutputSink<'_>) -> HookResult<ExecuteResult> {
        let call = Call::Execute(Cow::Borrowed(params));
        expect_reply!(self.call(call, Some(output), None), Hook::Execute, Execute)
    }

    fn inspect_lease(&self, params: &LeaseParams) -> HookResult<LeaseStatus> {
        let call = Call::InspectLease(Cow::Borrowed(params));
        expect_reply!(self.call(call, None, None), Hook::InspectLease, Status)
    }

    fn acquire_lease_recording(
        &self,
        params: &AcquireParams,
        recorder: &mut CreationRecorder<'_>,
    ) -> HookResult<Lease> {
        let call = Call::AcquireLeaseRecording(Cow::Borrowed(params));
        expect_reply!(self.call(call, None, Some(recorder)), Hook::AcquireLeaseRecording, Lease)
    }

    fn probe_recording(
        &self,
        params: &EnvironmentParams,
        recorder: &mut CreationRecorder<'_>,
    ) -> HookResult<ProbeReport> {
        let call = Call::ProbeRecording(Cow::Borrowed(params));
        expect_reply!(self.call(call, None, Some(recorder)), Hook::ProbeRecording, Probe)
    }

    fn release_lease_reporting(&self, params: &LeaseParams) -> HookResult<ReleaseReport> {
        let call = Call::ReleaseLeaseReporting(Cow::Borrowed(params));
        expect_reply!(self.call(call, None, None), Hook::ReleaseLeaseReporting, Release)
    }
}
