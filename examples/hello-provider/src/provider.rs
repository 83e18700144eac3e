//! The [`Provider`] implementation: every hook of ABI 2.0.
//!
//! Hooks may run on many threads at once; all shared state is behind
//! [`HelloProvider`]'s `Arc`s, so a hook's future can own a clone of it.
//! The hooks that talk to "the service" (here: the lease directories and
//! local processes) return a future; this provider has no async runtime, so
//! each writes a blocking body and wraps it with [`blocking`], which runs it
//! on a thread of its own. The cheap local hooks are plain calls.
//!
//! Panics: the export layer turns a panic in a hook, or in its future, into
//! an `internal` error (never build a provider with `panic = "abort"`: that
//! would take the host down), and so does `blocking` for its body; a panic
//! on a thread the provider started itself is the provider's to handle:
//! here those threads only move bytes and cannot panic.

use crate::{
    config::{Config, SCHEMA},
    lease::{unconfirmed, LeaseDir, Leases},
    process::{self, Event, GRACE, KILL_BOUND},
    sync,
};
use provider_abi::{
    abi_stable::std_types::RString, blocking, ready, AcquireParams, ByteSink, ByteSource, CreationRecorder,
    EnvironmentParams, ErrorKind, ExecuteParams, ExecuteResult, HealthReport, HookFuture, HookResult, Lease,
    LeaseParams, LeaseStatus, LogField, LogLevel, LogRecord, LogSink, Manifest, PostUploadCommand,
    ProbeReport, Provider, ProviderError, ReleaseReport, SetupParams, SyncDirection, SyncOperationResult,
    SyncParams, SyncResult, ValidationReport, Workspace, ABI_VERSION,
};
use scopeguard::ScopeGuard;
use std::{
    io,
    path::{Path, PathBuf},
    process::Command,
    sync::{
        atomic::{AtomicU32, Ordering},
        mpsc::{self, Sender},
        Arc, OnceLock,
    },
    time::Duration,
};

/// The template provider. `Default` is how the export layer creates it;
/// `Clone` is cheap (every field is shared), so a hook's future owns a clone.
#[derive(Default, Clone)]
pub struct HelloProvider {
    leases: Arc<Leases>,
    /// The host's log sink and the most verbose level it wants (`setup`).
    logs: Arc<OnceLock<(LogSink, LogLevel)>>,
    /// The share of the request budget granted (ppm); 0 before any grant.
    share: Arc<AtomicU32>,
}

/// A local filesystem failure, reported as the "service" refusing the
/// operation (kind `api`, no HTTP status, a fixed operation label). Messages
/// are one line and never echo configuration values that could be secret.
fn io_error(operation: &str, error: io::Error) -> ProviderError {
    ProviderError::new(ErrorKind::API, format!("Hello {operation} failed: {error}."))
        .with_http(None, Some(operation))
}

/// An `invalid_input` error: a hook argument the provider refuses.
pub(crate) fn invalid(message: String) -> ProviderError {
    ProviderError::new(ErrorKind::INVALID_INPUT, message)
}

/// `result`, a deletion's, with "not found" counting as done: deleting is
/// idempotent.
fn gone(result: io::Result<()>) -> io::Result<()> {
    match result {
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(()),
        done => done,
    }
}

fn exists(path: &Path) -> HookResult<bool> {
    path.try_exists().map_err(|error| io_error("lease lookup", error))
}

impl HelloProvider {
    /// Parses the configuration and checks the lease record: the first thing
    /// every lease hook does, before it touches anything.
    fn open(&self, params: &LeaseParams) -> HookResult<(Config, LeaseDir)> {
        let config = Config::for_hook(&params.env.config_json)?;
        let lease = LeaseDir::open(params, &config)?;
        Ok((config, lease))
    }

