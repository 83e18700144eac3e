//! The [`Provider`] implementation: every hook of ABI 1.2.
//!
//! Hooks block the host's calling thread and may run on many threads at
//! once; all shared state is in [`Leases`]. Panics: the export layer turns a
//! panic in a hook into an `internal` error (never build a provider with
//! `panic = "abort"`: that would take the host down), but a panic on a thread
//! the provider started itself is the provider's to handle; here those
//! threads only move bytes and cannot panic.

use crate::{
    config::{Config, SCHEMA},
    lease::{LeaseDir, Leases},
    process::{self, Ended, Spec, GRACE, KILL_BOUND},
};
use provider_abi::{
    AcquireParams, CreationRecorder, EnvironmentParams, ErrorKind, ExecuteParams, ExecuteResult,
    HealthReport, Hook, HookResult, Lease, LeaseParams, LeaseStatus, Manifest, OutputSink, ProbeReport,
    Provider, ProviderError, ReleaseReport, ValidationReport, Workspace, ABI_1_2,
};
use std::{io, path::Path, sync::mpsc, time::Duration};

/// The ABI version whose hooks this provider implements, and exports.
pub const ABI: provider_abi::AbiVersion = ABI_1_2;

/// The template provider. `Default` is how the export layer creates it.
#[derive(Default)]
pub struct HelloProvider {
    leases: Leases,
}

/// A local filesystem failure, reported as the "service" refusing the
/// operation (kind `api`, no HTTP status, a fixed operation label). Messages
/// are one line and never echo configuration values that could be secret.
fn io_error(operation: &str, error: io::Error) -> ProviderError {
    ProviderError::new(ErrorKind::API, format!("Hello {operation} failed: {error}."))
        .with_http(None, Some(operation))
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

    /// Deletes the lease directory. Gone already is success: destroy must be
    /// idempotent. Clears the unconfirmed flag only once it is really gone.
    fn delete(&self, lease: &LeaseDir) -> HookResult<()> {
        match std::fs::remove_dir_all(&lease.dir) {
            Ok(()) => {}
            Err(error) if error.kind() == io::ErrorKind::NotFound => {}
            Err(error) => return Err(io_error("lease deletion", error)),
        }
        self.leases.clear_unconfirmed(&lease.id);
        Ok(())
    }

    /// Starts closing a lease: refuses a second release or destroy running at
    /// the same time, then cancels the lease's commands and waits for them.
    fn close(&self, lease: &LeaseDir) -> HookResult<crate::lease::ClosingGuard<'_>> {
        let closing = self.leases.begin_closing(&lease.id)?;
        // Bounded: a command that cannot be stopped leaves the lease
        // unconfirmed rather than blocking the release forever.
        self.leases.cancel_and_wait(Some(&lease.id), GRACE + KILL_BOUND + KILL_BOUND);
        Ok(closing)
    }
}

impl Provider for HelloProvider {
    fn manifest(&self) -> Manifest {
        Manifest {
            id: "hello".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            display_name: "Hello (local directories)".into(),
            driver_key: "hello".into(),
            // A host reports the ABI the library exports, whatever this says.
            abi_version: ABI,
            hooks: Hook::available_at(ABI).map(|hook| hook.name().into()).collect(),
            config_schema_json: SCHEMA.into(),
        }
    }

    fn shutdown(&self) -> HookResult<()> {
        // Cancel work in flight: the host is about to stop calling us.
        self.leases.cancel_and_wait(None, GRACE + KILL_BOUND + KILL_BOUND);
        Ok(())
    }

    fn health(&self) -> HookResult<HealthReport> {
        // Cheap and local: health never sends a request.
        Ok(HealthReport { status: "ok".into(), message: "Hello provider loaded.".into() })
    }

    fn validate_config(&self, params: &EnvironmentParams) -> HookResult<ValidationReport> {
        // Problems with the configuration are a *report*, not an error: the
        // hook worked. It sends nothing and touches nothing.
        Ok(match Config::parse(&params.config_json) {
            Ok((config, warnings)) => ValidationReport {
                ok: true,
                normalized_config_json: Some(config.normalized().to_string().into()).into(),
                errors: Default::default(),
                warnings: warnings.into_iter().map(Into::into).collect(),
            },
            Err(problems) => ValidationReport {
                ok: false,
                normalized_config_json: None.into(),
                errors: problems.errors.into_iter().map(Into::into).collect(),
                warnings: problems.warnings.into_iter().map(Into::into).collect(),
            },
        })
    }

    fn probe(&self, params: &EnvironmentParams) -> HookResult<ProbeReport> {
        self.probe_recording(params, &mut CreationRecorder::discard())
    }

