//! The host's side: [`IsolatedProvider`], the [`Provider`] trait over a
//! worker process, restarted after a crash.

use super::{
    lock,
    process::{cancelled, CallIo, Shared, WorkerProcess},
    protocol::{from_bytes, to_bytes},
    read,
    spawn::Limits,
    write,
};
use provider_abi::{
    ready, unsupported, AcquireParams, ByteSink, ByteSource, CreationRecorder, EnvironmentParams,
    ExecuteParams, ExecuteResult, HealthReport, Hook, HookFuture, HookResult, Lease, LeaseParams,
    LeaseStatus, LogLevel, LogSink, Manifest, ProbeReport, Provider, ProviderError, ReleaseReport,
    SetupParams, SyncParams, SyncResult, ValidationReport, Workspace,
};
use serde::{de::DeserializeOwned, Serialize};
use std::{
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

/// The operation label of the errors a worker's death or deadline gives
/// the calls in flight (see [`is_worker_failure`]).
pub const WORKER_OPERATION: &str = "provider worker";

/// How the message of every error a worker's death gives begins.
pub(super) const WORKER_FAILURE_PREFIX: &str = "The provider worker (pid ";

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
    /// The worker program: `None` runs this process's own executable, whose
    /// `main` calls [`run_worker_if_requested`](super::run_worker_if_requested)
    /// first; another program must do the same.
    pub program: Option<PathBuf>,
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
            deadline: Duration::from_secs(15 * 60),
            limits: Limits::default(),
            creation_workers: 32,
            library_sha256: None,
        }
    }
}

/// Why an isolated provider could not start; displays as one line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct IsolationError(pub(super) String);

/// A provider library served by worker processes, behind the [`Provider`]
/// trait: a segmentation fault, abort, stack overflow or runaway allocation
/// in the provider kills a worker, never the host.
///
/// One worker serves every hook but the creating ones; each creating hook
/// (`acquire_lease`, `probe`) runs alone in a creation worker of its own
/// (kept for the next creation; at most
/// [`IsolationOptions::creation_workers`]), so a crash in another hook never
/// cuts a creation short between the sandbox being made and its record
/// reaching the host: a sandbox the API made is always one the host can
/// name. (A crash inside the creating hook itself still can, as a `SIGKILL`
/// of an in-process host can.)
///
/// The synchronous hooks run on the calling thread; each hook that returns
/// a future runs on a thread of its own, and dropping its future cancels
/// it in the worker (which drops the provider's future).
///
/// A worker that dies fails the calls in flight on it with an `internal`
/// error naming how it ended and the hook (operation label
/// [`WORKER_OPERATION`]); the next call starts a new worker, with the same
/// environment and `setup`, and every lease the host handed over as
/// unconfirmed (`import_unconfirmed`, until the lease is destroyed), so a
/// lease poisoned before a crash stays poisoned in the provider after it.
/// (A lease a dead worker marked itself and the host did not hear of is
/// still known to the host's ledger, and the host refuses to reuse it
/// whichever worker serves.)
pub struct IsolatedProvider {
    inner: Arc<Inner>,
}