    /// Sends one event to the host's log sink, if it wants its level. Only
    /// ids go in fields: never configuration values (they may be secret).
    fn log(&self, level: LogLevel, message: &str, lease: &str) {
        let Some((sink, max_level)) = self.logs.get() else { return };
        if level <= *max_level {
            let fields = [LogField { name: "lease".into(), value: lease.into() }];
            sink.log(&LogRecord::new(level, module_path!(), message, &fields));
        }
    }

    /// Marks a lease's cleanup unconfirmed and says so.
    fn mark_unconfirmed(&self, lease: &str) -> ProviderError {
        self.leases.mark_unconfirmed(lease);
        self.log(LogLevel::Warn, "Hello lease cleanup is unconfirmed; only destroy may follow.", lease);
        unconfirmed()
    }

    /// Deletes the lease directory. Gone already is success: destroy must be
    /// idempotent. Clears the unconfirmed flag only once it is really gone.
    fn delete(&self, lease: &LeaseDir) -> HookResult<()> {
        gone(std::fs::remove_dir_all(&lease.dir)).map_err(|error| io_error("lease deletion", error))?;
        self.leases.clear_unconfirmed(&lease.id);
        Ok(())
    }

    /// Starts closing a lease: refuses a second release or destroy running at
    /// the same time, then cancels the lease's commands and waits for them.
    fn close(&self, lease: &LeaseDir) -> HookResult<impl Sized + '_> {
        let closing = self.leases.begin_closing(&lease.id)?;
        // Bounded: a command that cannot be stopped leaves the lease
        // unconfirmed rather than blocking the release forever.
        self.leases.cancel_and_wait(Some(&lease.id), GRACE + KILL_BOUND + KILL_BOUND);
        Ok(closing)
    }

    /// Creates the lease directory, before the host has recorded it, and
    /// hands back a guard that deletes it when dropped: dropped before
    /// [`ScopeGuard::into_inner`] (the host dropped the hook's future,
    /// cancelling the acquire), nothing is left that the host does not know of.
    fn create(config: &Config, lease: &LeaseDir) -> HookResult<ScopeGuard<PathBuf, impl FnOnce(PathBuf)>> {
        std::fs::create_dir_all(&config.root).map_err(|error| io_error("lease creation", error))?;
        std::fs::create_dir(&lease.dir).map_err(|error| io_error("lease creation", error))?;
        Ok(scopeguard::guard(lease.dir.clone(), |dir| drop(std::fs::remove_dir_all(dir))))
    }

    /// The workspace of a lease that commands may use now: it exists and is
    /// not released.
    fn usable_workspace(&self, lease: &LeaseDir) -> HookResult<PathBuf> {
        self.leases.check_usable(&lease.id)?;
        let workspace = lease.workspace();
        if !exists(&workspace)? {
            return Err(invalid("The lease no longer exists; acquire a new one.".into()));
        }
        if exists(&lease.released_marker())? {
            return Err(invalid("The lease is released; resume it before running commands.".into()));
        }
        Ok(workspace)
    }

    /// Checks every argument of a command before anything runs, and builds
    /// it: the lease it runs in, the local command (program, arguments,
    /// working directory, environment) and its deadline.
    fn prepare(&self, params: &ExecuteParams) -> HookResult<(LeaseDir, Command, Duration)> {
        let (config, lease) = self.open(&params.lease)?;
        let mut command = Command::new(params.command.as_str());
        command.args(params.args.iter().map(RString::as_str));
        for var in &params.env {
            let name = var.name.as_str();
            let valid = name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !valid {
                return Err(invalid(format!("Invalid environment variable name {name:?}.")));
            }
            command.env(name, var.value.as_str());
        }
        let workspace = self.usable_workspace(&lease)?;
        // A relative working directory is taken from the workspace.
        command.current_dir(match params.cwd.as_ref().into_option() {
            None => workspace,
            Some(cwd) => sync::in_workspace(&workspace, cwd)?,
        });
        let timeout = Duration::from_millis(params.timeout_ms.into_option().unwrap_or(config.timeout_ms));
        Ok((lease, command, timeout))
    }

    /// Runs a checked command to its end on the calling thread (one that
    /// may block), registered with its lease so that a release, a destroy,
    /// a shutdown or `cancel` stops it.
    fn run(
        &self,
        (lease, mut command, timeout): (LeaseDir, Command, Duration),
        stdin: ByteSource,
        output: &mut ByteSink,
        cancel: (Sender<Event>, mpsc::Receiver<Event>),
    ) -> HookResult<ExecuteResult> {
        let (sender, events) = cancel;
        let _running = self.leases.start_command(&lease.id, sender.clone())?;
        let outcome = process::run(&mut command, timeout, stdin, sender, &events, output)
            .map_err(|error| invalid(format!("Cannot start {:?}: {error}.", command.get_program())))?;
        if !outcome.cleanup_confirmed {
            // We cannot prove the command's processes are gone: the lease may
            // only be destroyed from now on.
            return Err(self.mark_unconfirmed(&lease.id));
        }
        outcome.result.ok_or_else(|| ProviderError::new(ErrorKind::CANCELLED, "Hello command was cancelled."))
    }

    fn resume(&self, params: &LeaseParams) -> HookResult<Lease> {
        let (_, lease) = self.open(params)?;
        // The release rule: a lease whose cleanup is unconfirmed is never
        // handed out for reuse (nor one that is being released right now).
        self.leases.check_usable(&lease.id)?;
        // Gone: expired, not an error (and no id). The host acquires a new lease.
        let expired = !exists(&lease.workspace())?;
        if !expired {
            gone(std::fs::remove_file(lease.released_marker()))
                .map_err(|error| io_error("lease resume", error))?;
        }
        Ok(Lease {
            provider_lease_id: if expired { None.into() } else { params.provider_lease_id.clone() },
            metadata_json: params.metadata_json.clone(),
            expires_at: None.into(),
            expired,
        })
    }

    fn release(&self, params: &LeaseParams) -> HookResult<ReleaseReport> {
        let (config, lease) = self.open(params)?;
        let _closing = self.close(&lease)?;
        if !config.reuse_lease {
            self.delete(&lease)?;
            return Ok(ReleaseReport { kept: false });
        }
        if self.leases.is_unconfirmed(&lease.id) {
            return Err(unconfirmed());
        }
        if !exists(&lease.workspace())? {
            // Already gone: nothing to keep, and the host must not resume it.
            return Ok(ReleaseReport { kept: false });
        }
        std::fs::write(lease.released_marker(), b"").map_err(|error| io_error("lease release", error))?;
        Ok(ReleaseReport { kept: true })
    }

    fn destroy(&self, params: &LeaseParams) -> HookResult<()> {
        let (_, lease) = self.open(params)?;
        let _closing = self.close(&lease)?;
        // The only way to clear an unconfirmed lease.
        self.delete(&lease)
    }

    fn inspect(&self, params: &LeaseParams) -> HookResult<LeaseStatus> {
        let (_, lease) = self.open(params)?;
        let exists = exists(&lease.workspace())?;
        let state = match exists {
            false => "",
            true if lease.released_marker().exists() => "released",
            true => "ready",
        };
        Ok(LeaseStatus { exists, state: state.into(), unconfirmed: self.leases.is_unconfirmed(&lease.id) })
    }

    fn sync(&self, params: &SyncParams) -> HookResult<SyncResult> {
        let (_, lease) = self.open(&params.lease)?;
        let workspace = self.usable_workspace(&lease)?;
        // Every mapping is checked before the first byte moves.
        let plan = sync::plan(params, &workspace)?;
        let mut results = Vec::with_capacity(plan.len());
        for (operation, copies) in params.operations.iter().zip(&plan) {
            let mut result = SyncOperationResult { id: operation.id.clone(), ..Default::default() };
            for copy in copies {
                sync::copy(copy, &mut result).map_err(|error| io_error("file sync", error))?;
            }
            if params.direction == SyncDirection::In {
                for command in &operation.post_upload_commands {
                    self.post_upload(&params.lease, command)?;
                }
            }
            results.push(result);
        }
        Ok(SyncResult { operations: results.into() })
    }

    /// Runs one post-upload command (`/bin/sh -c`) in the lease, checked
    /// as an `execute` of it is; anything but exit code 0 fails the sync.
    fn post_upload(&self, lease: &LeaseParams, command: &PostUploadCommand) -> HookResult<()> {
        let command = self.prepare(&ExecuteParams {
            lease: lease.clone(),
            command: "/bin/sh".into(),
            args: vec!["-c".into(), command.command.clone()].into(),
            cwd: command.cwd.clone(),
            timeout_ms: command.timeout_ms,
            ..Default::default()
        })?;
        let ran = self.run(command, ByteSource::empty(), &mut ByteSink::discard(), mpsc::channel())?;
        let message = match ran.exit_code.into_option() {
            Some(0) => return Ok(()),
            Some(code) => format!("Hello post-upload command failed with exit code {code}."),
            None => "Hello post-upload command failed (timed out or killed).".to_owned(),
        };
        Err(ProviderError::new(ErrorKind::API, message).with_http(None, Some("post-upload command")))
    }
}