    fn probe_recording(
        &self,
        params: &EnvironmentParams,
        recorder: &mut CreationRecorder<'_>,
    ) -> HookResult<ProbeReport> {
        let acquire =
            AcquireParams { env: params.clone(), run_id: "probe".into(), requested_expires_at: None.into() };
        let lease = self.acquire_lease_recording(&acquire, recorder)?;
        let lease_params = LeaseParams {
            env: params.clone(),
            run_id: "probe".into(),
            provider_lease_id: lease.provider_lease_id,
            metadata_json: lease.metadata_json,
        };
        let mut ignore = |_: provider_abi::OutputStream, _: &str| {};
        let ran = self.execute(
            &ExecuteParams {
                lease: lease_params.clone(),
                command: "/bin/echo".into(),
                args: vec!["hello-provider-ready".into()].into(),
                ..Default::default()
            },
            &mut OutputSink::new(&mut ignore),
        );
        // Always delete the probe's lease; a failed delete is reported.
        self.destroy_lease(&lease_params)?;
        let ok = ran.as_ref().is_ok_and(|result| result.stdout.trim() == "hello-provider-ready");
        let message = match &ran {
            Ok(_) if ok => "Hello provider ran a command in a fresh lease.".to_owned(),
            Ok(result) => format!("The probe command printed something else: {:?}.", result.stdout.trim()),
            Err(error) => format!("The probe command failed: {error}"),
        };
        Ok(ProbeReport { ok, message: message.into(), metadata_json: "{}".into() })
    }

    fn acquire_lease(&self, params: &AcquireParams) -> HookResult<Lease> {
        self.acquire_lease_recording(params, &mut CreationRecorder::discard())
    }