/// What the calls in flight share (a hook's future outlives its `&self`).
struct Inner {
    library: PathBuf,
    options: IsolationOptions,
    manifest: Manifest,
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
        let worker = WorkerProcess::open(&library, &options, &shared)?;
        let mut manifest = worker.manifest.clone();
        let local = [Hook::GrantRequestShare, Hook::ExportMemory, Hook::ImportMemory];
        manifest.hooks.retain(|name| local.iter().all(|hook| name.as_str() != hook.name()));
        let inner = Inner {
            library,
            options,
            manifest,
            main: Mutex::new(Some(worker)),
            creators: Mutex::new(Vec::new()),
            started: AtomicU64::new(1),
            shared,
            unconfirmed: Mutex::new(Vec::new()),
        };
        Ok(IsolatedProvider { inner: Arc::new(inner) })
    }

    /// The library the workers load.
    pub fn library(&self) -> &Path {
        &self.inner.library
    }

    /// True when the host can call `hook` through the workers: the hooks of
    /// the library's table (its manifest's list), but `grant_request_share`,
    /// which does not cross (every worker paces its own requests), nor do
    /// `export_memory` and `import_memory` (what a worker learns stays in
    /// that worker, and workers come and go within one host process).
    pub fn supports(&self, hook: Hook) -> bool {
        self.inner.manifest.hooks.iter().any(|name| name.as_str() == hook.name())
    }

    /// Workers started to serve the hooks that create nothing (1 + restarts).
    pub fn workers_started(&self) -> u64 {
        self.inner.started.load(Ordering::SeqCst)
    }

    /// Workers that died or were killed without being asked to stop.
    pub fn crashes(&self) -> u64 {
        self.inner.shared.crashes.load(Ordering::SeqCst)
    }

    /// The process id of the worker serving the hooks that create nothing,
    /// if one is alive.
    pub fn worker_pid(&self) -> Option<u32> {
        lock(&self.inner.main).as_ref().filter(|worker| !worker.is_dead()).map(|worker| worker.pid)
    }

    /// Creation workers alive now.
    pub fn creation_workers(&self) -> usize {
        lock(&self.inner.creators).iter().filter(|worker| !worker.is_dead()).count()
    }

    /// The postcard of `params`, when the host can call `hook`.
    fn encode(&self, hook: Hook, params: impl Serialize) -> HookResult<Vec<u8>> {
        if !self.supports(hook) {
            return Err(unsupported(hook));
        }
        to_bytes(&params)
    }

    /// Runs a synchronous hook on the calling thread.
    fn call_now<T: DeserializeOwned>(&self, hook: Hook, params: impl Serialize) -> HookResult<T> {
        let params = self.encode(hook, params)?;
        from_bytes(&self.inner.call(hook, &params, &mut CallIo::default())?)
    }

    /// Runs a hook that returns a future on a thread of its own. Dropping
    /// the future cancels the call.
    fn call_later<T: DeserializeOwned + Send + 'static>(
        &self,
        hook: Hook,
        params: impl Serialize,
        mut io: CallIo,
    ) -> HookFuture<T> {
        let params = match self.encode(hook, params) {
            Ok(params) => params,
            Err(error) => return ready(Err(error)),
        };
        let (inner, control) = (Arc::clone(&self.inner), Arc::clone(&io.control));
        let (sender, receiver) = tokio::sync::oneshot::channel();
        let spawned = std::thread::Builder::new().name("provider-call".into()).spawn(move || {
            // Dropped (cancelled) futures no longer listen.
            let _ = sender.send(inner.call(hook, &params, &mut io));
        });
        if let Err(error) = spawned {
            return ready(Err(worker_error(format!("cannot start a thread for the `{hook}` hook: {error}"))));
        }
        // Cancels the call when the future is dropped (a no-op once the call ended).
        let cancel_on_drop = scopeguard::guard(control, |control| control.cancel());
        Box::pin(async move {
            let _cancel_on_drop = cancel_on_drop;
            from_bytes(&receiver.await.unwrap_or_else(|_| Err(cancelled(hook)))?)
        })
    }
}

impl Inner {
    /// Starts a worker and replays the host's `setup` into it; refuses one
    /// whose library changed on disk.
    fn open_worker(&self) -> HookResult<Arc<WorkerProcess>> {
        let worker = WorkerProcess::open(&self.library, &self.options, &self.shared)
            .map_err(|error| worker_error(error.to_string()))?;
        let (loaded, manifest) = (&worker.manifest, &self.manifest);
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
        let setup = read(&self.shared.setup).as_ref().map(|(params, level, _)| (params.clone(), *level));
        if let Some(Err(error)) = setup.map(|setup| self.call_plain(&worker, Hook::Setup, &setup)) {
            worker.close();
            return Err(worker_error(format!("the provider failed to start: {error}")));
        }
        Ok(worker)
    }

    /// Runs `hook` on `worker` itself, with no input, output or recorder.
    fn call_plain(&self, worker: &WorkerProcess, hook: Hook, params: &impl Serialize) -> HookResult<()> {
        let outcome = worker.call(hook, &to_bytes(params)?, &mut CallIo::default(), self.options.deadline);
        outcome.map_err(|failure| failure.error)?.map(drop)
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
            // A worker that does not know every unconfirmed lease serves
            // nothing: it is closed, not left running unowned.
            self.call_plain(&worker, Hook::ImportUnconfirmed, lease).inspect_err(|_| worker.close())?;
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

    /// Runs `hook` on its worker (a creation worker for a creating hook),
    /// its output, input and recorded moments crossing through `io` as they
    /// come. A worker found dead before the call was sent is replaced once.
    fn call(&self, hook: Hook, params: &[u8], io: &mut CallIo) -> HookResult<Vec<u8>> {
        let creating = matches!(hook, Hook::AcquireLease | Hook::Probe);
        let deadline = self.options.deadline.max(io.deadline);
        let mut attempts = 0;
        loop {
            attempts += 1;
            let worker = if creating { self.creation_worker()? } else { self.main_worker()? };
            let outcome = worker.call(hook, params, io, deadline);
            if creating {
                worker.creations.fetch_sub(1, Ordering::SeqCst);
            }
            return match outcome {
                Err(failure) if failure.retry && attempts < 2 => continue,
                outcome => outcome.map_err(|failure| failure.error)?,
            };
        }
    }
}

impl Drop for IsolatedProvider {
    /// Closes every worker's control socket: each exits when it reads the end.
    fn drop(&mut self) {
        let main = lock(&self.inner.main).clone();
        main.iter().chain(lock(&self.inner.creators).iter()).for_each(|worker| worker.close());
    }
}

/// An error of the way to the provider (operation label [`WORKER_OPERATION`]).
pub(super) fn worker_error(message: String) -> ProviderError {
    ProviderError::internal(message).with_http(None, Some(WORKER_OPERATION))
}

impl Provider for IsolatedProvider {
    fn manifest(&self) -> Manifest {
        self.inner.manifest.clone()
    }

