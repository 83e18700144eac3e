//! The host's side: [`IsolatedProvider`], the [`Provider`] trait over a
//! worker process, restarted after a crash.

use super::{
    process::{Failure, Output, Setup, Shared, WorkerProcess},
    protocol::{Call, Reply},
    spawn::Limits,
};
use provider_abi::{
    AcquireParams, ByteSink, CreationRecorder, EnvironmentParams, ExecuteParams, ExecuteResult, HealthReport,
    Hook, HookResult, Lease, LeaseParams, LeaseStatus, LogLevel, LogSink, Manifest, OutputSink, ProbeReport,
    Provider, ProviderError, ReleaseReport, SetupParams, SyncParams, SyncResult, ValidationReport, Workspace,
};
use std::{
    borrow::Cow,
    ffi::OsString,
    fmt,
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex, MutexGuard,
    },
    time::Duration,
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
    /// At most this many creation workers (default 32): each creating hook
    /// runs alone in one while fewer are busy; beyond them, creations share
    /// the least busy one (and a crash of one can then cut another short).
    pub creation_workers: usize,
    /// The SHA-256 the library must have: every worker checks it before
    /// loading (`__worker LIBRARY --sha256 HEX`), so a worker loads exactly
    /// the private copy the host checked.
    pub library_sha256: Option<String>,
}

impl Default for IsolationOptions {
    fn default() -> Self {
        IsolationOptions {
            program: None,
            args: vec!["__worker".into()],
            deadline: Duration::from_secs(15 * 60),
            limits: Limits::default(),
            creation_workers: 32,
            library_sha256: None,
        }
    }
}

/// Why an isolated provider could not start; displays as one line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IsolationError(pub(super) String);

impl fmt::Display for IsolationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for IsolationError {}

/// A provider library served by worker processes, behind the [`Provider`]
/// trait: a segmentation fault, abort, stack overflow or runaway allocation
/// in the provider kills a worker, never the host.
///
/// One worker serves every hook but the creating ones; each creating hook
/// (`acquire_lease`, `probe` and their recording forms) runs alone in a
/// creation worker of its own (kept for the next creation; at most
/// [`IsolationOptions::creation_workers`]), so a crash in another hook never
/// cuts a creation short between the sandbox being made and its record
/// reaching the host: a sandbox the API made is always one the host can
/// name. (A crash inside the creating hook itself still can, as a `SIGKILL`
/// of an in-process host can.)
///
/// A worker that dies fails the calls in flight on it with an `internal`
/// error naming how it ended and the hook (operation label
/// [`WORKER_OPERATION`]); the next call starts a new worker, with the same
/// environment and `setup`, and every lease the host handed over as
/// unconfirmed (`import_unconfirmed`, until the lease is destroyed), so a
/// lease poisoned before a crash stays poisoned in the provider after it.
/// (A lease a dead worker marked itself and the host did not hear of is
/// still known to the host's ledger, and [`crate::host::Host`] refuses to
/// reuse it whichever worker serves.)
pub struct IsolatedProvider {
    library: PathBuf,
    options: IsolationOptions,
    manifest: Manifest,
    supported: Vec<String>,
    setup: Mutex<Setup>,
    main: Mutex<Option<Arc<WorkerProcess>>>,
    creators: Mutex<Vec<Arc<WorkerProcess>>>,
    started: AtomicU64,
    shared: Arc<Shared>,
    /// Leases handed over as unconfirmed, replayed into every new main worker.
    unconfirmed: Mutex<Vec<LeaseParams>>,
}

impl IsolatedProvider {
    /// Starts a worker serving the provider library at `library` and reads
    /// its manifest. Load errors are the worker's one line.
    pub fn start(library: impl AsRef<Path>, options: IsolationOptions) -> Result<Self, IsolationError> {
        let library = library.as_ref();
        let library = std::path::absolute(library).unwrap_or_else(|_| library.to_path_buf());
        let shared = Arc::new(Shared::default());
        let worker = WorkerProcess::open(&library, &options, &Setup::default(), &shared)?;
        let mut manifest = worker.hello.manifest.clone();
        manifest.hooks.retain(|name| Hook::from_name(name).is_none_or(|hook| !hook.is_async()));
        Ok(IsolatedProvider {
            library,
            options,
            manifest,
            supported: worker.hello.supported.clone(),
            setup: Mutex::new(Setup::default()),
            main: Mutex::new(Some(worker)),
            creators: Mutex::new(Vec::new()),
            started: AtomicU64::new(1),
            shared,
            unconfirmed: Mutex::new(Vec::new()),
        })
    }