    fn acquire_lease_recording(
        &self,
        params: &AcquireParams,
        recorder: &mut CreationRecorder<'_>,
    ) -> HookResult<Lease> {
        let config = Config::for_hook(&params.env.config_json)?;
        if params.requested_expires_at.is_some() {
            // Checked before anything is created.
            return Err(ProviderError::new(
                ErrorKind::INVALID_INPUT,
                "Hello leases have no guaranteed expiry; requestedExpiresAt is not supported.",
            ));
        }
        let lease = LeaseDir::new(&config);
        std::fs::create_dir_all(&config.root).map_err(|error| io_error("lease creation", error))?;
        std::fs::create_dir(&lease.dir).map_err(|error| io_error("lease creation", error))?;
        let record = Lease {
            provider_lease_id: Some(lease.id.as_str().into()).into(),
            metadata_json: lease.metadata(&params.env, &config).into(),
            expires_at: None.into(),
            expired: false,
        };
        // Write-ahead: the resource exists, so the host records it before we
        // go on. If the host cannot, delete what we made and fail with the
        // host's error; if even that fails, say the cleanup is unconfirmed.
        if let Err(refused) = recorder.record(&record) {
            return match std::fs::remove_dir_all(&lease.dir) {
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
        if let Err(error) = std::fs::create_dir(lease.workspace()) {
            let _ = self.delete(&lease);
            return Err(io_error("lease creation", error));
        }
        Ok(record)
    }

    fn resume_lease(&self, params: &LeaseParams) -> HookResult<Lease> {
        let (_, lease) = self.open(params)?;
        // The release rule: a lease whose cleanup is unconfirmed is never
        // handed out for reuse (nor one that is being released right now).
        self.leases.check_usable(&lease.id)?;
        if !exists(&lease.workspace())? {
            // Gone: expired, not an error. The host acquires a new lease.
            return Ok(Lease {
                provider_lease_id: None.into(),
                metadata_json: params.metadata_json.clone(),
                expires_at: None.into(),
                expired: true,
            });
        }
        match std::fs::remove_file(lease.released_marker()) {
            Ok(()) => {}
            Err(error) if error.kind() == io::ErrorKind::NotFound => {}
            Err(error) => return Err(io_error("lease resume", error)),
        }
        Ok(Lease {
            provider_lease_id: params.provider_lease_id.clone(),
            metadata_json: params.metadata_json.clone(),
            expires_at: None.into(),
            expired: false,
        })
    }

    fn release_lease(&self, params: &LeaseParams) -> HookResult<()> {
        self.release_lease_reporting(params).map(|_| ())
    }

    fn release_lease_reporting(&self, params: &LeaseParams) -> HookResult<ReleaseReport> {
        let (config, lease) = self.open(params)?;
        let _closing = self.close(&lease)?;
        if !config.reuse_lease {
            self.delete(&lease)?;
            return Ok(ReleaseReport { kept: false });
        }
        if self.leases.is_unconfirmed(&lease.id) {
            return Err(ProviderError::new(ErrorKind::CLEANUP_UNCONFIRMED, crate::lease::UNCONFIRMED));
        }
        if !exists(&lease.workspace())? {
            // Already gone: nothing to keep, and the host must not resume it.
            return Ok(ReleaseReport { kept: false });
        }
        std::fs::write(lease.released_marker(), b"").map_err(|error| io_error("lease release", error))?;
        Ok(ReleaseReport { kept: true })
    }

    fn destroy_lease(&self, params: &LeaseParams) -> HookResult<()> {
        let (_, lease) = self.open(params)?;
        let _closing = self.close(&lease)?;
        // The only way to clear an unconfirmed lease.
        self.delete(&lease)
    }

    fn realize_workspace(&self, params: &LeaseParams) -> HookResult<Workspace> {
        let (_, lease) = self.open(params)?;
        Ok(Workspace {
            cwd: lease.workspace().to_string_lossy().into_owned().into(),
            metadata_json: "{}".into(),
        })
    }

    fn execute(&self, params: &ExecuteParams, output: &mut OutputSink<'_>) -> HookResult<ExecuteResult> {
        let (config, lease) = self.open(&params.lease)?;
        let invalid = |message: String| ProviderError::new(ErrorKind::INVALID_INPUT, message);
        // Every argument is checked before anything runs.
        let mut env = Vec::with_capacity(params.env.len());
        for var in &params.env {
            let name = var.name.as_str();
            let valid = name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !valid {
                return Err(invalid(format!("Invalid environment variable name {name:?}.")));
            }
            env.push((name.to_owned(), var.value.to_string()));
        }
        let workspace = lease.workspace();
        let cwd = match params.cwd.as_ref().into_option() {
            None => workspace.clone(),
            Some(cwd) if Path::new(cwd.as_str()).starts_with(&workspace) && !cwd.contains("/..") => {
                cwd.as_str().into()
            }
            Some(_) => {
                return Err(invalid("The working directory must lie inside the lease's workspace.".into()))
            }
        };
        if !exists(&workspace)? {
            return Err(invalid("The lease no longer exists; acquire a new one.".into()));
        }
        if exists(&lease.released_marker())? {
            return Err(invalid("The lease is released; resume it before running commands.".into()));
        }
        let timeout = Duration::from_millis(params.timeout_ms.into_option().unwrap_or(config.timeout_ms));
        let (sender, events) = mpsc::channel();
        // Registered before it starts, so a concurrent release cancels it.
        let _running = self.leases.start_command(&lease.id, sender.clone())?;
        let spec = Spec {
            program: params.command.to_string(),
            args: params.args.iter().map(ToString::to_string).collect(),
            cwd,
            env,
            stdin: params.stdin.as_ref().map(|bytes| bytes.to_vec()).into_option(),
            timeout,
        };
        let outcome = process::run(&spec, sender, &events, output)
            .map_err(|error| invalid(format!("Cannot start {:?}: {error}.", spec.program)))?;
        if !outcome.cleanup_confirmed {
            // We cannot prove the command's processes are gone: the lease may
            // only be destroyed from now on.
            self.leases.mark_unconfirmed(&lease.id);
            return Err(ProviderError::new(ErrorKind::CLEANUP_UNCONFIRMED, crate::lease::UNCONFIRMED));
        }
        match outcome.ended {
            Ended::Finished(result) => Ok(result),
            Ended::Cancelled => Err(ProviderError::new(ErrorKind::CANCELLED, "Hello command was cancelled.")),
        }
    }

    fn inspect_lease(&self, params: &LeaseParams) -> HookResult<LeaseStatus> {
        let (_, lease) = self.open(params)?;
        let exists = exists(&lease.workspace())?;
        let state = match (exists, exists && lease.released_marker().exists()) {
            (false, _) => "",
            (true, true) => "released",
            (true, false) => "ready",
        };
        Ok(LeaseStatus { exists, state: state.into(), unconfirmed: self.leases.is_unconfirmed(&lease.id) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use provider_abi::OutputStream;

    struct Bed {
        provider: HelloProvider,
        env: EnvironmentParams,
        _root: tempfile::TempDir,
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
            };
            Bed { provider: HelloProvider::default(), env, _root: root }
        }

        fn acquire(&self) -> LeaseParams {
            let params = AcquireParams {
                env: self.env.clone(),
                run_id: "t".into(),
                requested_expires_at: None.into(),
            };
            let lease = self.provider.acquire_lease(&params).unwrap();
            LeaseParams {
                env: self.env.clone(),
                run_id: "t".into(),
                provider_lease_id: lease.provider_lease_id,
                metadata_json: lease.metadata_json,
            }
        }

        fn run(&self, lease: &LeaseParams, script: &str) -> HookResult<ExecuteResult> {
            let params = ExecuteParams {
                lease: lease.clone(),
                command: "/bin/sh".into(),
                args: vec!["-c".into(), script.into()].into(),
                ..Default::default()
            };
            let mut ignore = |_: OutputStream, _: &str| {};
            self.provider.execute(&params, &mut OutputSink::new(&mut ignore))
        }

        fn lease_dir(&self, lease: &LeaseParams) -> std::path::PathBuf {
            let config = Config::for_hook(&self.env.config_json).unwrap();
            LeaseDir::open(lease, &config).unwrap().dir
        }
    }

    #[test]
    fn a_lease_whose_cleanup_is_unconfirmed_is_never_handed_out_for_reuse() {
        let bed = Bed::new(true);
        let lease = bed.acquire();
        let id = lease.provider_lease_id.as_ref().unwrap().to_string();
        bed.provider.leases.mark_unconfirmed(&id);
        let refused = [
            bed.provider.release_lease_reporting(&lease).map(|_| ()).unwrap_err(),
            bed.provider.resume_lease(&lease).map(|_| ()).unwrap_err(),
            bed.run(&lease, "true").map(|_| ()).unwrap_err(),
        ];
        for error in refused {
            assert_eq!(error.kind, ErrorKind::CLEANUP_UNCONFIRMED, "{error:?}");
            assert_eq!(error.message.as_str(), crate::lease::UNCONFIRMED);
        }
        assert!(bed.provider.inspect_lease(&lease).unwrap().unconfirmed);
        // Destroy is the only way out, and it clears the mark.
        bed.provider.destroy_lease(&lease).unwrap();
        assert!(!bed.lease_dir(&lease).exists());
        assert!(!bed.provider.leases.is_unconfirmed(&id));
    }

    #[test]
    fn without_reuse_a_release_deletes_the_lease_and_says_so() {
        let bed = Bed::new(false);
        let lease = bed.acquire();
        assert_eq!(bed.provider.release_lease_reporting(&lease).unwrap(), ReleaseReport { kept: false });
        assert!(!bed.lease_dir(&lease).exists());
        assert!(bed.provider.resume_lease(&lease).unwrap().expired);
    }

    #[test]
    fn a_lease_the_host_could_not_record_is_deleted_and_the_hosts_error_returned() {
        let bed = Bed::new(true);
        let mut created = None;
        let mut refuse = |lease: &Lease| {
            created = lease.provider_lease_id.as_ref().map(|id| id.to_string()).into_option();
            Err(ProviderError::internal("ledger is full"))
        };
        let params =
            AcquireParams { env: bed.env.clone(), run_id: "t".into(), requested_expires_at: None.into() };
        let error = bed
            .provider
            .acquire_lease_recording(&params, &mut CreationRecorder::new(&mut refuse))
            .unwrap_err();
        assert_eq!(error.message.as_str(), "ledger is full");
        let config = Config::for_hook(&bed.env.config_json).unwrap();
        assert!(!config.root.join(created.expect("recorded before returning")).exists());
    }

    #[test]
    fn an_expiry_is_refused_before_anything_is_created() {
        let bed = Bed::new(true);
        let params = AcquireParams {
            env: bed.env.clone(),
            run_id: "t".into(),
            requested_expires_at: Some("2030-01-01T00:00:00Z".into()).into(),
        };
        assert_eq!(bed.provider.acquire_lease(&params).unwrap_err().kind, ErrorKind::INVALID_INPUT);
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
        let params = ExecuteParams {
            lease: lease.clone(),
            command: "/bin/cat".into(),
            stdin: Some(b"fed".to_vec().into()).into(),
            ..Default::default()
        };
        let mut ignore = |_: OutputStream, _: &str| {};
        assert_eq!(
            bed.provider.execute(&params, &mut OutputSink::new(&mut ignore)).unwrap().stdout.as_str(),
            "fed"
        );
        let bad_env = ExecuteParams {
            env: vec![provider_abi::EnvVar { name: "1BAD".into(), value: "x".into() }].into(),
            ..params
        };
        assert_eq!(
            bed.provider.execute(&bad_env, &mut OutputSink::new(&mut ignore)).unwrap_err().kind,
            ErrorKind::INVALID_INPUT
        );
        bed.provider.destroy_lease(&lease).unwrap();
    }
}