impl Provider for HelloProvider {
    fn manifest(&self) -> Manifest {
        Manifest {
            id: "hello".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            display_name: "Hello (local directories)".into(),
            driver_key: "hello".into(),
            // The host reports the ABI version and the hooks from the
            // library's exported table, whatever these say.
            abi_version: ABI_VERSION,
            hooks: Default::default(),
            config_schema_json: SCHEMA.into(),
        }
    }

    fn setup(&self, params: &SetupParams, logs: LogSink, max_level: LogLevel) -> HookResult<()> {
        // Kept for the rest of the process: this provider's log events go to
        // the host's subscriber (its own `tracing` globals stay inside the
        // library). Called once; a second sink is ignored.
        let _ = self.logs.set((logs, max_level));
        self.log(LogLevel::Info, "Hello provider set up.", params.host_name.as_str());
        Ok(())
    }

    fn shutdown(&self) -> HookResult<()> {
        // Cancel work in flight: the host is about to stop calling us.
        self.leases.cancel_and_wait(None, GRACE + KILL_BOUND + KILL_BOUND);
        Ok(())
    }

    fn health(&self) -> HookResult<HealthReport> {
        // Cheap and local: health never sends a request.
        let message = match self.share.load(Ordering::Relaxed) {
            0 => "Hello provider loaded.".to_owned(),
            share => format!("Hello provider loaded; request share {share} ppm."),
        };
        Ok(HealthReport { status: "ok".into(), message: message.into() })
    }