    /// The library the workers load.
    pub fn library(&self) -> &Path {
        &self.library
    }

    /// True when the worker's library has `hook` (every blocking hook crosses the
    /// worker protocol; a library older than the hook reports `unsupported`,
    /// and hosts fall back as in process).
    ///
    /// The async hooks (ABI 1.7 and 1.8) do not cross the worker protocol: never
    /// supported here, so async hosts fall back to the blocking hooks.
    pub fn supports(&self, hook: Hook) -> bool {
        !hook.is_async() && self.supported.iter().any(|name| name == hook.name())
    }

    /// Workers started to serve the hooks that create nothing (1 + restarts).
    pub fn workers_started(&self) -> u64 {
        self.started.load(Ordering::SeqCst)
    }

    /// Workers that died or were killed without being asked to stop.
    pub fn crashes(&self) -> u64 {
        self.shared.crashes.load(Ordering::SeqCst)
    }

    /// The process id of the worker serving the hooks that create nothing,
    /// if one is alive.
    pub fn worker_pid(&self) -> Option<u32> {
        lock(&self.main).as_ref().filter(|worker| !worker.is_dead()).map(|worker| worker.pid)
    }

    /// Starts a worker with the current setup; refuses one whose library
    /// changed on disk.
    fn open_worker(&self) -> HookResult<Arc<WorkerProcess>> {
        let setup = lock(&self.setup).clone();
        let worker = WorkerProcess::open(&self.library, &self.options, &setup, &self.shared)
            .map_err(|error| worker_error(error.to_string()))?;
        let (loaded, manifest) = (&worker.hello.manifest, &self.manifest);
        if (&loaded.id, &loaded.version) != (&manifest.id, &manifest.version) {
            worker.close();
            return Err(worker_error(format!(
                "The provider library {} changed on disk: it was {} {}, the new worker loaded {} {}.",
                self.library.display(),
                manifest.id,
                manifest.version,
                loaded.id,
                loaded.version
            )));
        }
        Ok(worker)
    }

    /// The live main worker, or a new one.
    fn main_worker(&self) -> HookResult<Arc<WorkerProcess>> {
        let mut main = lock(&self.main);
        if let Some(worker) = main.as_ref().filter(|worker| !worker.is_dead()) {
            return Ok(Arc::clone(worker));
        }
        let worker = self.open_worker()?;
        self.started.fetch_add(1, Ordering::SeqCst);
        let unconfirmed = lock(&self.unconfirmed).clone();
        for lease in &unconfirmed {
            let call = Call::ImportUnconfirmed(Cow::Borrowed(lease));
            match worker.call(&call, &mut Output::None, None, self.options.deadline) {
                Ok(Ok(Reply::Unit)) => {}
                Ok(Ok(_)) => return Err(reply_mismatch(Hook::ImportUnconfirmed)),
                Ok(Err(error)) => return Err(error),
                Err(failure) => return Err(failure_error(worker.pid, failure, Hook::ImportUnconfirmed)),
            }
        }
        *main = Some(Arc::clone(&worker));
        Ok(worker)
    }

    /// A creation worker for one creation: an idle one, else a new one
    /// while fewer than [`IsolationOptions::creation_workers`] live, else
    /// the one with the fewest creations in flight. Counted as taken.
    fn creation_worker(&self) -> HookResult<Arc<WorkerProcess>> {
        let mut creators = lock(&self.creators);
        creators.retain(|worker| !worker.is_dead());
        let in_flight = |worker: &Arc<WorkerProcess>| worker.creations.load(Ordering::SeqCst);
        let worker = match creators.iter().min_by_key(|worker| in_flight(worker)) {
            Some(least)
                if in_flight(least) == 0 || creators.len() >= self.options.creation_workers.max(1) =>
            {
                Arc::clone(least)
            }
            // Started under the lock, so the bound holds; a start costs a
            // few milliseconds, once per creation worker.
            _ => {
                let worker = self.open_worker()?;
                creators.push(Arc::clone(&worker));
                worker
            }
        };
        worker.creations.fetch_add(1, Ordering::SeqCst);
        Ok(worker)
    }

    /// Creation workers alive now.
    pub fn creation_workers(&self) -> usize {
        lock(&self.creators).iter().filter(|worker| !worker.is_dead()).count()
    }

