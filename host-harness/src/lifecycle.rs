//! A whole lease lifecycle, step by step: validate, probe, acquire, realize,
//! execute, release for reuse (pause), resume, execute again, destroy.
//!
//! Each step is reported with its duration and outcome. The seed's defensive
//! policy is applied: a release that reports cleanup unconfirmed falls back
//! to destroy, and a failed lifecycle destroys whatever lease it holds.

use crate::request::HarnessConfig;
use provider_abi::{
    ErrorKind, ExecuteParams, Hook, HookResult, Lease, LeaseParams, LoadedProvider, OutputSink, OutputStream,
    Provider, ProviderError,
};
use serde_json::{json, Value};
use std::{
    io::Write,
    time::{Duration, Instant},
};

/// One finished step.
#[derive(Debug, Clone)]
pub struct StepReport {
    /// The step's name (`acquire`, `release`...).
    pub step: &'static str,
    /// How long the hook took.
    pub duration: Duration,
    /// The error, when the step failed.
    pub error: Option<ProviderError>,
    /// The lease the step acted on, if any.
    pub lease_id: Option<String>,
    /// A short note (what was checked, why it was skipped).
    pub note: String,
}

impl StepReport {
    /// The step as one JSON object.
    pub fn to_json(&self) -> Value {
        json!({
            "step": self.step,
            "ok": self.error.is_none(),
            "durationMs": self.duration.as_secs_f64() * 1000.0,
            "leaseId": self.lease_id,
            "note": self.note,
            "error": self.error.as_ref().map(crate::render::error),
        })
    }
}

/// Runs a lifecycle, calling `report` after each step. Returns true when
/// every step succeeded.
pub fn run(provider: &LoadedProvider, config: &HarnessConfig, mut report: impl FnMut(&StepReport)) -> bool {
    let mut lifecycle = Lifecycle { provider, config, lease: None, report: &mut report, ok: true };
    let completed = lifecycle.steps().is_ok();
    if !completed {
        lifecycle.clean_up();
    }
    completed && lifecycle.ok
}

/// The workspace file the first command writes and the second reads back.
const PROBE_FILE: &str = "harness-lifecycle.txt";

struct Lifecycle<'a> {
    provider: &'a LoadedProvider,
    config: &'a HarnessConfig,
    lease: Option<Lease>,
    report: &'a mut dyn FnMut(&StepReport),
    ok: bool,
}