    fn validate_config(&self, params: &EnvironmentParams) -> HookResult<ValidationReport> {
        // Problems with the configuration are a *report*, not an error: the
        // hook worked. It sends nothing and touches nothing.
        Ok(Config::parse(&params.config_json).1)
    }

    fn probe(&self, params: EnvironmentParams, recorder: CreationRecorder) -> HookFuture<ProbeReport> {
        let this = self.clone();
        Box::pin(async move {
            let acquire = AcquireParams { env: params.clone(), run_id: "probe".into(), ..Default::default() };
            // The probe's lease is created like any other: through the
            // host's recorder, both moments.
            let lease = this.acquire_lease(acquire, recorder).await?;
            let lease_params = LeaseParams::new(params, "probe", &lease);
            let command = ExecuteParams {
                lease: lease_params.clone(),
                command: "/bin/echo".into(),
                args: vec!["hello-provider-ready".into()].into(),
                ..Default::default()
            };
            let ran = this.execute(command, ByteSource::empty(), ByteSink::discard()).await;
            // Always delete the probe's lease; a failed delete is reported.
            this.destroy_lease(lease_params).await?;
            let ok = ran.as_ref().is_ok_and(|result| result.stdout.trim() == "hello-provider-ready");
            let message = match &ran {
                Ok(_) if ok => "Hello provider ran a command in a fresh lease.".to_owned(),
                Ok(result) => {
                    format!("The probe command printed something else: {:?}.", result.stdout.trim())
                }
                Err(error) => format!("The probe command failed: {error}"),
            };
            Ok(ProbeReport { ok, message: message.into(), metadata_json: "{}".into() })
        })
    }