    /// The deadline of `call`.
    fn deadline(&self, call: &Call<'_>) -> Duration {
        match call {
            Call::Execute(params) | Call::ExecuteBytes(params) => match params.timeout_ms.into_option() {
                Some(ms) => self.options.deadline.max(Duration::from_millis(ms) + Duration::from_secs(60)),
                None => self.options.deadline,
            },
            _ => self.options.deadline,
        }
    }

    /// Runs `call` on its worker (a creation worker for a creating hook),
    /// delivering output to `output` and created leases to `recorder` as
    /// they arrive. A worker found dead before the call was sent is
    /// replaced once.
    fn call(
        &self,
        call: Call<'_>,
        mut output: Output<'_, '_>,
        mut recorder: Option<&mut CreationRecorder<'_>>,
    ) -> HookResult<Reply> {
        let hook = call.hook();
        let creating = matches!(
            hook,
            Hook::AcquireLease | Hook::AcquireLeaseRecording | Hook::Probe | Hook::ProbeRecording
        );
        let deadline = self.deadline(&call);
        let mut attempts = 0;
        loop {
            attempts += 1;
            let worker = if creating { self.creation_worker()? } else { self.main_worker()? };
            let outcome = worker.call(&call, &mut output, recorder.as_deref_mut(), deadline);
            if creating {
                worker.creations.fetch_sub(1, Ordering::SeqCst);
            }
            return match outcome {
                Ok(result) => result,
                Err(Failure::NotSent(_)) if attempts < 2 => continue,
                Err(failure) => Err(failure_error(worker.pid, failure, hook)),
            };
        }
    }

    /// Every live worker.
    fn workers(&self) -> Vec<Arc<WorkerProcess>> {
        let main = lock(&self.main).clone().into_iter();
        main.chain(lock(&self.creators).iter().cloned()).filter(|worker| !worker.is_dead()).collect()
    }
}

impl Drop for IsolatedProvider {
    /// Closes every worker's control socket: each exits when it reads the end.
    fn drop(&mut self) {
        for worker in self.workers() {
            worker.close();
        }
    }
}

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