    /// Runs `setup` on the worker, and on every worker started later: their
    /// events come back to the host and go to `logs`.
    fn setup(&self, params: &SetupParams, logs: LogSink, max_level: LogLevel) -> HookResult<()> {
        *write(&self.inner.shared.setup) = Some((params.clone(), max_level, logs));
        self.call_now(Hook::Setup, (params, max_level))
    }

    /// Runs `shutdown` on every live worker; the main worker's outcome.
    fn shutdown(&self) -> HookResult<()> {
        let creators: Vec<_> = lock(&self.inner.creators).iter().filter(|w| !w.is_dead()).cloned().collect();
        for worker in creators {
            let _ = self.inner.call_plain(&worker, Hook::Shutdown, &());
        }
        self.call_now(Hook::Shutdown, ())
    }

    fn health(&self) -> HookResult<HealthReport> {
        self.call_now(Hook::Health, ())
    }

    fn validate_config(&self, params: &EnvironmentParams) -> HookResult<ValidationReport> {
        self.call_now(Hook::ValidateConfig, params)
    }

    fn probe(&self, params: EnvironmentParams, recorder: CreationRecorder) -> HookFuture<ProbeReport> {
        self.call_later(Hook::Probe, params, CallIo { recorder: Some(recorder), ..CallIo::default() })
    }

    fn acquire_lease(&self, params: AcquireParams, recorder: CreationRecorder) -> HookFuture<Lease> {
        self.call_later(Hook::AcquireLease, params, CallIo { recorder: Some(recorder), ..CallIo::default() })
    }

    fn resume_lease(&self, params: LeaseParams) -> HookFuture<Lease> {
        self.call_later(Hook::ResumeLease, params, CallIo::default())
    }

    fn release_lease(&self, params: LeaseParams) -> HookFuture<ReleaseReport> {
        self.call_later(Hook::ReleaseLease, params, CallIo::default())
    }

    /// A destroyed lease is no longer handed to new workers as unconfirmed.
    fn destroy_lease(&self, params: LeaseParams) -> HookFuture<()> {
        let (inner, id) = (Arc::clone(&self.inner), params.provider_lease_id.clone());
        let destroyed = self.call_later::<()>(Hook::DestroyLease, params, CallIo::default());
        Box::pin(async move {
            destroyed.await?;
            lock(&inner.unconfirmed).retain(|lease| lease.provider_lease_id != id);
            Ok(())
        })
    }

    fn realize_workspace(&self, params: &LeaseParams) -> HookResult<Workspace> {
        self.call_now(Hook::RealizeWorkspace, params)
    }

    /// An `execute` with its own timeout gets that timeout plus a minute as
    /// its deadline when that is longer than the usual one.
    fn execute(
        &self,
        params: ExecuteParams,
        stdin: ByteSource,
        output: ByteSink,
    ) -> HookFuture<ExecuteResult> {
        let timeout = params.timeout_ms.into_option().map(Duration::from_millis);
        let deadline = timeout.map_or(Duration::ZERO, |timeout| timeout + Duration::from_secs(60));
        let io = CallIo { output: Some(output), stdin: Some(stdin), deadline, ..CallIo::default() };
        self.call_later(Hook::Execute, params, io)
    }

    fn inspect_lease(&self, params: LeaseParams) -> HookFuture<LeaseStatus> {
        self.call_later(Hook::InspectLease, params, CallIo::default())
    }

    fn sync_files(&self, params: SyncParams) -> HookFuture<SyncResult> {
        self.call_later(Hook::SyncFiles, params, CallIo::default())
    }

    /// Hands the lease to the main worker, and to every main worker started
    /// later until the lease is destroyed.
    fn import_unconfirmed(&self, params: &LeaseParams) -> HookResult<()> {
        if self.supports(Hook::ImportUnconfirmed) {
            let mut unconfirmed = lock(&self.inner.unconfirmed);
            unconfirmed.retain(|lease| lease.provider_lease_id != params.provider_lease_id);
            unconfirmed.push(params.clone());
        }
        self.call_now(Hook::ImportUnconfirmed, params)
    }
}