    fn acquire_lease(&self, params: AcquireParams, mut recorder: CreationRecorder) -> HookFuture<Lease> {
        let this = self.clone();
        Box::pin(async move {
            // Everything that can be refused is refused before anything
            // exists (and before the host hears that a request leaves).
            let config = Config::for_hook(&params.env.config_json)?;
            if params.requested_expires_at.is_some() {
                return Err(invalid(
                    "Hello leases have no guaranteed expiry; requestedExpiresAt is not supported.".into(),
                ));
            }
            // Write-ahead, first moment: the creation request is about to
            // leave. A provider that paces its requests awaits its pacer
            // *before* this: until the request leaves nothing can exist
            // remotely, and the host would otherwise search for a resource
            // that never was. If the host cannot make this durable, send
            // nothing and fail with its error.
            recorder.sending().await?;
            let lease = LeaseDir::new(&config);
            let record = Lease {
                provider_lease_id: Some(lease.id.as_str().into()).into(),
                metadata_json: lease.metadata(&params.env, &config).into(),
                expires_at: None.into(),
                expired: false,
            };
            // The "creation request". Cancellation: if the host drops this
            // future from here on, the unrecorded lease is deleted, whether
            // `blocking` still holds it (its answer is dropped unread) or
            // this future does.
            let created = blocking({
                let (config, lease) = (config.clone(), lease.clone());
                move || Self::create(&config, &lease)
            })
            .await?;
            // Write-ahead, second moment: the reply names the lease; the host
            // records it before we go on. If the host cannot, delete what we
            // made and fail with the host's error; if even that fails, say
            // the cleanup is unconfirmed (naming the lease).
            if let Err(refused) = recorder.record(&record).await {
                return match gone(std::fs::remove_dir_all(ScopeGuard::into_inner(created))) {
                    Ok(()) => Err(refused),
                    Err(_) => Err(ProviderError::new(
                        ErrorKind::CLEANUP_UNCONFIRMED,
                        format!(
                            "Hello lease {} was not recorded and could not be deleted; cleanup is unconfirmed.",
                            lease.id
                        ),
                    )),
                };
            }
            ScopeGuard::into_inner(created);
            // A failure after the record: the host knows the lease, so
            // delete it as a destroy would.
            if let Err(error) = std::fs::create_dir(lease.workspace()) {
                let _ = this.delete(&lease);
                return Err(io_error("lease creation", error));
            }
            Ok(record)
        })
    }

    fn resume_lease(&self, params: LeaseParams) -> HookFuture<Lease> {
        let this = self.clone();
        blocking(move || this.resume(&params))
    }

    fn release_lease(&self, params: LeaseParams) -> HookFuture<ReleaseReport> {
        // Dropping the future does not stop a release under way: it runs to
        // its end (a half-done release would leave the lease in between).
        let this = self.clone();
        blocking(move || this.release(&params))
    }

    fn destroy_lease(&self, params: LeaseParams) -> HookFuture<()> {
        let this = self.clone();
        blocking(move || this.destroy(&params))
    }

    fn realize_workspace(&self, params: &LeaseParams) -> HookResult<Workspace> {
        let (_, lease) = self.open(params)?;
        Ok(Workspace {
            cwd: lease.workspace().to_string_lossy().into_owned().into(),
            metadata_json: "{}".into(),
        })
    }