/// The one line a call gets when its worker failed it.
fn failure_error(pid: u32, failure: Failure, hook: Hook) -> ProviderError {
    match failure {
        Failure::NotSent(how) | Failure::Died(how) => crash_error(pid, &how, hook),
        Failure::Local(line) => worker_error(line),
        Failure::Deadline(deadline) => worker_error(format!(
            "{WORKER_FAILURE_PREFIX}{pid}) was killed: the `{hook}` hook passed its deadline of {deadline:?}; the next call starts a new worker."
        )),
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
        self.manifest.clone()
    }

    /// Runs `setup` on the worker, and on every worker started later.
    fn setup(&self, params: &SetupParams) -> HookResult<()> {
        *lock(&self.setup) = Setup { params: Some(params.clone()), logs: None };
        expect_reply!(self.call(Call::Setup(Cow::Borrowed(params)), Output::None, None), Hook::Setup)
    }

    /// Runs `setup_with_logs` on the worker, and on every worker started
    /// later: their events come back to the host and go to `logs`.
    fn setup_with_logs(&self, params: &SetupParams, logs: LogSink, max_level: LogLevel) -> HookResult<()> {
        *self.shared.logs.write().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(logs);
        *lock(&self.setup) = Setup { params: Some(params.clone()), logs: Some(max_level) };
        let call = Call::SetupWithLogs(Cow::Borrowed(params), max_level);
        expect_reply!(self.call(call, Output::None, None), Hook::SetupWithLogs)
    }

    /// Runs `shutdown` on every live worker; the main worker's outcome.
    fn shutdown(&self) -> HookResult<()> {
        let creators: Vec<_> = lock(&self.creators).iter().filter(|w| !w.is_dead()).cloned().collect();
        for worker in creators {
            let _ = worker.call(&Call::Shutdown, &mut Output::None, None, self.options.deadline);
        }
        expect_reply!(self.call(Call::Shutdown, Output::None, None), Hook::Shutdown)
    }

    fn health(&self) -> HookResult<HealthReport> {
        expect_reply!(self.call(Call::Health, Output::None, None), Hook::Health, Health)
    }

    fn validate_config(&self, params: &EnvironmentParams) -> HookResult<ValidationReport> {
        let call = Call::ValidateConfig(Cow::Borrowed(params));
        expect_reply!(self.call(call, Output::None, None), Hook::ValidateConfig, Validation)
    }

    fn probe(&self, params: &EnvironmentParams) -> HookResult<ProbeReport> {
        expect_reply!(self.call(Call::Probe(Cow::Borrowed(params)), Output::None, None), Hook::Probe, Probe)
    }

    fn acquire_lease(&self, params: &AcquireParams) -> HookResult<Lease> {
        let call = Call::AcquireLease(Cow::Borrowed(params));
        expect_reply!(self.call(call, Output::None, None), Hook::AcquireLease, Lease)
    }

    fn resume_lease(&self, params: &LeaseParams) -> HookResult<Lease> {
        let call = Call::ResumeLease(Cow::Borrowed(params));
        expect_reply!(self.call(call, Output::None, None), Hook::ResumeLease, Lease)
    }

    fn release_lease(&self, params: &LeaseParams) -> HookResult<()> {
        let call = Call::ReleaseLease(Cow::Borrowed(params));
        expect_reply!(self.call(call, Output::None, None), Hook::ReleaseLease)
    }

    /// A destroyed lease is no longer handed to new workers as unconfirmed.
    fn destroy_lease(&self, params: &LeaseParams) -> HookResult<()> {
        let call = Call::DestroyLease(Cow::Borrowed(params));
        expect_reply!(self.call(call, Output::None, None), Hook::DestroyLease)?;
        lock(&self.unconfirmed).retain(|lease| lease.provider_lease_id != params.provider_lease_id);
        Ok(())
    }

    /// Hands the lease to the main worker, and to every main worker started
    /// later until the lease is destroyed.
    fn import_unconfirmed(&self, params: &LeaseParams) -> HookResult<()> {
        {
            let mut unconfirmed = lock(&self.unconfirmed);
            unconfirmed.retain(|lease| lease.provider_lease_id != params.provider_lease_id);
            unconfirmed.push(params.clone());
        }
        let call = Call::ImportUnconfirmed(Cow::Borrowed(params));
        expect_reply!(self.call(call, Output::None, None), Hook::ImportUnconfirmed)
    }

    fn realize_workspace(&self, params: &LeaseParams) -> HookResult<Workspace> {
        let call = Call::RealizeWorkspace(Cow::Borrowed(params));
        expect_reply!(self.call(call, Output::None, None), Hook::RealizeWorkspace, Workspace)
    }

    fn execute(&self, params: &ExecuteParams, output: &mut OutputSink<'_>) -> HookResult<ExecuteResult> {
        let call = Call::Execute(Cow::Borrowed(params));
        expect_reply!(self.call(call, Output::Text(output), None), Hook::Execute, Execute)
    }

    fn execute_bytes(&self, params: &ExecuteParams, output: &mut ByteSink<'_>) -> HookResult<ExecuteResult> {
        let call = Call::ExecuteBytes(Cow::Borrowed(params));
        expect_reply!(self.call(call, Output::Bytes(output), None), Hook::ExecuteBytes, Execute)
    }

    fn inspect_lease(&self, params: &LeaseParams) -> HookResult<LeaseStatus> {
        let call = Call::InspectLease(Cow::Borrowed(params));
        expect_reply!(self.call(call, Output::None, None), Hook::InspectLease, Status)
    }

    fn acquire_lease_recording(
        &self,
        params: &AcquireParams,
        recorder: &mut CreationRecorder<'_>,
    ) -> HookResult<Lease> {
        let call = Call::AcquireLeaseRecording(Cow::Borrowed(params));
        expect_reply!(self.call(call, Output::None, Some(recorder)), Hook::AcquireLeaseRecording, Lease)
    }

    fn probe_recording(
        &self,
        params: &EnvironmentParams,
        recorder: &mut CreationRecorder<'_>,
    ) -> HookResult<ProbeReport> {
        let call = Call::ProbeRecording(Cow::Borrowed(params));
        expect_reply!(self.call(call, Output::None, Some(recorder)), Hook::ProbeRecording, Probe)
    }

    fn release_lease_reporting(&self, params: &LeaseParams) -> HookResult<ReleaseReport> {
        let call = Call::ReleaseLeaseReporting(Cow::Borrowed(params));
        expect_reply!(self.call(call, Output::None, None), Hook::ReleaseLeaseReporting, Release)
    }

    fn sync_in(&self, params: &SyncParams) -> HookResult<SyncResult> {
        let call = Call::SyncIn(Cow::Borrowed(params));
        expect_reply!(self.call(call, Output::None, None), Hook::SyncIn, Sync)
    }

    fn sync_out(&self, params: &SyncParams) -> HookResult<SyncResult> {
        let call = Call::SyncOut(Cow::Borrowed(params));
        expect_reply!(self.call(call, Output::None, None), Hook::SyncOut, Sync)
    }
}