impl Lifecycle<'_> {
    fn steps(&mut self) -> Result<(), ()> {
        let env = self.config.environment(&self.provider.manifest().driver_key);
        let validation = self.step("validate", |provider| provider.validate_config(&env))?;
        if !validation.ok {
            let message = validation.errors.iter().map(|error| error.as_str()).collect::<Vec<_>>().join("; ");
            self.fail("validate", ProviderError::new(ErrorKind::INVALID_CONFIG, message));
            return Err(());
        }
        self.step("probe", |provider| provider.probe(&env))?;
        let params = provider_abi::AcquireParams {
            env: env.clone(),
            run_id: "harness-lifecycle".into(),
            requested_expires_at: None.into(),
        };
        let lease = self.step("acquire", |provider| provider.acquire_lease(&params))?;
        self.lease = Some(lease);
        let held = self.held(&env);
        self.step("realize", |provider| provider.realize_workspace(&held))?;
        let script = format!("echo lifecycle-was-here > {PROBE_FILE} && echo written");
        self.execute("execute", &env, &script, "written")?;
        let release = self.step("release", |provider| provider.release_lease(&held));
        if release.is_err() {
            return Err(());
        }
        let resumed = self.step("resume", |provider| provider.resume_lease(&held))?;
        if resumed.expired {
            self.fail("resume", ProviderError::internal("the lease expired between release and resume"));
            return Err(());
        }
        self.lease = Some(resumed);
        let held = self.held(&env);
        self.execute("execute-again", &env, &format!("cat {PROBE_FILE}"), "lifecycle-was-here")?;
        self.step("destroy", |provider| provider.destroy_lease(&held))?;
        self.lease = None;
        Ok(())
    }

    /// Runs a shell command in the lease, streaming its output live, and
    /// checks that its stdout contains `expect`.
    fn execute(
        &mut self,
        step: &'static str,
        env: &provider_abi::EnvironmentParams,
        script: &str,
        expect: &str,
    ) -> Result<(), ()> {
        if !self.provider.supports(Hook::Execute)
            || !self.provider.manifest().hooks.iter().any(|hook| hook == "execute")
        {
            self.emit(StepReport {
                step,
                duration: Duration::ZERO,
                error: None,
                lease_id: self.lease_id(),
                note: "skipped: the provider does not implement execute".into(),
            });
            return Ok(());
        }
        let params = ExecuteParams {
            lease: self.held(env),
            command: "/bin/sh".into(),
            args: vec!["-c".into(), script.into()].into(),
            ..Default::default()
        };
        let result = self.step(step, |provider| {
            // Live output goes to stderr so stdout stays one report per step.
            let mut live = |_: OutputStream, chunk: &str| {
                let _ = std::io::stderr().write_all(chunk.as_bytes());
            };
            provider.execute(&params, &mut OutputSink::new(&mut live))
        })?;
        if result.exit_code.into_option() != Some(0) || !result.stdout.contains(expect) {
            self.fail(
                step,
                ProviderError::internal(format!("the command did not print `{expect}` and exit 0")),
            );
            return Err(());
        }
        Ok(())
    }

    fn step<T>(
        &mut self,
        step: &'static str,
        hook: impl FnOnce(&LoadedProvider) -> HookResult<T>,
    ) -> Result<T, ()> {
        let started = Instant::now();
        let outcome = hook(self.provider);
        let duration = started.elapsed();
        let error = outcome.as_ref().err().cloned();
        let recovered = match (&error, step) {
            // The seed's fallback: an unconfirmed release becomes a destroy.
            (Some(error), "release") if error.kind == ErrorKind::CLEANUP_UNCONFIRMED => {
                tracing::warn!(lease = ?self.lease_id(), "release reported cleanup unconfirmed; destroying the lease");
                true
            }
            _ => false,
        };
        self.emit(StepReport {
            step,
            duration,
            error: error.clone(),
            lease_id: self.lease_id(),
            note: String::new(),
        });
        if error.is_some() {
            self.ok = false;
            if recovered {
                self.clean_up();
            }
        }
        outcome.map_err(|_| ())
    }

    fn fail(&mut self, step: &'static str, error: ProviderError) {
        self.ok = false;
        self.emit(StepReport {
            step,
            duration: Duration::ZERO,
            error: Some(error),
            lease_id: self.lease_id(),
            note: String::new(),
        });
    }

    /// Destroys the lease this lifecycle still holds, if any.
    fn clean_up(&mut self) {
        let Some(lease) = self.lease.take() else { return };
        let env = self.config.environment(&self.provider.manifest().driver_key);
        let started = Instant::now();
        let outcome = self.provider.destroy_lease(&params_for(&env, &lease));
        self.emit(StepReport {
            step: "destroy",
            duration: started.elapsed(),
            error: outcome.err(),
            lease_id: lease.provider_lease_id.as_ref().map(|id| id.to_string()).into_option(),
            note: "clean-up after a failed step".into(),
        });
    }

    fn lease_id(&self) -> Option<String> {
        self.lease
            .as_ref()
            .and_then(|lease| lease.provider_lease_id.as_ref().map(|id| id.to_string()).into_option())
    }

    /// Parameters acting on the lease this lifecycle holds.
    fn held(&self, env: &provider_abi::EnvironmentParams) -> LeaseParams {
        params_for(env, &self.lease.clone().unwrap_or_default())
    }

    fn emit(&mut self, report: StepReport) {
        (self.report)(&report);
    }
}

/// The parameters of a hook acting on `lease`.
pub fn params_for(env: &provider_abi::EnvironmentParams, lease: &Lease) -> LeaseParams {
    LeaseParams {
        env: env.clone(),
        run_id: "harness-lifecycle".into(),
        provider_lease_id: lease.provider_lease_id.clone(),
        metadata_json: lease.metadata_json.clone(),
    }
}