    fn execute(
        &self,
        params: ExecuteParams,
        stdin: ByteSource,
        mut output: ByteSink,
    ) -> HookFuture<ExecuteResult> {
        // Every argument is checked now, before anything runs.
        let command = match self.prepare(&params) {
            Ok(command) => command,
            Err(error) => return ready(Err(error)),
        };
        let (sender, events) = mpsc::channel();
        // Cancellation: dropping the future stops the command, as a release
        // would (the command's thread reads the cancel like a release's; sent
        // after the command ended, where nobody listens any more, it is
        // harmless). The command runs on `blocking`'s thread, which owns the
        // sink (one thread writes to it) and hands `stdin` to the thread
        // that may block reading it.
        let cancel = scopeguard::guard(sender.clone(), |sender| drop(sender.send(Event::Cancel)));
        let this = self.clone();
        let ran = blocking(move || this.run(command, stdin, &mut output, (sender, events)));
        Box::pin(async move {
            let _cancel = cancel;
            ran.await
        })
    }

    fn inspect_lease(&self, params: LeaseParams) -> HookFuture<LeaseStatus> {
        let this = self.clone();
        blocking(move || this.inspect(&params))
    }

    fn sync_files(&self, params: SyncParams) -> HookFuture<SyncResult> {
        let this = self.clone();
        blocking(move || this.sync(&params))
    }

    fn import_unconfirmed(&self, params: &LeaseParams) -> HookResult<()> {
        // Another version of this provider could not confirm the lease's
        // cleanup: refuse to reuse it until it is destroyed. Sends nothing.
        let (_, lease) = self.open(params)?;
        self.leases.mark_unconfirmed(&lease.id);
        Ok(())
    }

    fn grant_request_share(&self, parts_per_million: u32) -> HookResult<()> {
        // This provider sends no requests to a shared account, so the share
        // only shows in `health`. A provider with a request budget scales it
        // here: a lower share at once, a higher one no sooner than the other
        // hosts' requests stop counting. Sends nothing.
        if parts_per_million > 1_000_000 {
            return Err(invalid(format!("A request share is at most 1000000 ppm, not {parts_per_million}.")));
        }
        self.share.store(parts_per_million, Ordering::Relaxed);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use provider_abi::RecordCreation;

    struct Bed {
        provider: HelloProvider,
        env: EnvironmentParams,
        _root: tempfile::TempDir,
    }

    /// Refuses the lease record (the host's ledger is full), keeping its id.
    struct Refuse(Arc<std::sync::Mutex<Option<String>>>);

    impl RecordCreation for Refuse {
        fn sending(&mut self) -> HookFuture<()> {
            ready(Ok(()))
        }

        fn created(&mut self, lease: &Lease) -> HookFuture<()> {
            *self.0.lock().unwrap() = lease.provider_lease_id.as_ref().map(|id| id.to_string()).into_option();
            ready(Err(ProviderError::internal("ledger is full")))
        }
    }

    impl Bed {
        fn new(reuse: bool) -> Bed {
            let root = tempfile::tempdir().unwrap();
            let config = serde_json::json!({"root": root.path().join("leases"), "reuseLease": reuse});
            let env = EnvironmentParams {
                driver_key: "hello".into(),
                company_id: "acme".into(),
                environment_id: "dev".into(),
                config_json: config.to_string().into(),
                ..Default::default()
            };
            Bed { provider: HelloProvider::default(), env, _root: root }
        }

        fn acquire_params(&self, expires: Option<&str>) -> AcquireParams {
            AcquireParams {
                env: self.env.clone(),
                run_id: "t".into(),
                requested_expires_at: expires.map(Into::into).into(),
            }
        }

        fn acquire(&self) -> LeaseParams {
            let lease = pollster::block_on(
                self.provider.acquire_lease(self.acquire_params(None), CreationRecorder::discard()),
            )
            .unwrap();
            LeaseParams {
                env: self.env.clone(),
                run_id: "t".into(),
                provider_lease_id: lease.provider_lease_id,
                metadata_json: lease.metadata_json,
            }
        }

        fn execute(&self, params: ExecuteParams, stdin: ByteSource) -> HookResult<ExecuteResult> {
            pollster::block_on(self.provider.execute(params, stdin, ByteSink::discard()))
        }

        fn run(&self, lease: &LeaseParams, script: &str) -> HookResult<ExecuteResult> {
            let params = ExecuteParams {
                lease: lease.clone(),
                command: "/bin/sh".into(),
                args: vec!["-c".into(), script.into()].into(),
                ..Default::default()
            };
            self.execute(params, ByteSource::empty())
        }

        fn lease_dir(&self, lease: &LeaseParams) -> PathBuf {
            let config = Config::for_hook(&self.env.config_json).unwrap();
            LeaseDir::open(lease, &config).unwrap().dir
        }
    }

    #[test]
    fn a_lease_whose_cleanup_is_unconfirmed_is_never_handed_out_for_reuse() {
        let bed = Bed::new(true);
        let lease = bed.acquire();
        bed.provider.import_unconfirmed(&lease).unwrap();
        let refused = [
            pollster::block_on(bed.provider.release_lease(lease.clone())).map(|_| ()).unwrap_err(),
            pollster::block_on(bed.provider.resume_lease(lease.clone())).map(|_| ()).unwrap_err(),
            bed.run(&lease, "true").map(|_| ()).unwrap_err(),
        ];
        for error in refused {
            assert_eq!(error.kind, ErrorKind::CLEANUP_UNCONFIRMED, "{error:?}");
            assert_eq!(error.message.as_str(), crate::lease::UNCONFIRMED);
        }
        assert!(pollster::block_on(bed.provider.inspect_lease(lease.clone())).unwrap().unconfirmed);
        // Destroy is the only way out, and it clears the mark.
        pollster::block_on(bed.provider.destroy_lease(lease.clone())).unwrap();
        assert!(!bed.lease_dir(&lease).exists());
        assert!(!pollster::block_on(bed.provider.inspect_lease(lease)).unwrap().unconfirmed);
    }

    #[test]
    fn without_reuse_a_release_deletes_the_lease_and_says_so() {
        let bed = Bed::new(false);
        let lease = bed.acquire();
        let report = pollster::block_on(bed.provider.release_lease(lease.clone())).unwrap();
        assert_eq!(report, ReleaseReport { kept: false });
        assert!(!bed.lease_dir(&lease).exists());
        assert!(pollster::block_on(bed.provider.resume_lease(lease)).unwrap().expired);
    }

    #[test]
    fn a_lease_the_host_could_not_record_is_deleted_and_the_hosts_error_returned() {
        let bed = Bed::new(true);
        let created = Arc::new(std::sync::Mutex::new(None));
        let recorder = CreationRecorder::new(Refuse(Arc::clone(&created)));
        let error =
            pollster::block_on(bed.provider.acquire_lease(bed.acquire_params(None), recorder)).unwrap_err();
        assert_eq!(error.message.as_str(), "ledger is full");
        let config = Config::for_hook(&bed.env.config_json).unwrap();
        let created = created.lock().unwrap().clone().expect("recorded before returning");
        assert!(!config.root.join(created).exists());
    }

    #[test]
    fn an_expiry_is_refused_before_anything_is_created_or_announced() {
        let bed = Bed::new(true);
        let announced = Arc::new(std::sync::Mutex::new(None));
        let recorder = CreationRecorder::new(Refuse(Arc::clone(&announced)));
        let expiring = bed.acquire_params(Some("2030-01-01T00:00:00Z"));
        let error = pollster::block_on(bed.provider.acquire_lease(expiring, recorder)).unwrap_err();
        assert_eq!(error.kind, ErrorKind::INVALID_INPUT);
        let config = Config::for_hook(&bed.env.config_json).unwrap();
        assert!(!config.root.exists(), "nothing was created");
    }

    #[test]
    fn execute_reports_exit_codes_signals_and_standard_input() {
        let bed = Bed::new(true);
        let lease = bed.acquire();
        let result = bed.run(&lease, "printf out; printf err >&2; exit 5").unwrap();
        assert_eq!(
            (result.exit_code.into_option(), result.stdout.as_str(), result.stderr.as_str()),
            (Some(5), "out", "err")
        );
        let killed = bed.run(&lease, "kill -9 $$").unwrap();
        assert_eq!(
            (killed.exit_code.into_option(), killed.signal.as_ref().map(|s| s.as_str()).into_option()),
            (None, Some("SIGKILL"))
        );
        let cat = ExecuteParams { lease: lease.clone(), command: "/bin/cat".into(), ..Default::default() };
        let fed = bed.execute(cat.clone(), ByteSource::from_bytes(b"fed".to_vec())).unwrap();
        assert_eq!(fed.stdout.as_str(), "fed");
        let bad_env = ExecuteParams {
            env: vec![provider_abi::EnvVar { name: "1BAD".into(), value: "x".into() }].into(),
            ..cat
        };
        assert_eq!(bed.execute(bad_env, ByteSource::empty()).unwrap_err().kind, ErrorKind::INVALID_INPUT);
        pollster::block_on(bed.provider.destroy_lease(lease)).unwrap();
    }

    /// Tells, by being dropped, that the command's thread let go of the sink.
    struct Ended(Sender<()>);

    impl Drop for Ended {
        fn drop(&mut self) {
            let _ = self.0.send(());
        }
    }

    #[test]
    fn dropping_an_execute_stops_its_command() {
        let bed = Bed::new(true);
        let lease = bed.acquire();
        let params = ExecuteParams {
            lease: lease.clone(),
            command: "/bin/sh".into(),
            args: vec!["-c".into(), "echo started; exec sleep 86400".into()].into(),
            // Without the cancel, the command would run for a day.
            timeout_ms: Some(86_400_000).into(),
            ..Default::default()
        };
        let (started, wait_started) = mpsc::channel();
        let (ended, wait_ended) = mpsc::channel();
        let ended = Ended(ended);
        let sink = ByteSink::new(move |_, _: &[u8]| {
            let _ = (&ended, started.send(()));
        });
        let running = bed.provider.execute(params, ByteSource::empty(), sink);
        // The command runs without being polled; once it printed, cancel it.
        wait_started.recv().unwrap();
        drop(running);
        // The command's thread drops the sink once the command has ended.
        wait_ended.recv().unwrap();
        assert!(!pollster::block_on(bed.provider.inspect_lease(lease.clone())).unwrap().unconfirmed);
        pollster::block_on(bed.provider.destroy_lease(lease)).unwrap();
    }

    #[test]
    fn sync_copies_into_and_out_of_the_workspace_and_runs_post_upload_commands() {
        let bed = Bed::new(true);
        let lease = bed.acquire();
        let host = tempfile::tempdir().unwrap();
        std::fs::write(host.path().join("in.txt"), b"hello").unwrap();
        let source = host.path().join("in.txt");
        let mut inbound = SyncParams::single(
            lease.clone(),
            SyncDirection::In,
            "in",
            "file",
            source.to_str().unwrap(),
            "a/in.txt",
        );
        inbound.operations[0].post_upload_commands = vec![provider_abi::PostUploadCommand {
            command: "test -f a/in.txt".into(),
            ..Default::default()
        }]
        .into();
        let result = pollster::block_on(bed.provider.sync_files(inbound.clone())).unwrap();
        assert_eq!((result.operations[0].files_transferred, result.operations[0].bytes_transferred), (1, 5));
        let out = host.path().join("out.txt");
        let outbound = SyncParams::single(
            lease.clone(),
            SyncDirection::Out,
            "out",
            "file",
            "a/in.txt",
            out.to_str().unwrap(),
        );
        pollster::block_on(bed.provider.sync_files(outbound)).unwrap();
        assert_eq!(std::fs::read(&out).unwrap(), b"hello");
        inbound.operations[0].post_upload_commands[0].command = "exit 3".into();
        let failed = pollster::block_on(bed.provider.sync_files(inbound)).unwrap_err();
        assert_eq!(failed.message.as_str(), "Hello post-upload command failed with exit code 3.");
        pollster::block_on(bed.provider.destroy_lease(lease)).unwrap();
    }
}
