//! A whole lease lifecycle, step by step: validate, probe, acquire, realize,
//! execute, release for reuse (pause), resume, execute again, destroy.
//!
//! Each step is reported with its duration and outcome to a [`Reporter`]
//! (the `lifecycle` command prints them; `soak` aggregates them quietly).
//! Hooks go through a [`Host`], so every lease is in the ledger and the seed's
//! policy applies: a release that reports cleanup unconfirmed falls back to
//! destroy, and a failed lifecycle destroys whatever lease it holds.

use crate::{
    host::{HeldLease, Host, Released},
    interrupt,
};
use provider_abi::{ErrorKind, ExecuteParams, HookResult, OutputSink, OutputStream, ProviderError};
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

/// Receives a lifecycle's steps and its commands' live output.
pub trait Reporter: Send {
    /// A step finished.
    fn step(&mut self, report: &StepReport);

    /// A chunk of a command's output, as it arrives (default: to stderr, so
    /// stdout stays one report per step).
    fn output(&mut self, _stream: OutputStream, chunk: &str) {
        let _ = std::io::stderr().write_all(chunk.as_bytes());
    }
}

impl<F: FnMut(&StepReport) + Send> Reporter for F {
    fn step(&mut self, report: &StepReport) {
        self(report)
    }
}

/// Runs a lifecycle through `host`, reporting each step. Returns true when
/// every step succeeded.
pub fn run(host: &Host<'_>, reporter: &mut dyn Reporter) -> bool {
    let mut lifecycle = Lifecycle { host, lease: None, reporter, ok: true };
    let completed = lifecycle.steps().is_ok();
    if !completed {
        lifecycle.clean_up();
    }
    completed && lifecycle.ok
}

/// The workspace file the first command writes and the second reads back.
const PROBE_FILE: &str = "harness-lifecycle.txt";

struct Lifecycle<'a, 'h> {
    host: &'a Host<'h>,
    lease: Option<HeldLease>,
    reporter: &'a mut dyn Reporter,
    ok: bool,
}

impl Lifecycle<'_, '_> {
    fn steps(&mut self) -> Result<(), ()> {
        let host = self.host;
        let validation = self.step("validate", "", || host.validate())?;
        if !validation.ok {
            let message = validation.errors.iter().map(|error| error.as_str()).collect::<Vec<_>>().join(" ");
            self.fail("validate", ProviderError::new(ErrorKind::INVALID_CONFIG, message));
            return Err(());
        }
        self.step("probe", "", || host.probe())?;
        let held = self.step("acquire", "", || host.acquire())?;
        self.lease = Some(held.clone());
        self.step("realize", "", || host.realize(&held))?;
        let script = format!("echo lifecycle-was-here > {PROBE_FILE} && echo written");
        self.execute("execute", &script, "written")?;
        self.refuse_if_interrupted("release")?;
        let started = Instant::now();
        match host.release(&held) {
            Ok(Released::DestroyedInstead(cause)) => {
                let note = "cleanup unconfirmed: destroyed instead of reused";
                let _ = self.finish("release", note, started, Err::<(), _>(cause));
                self.lease = None;
                return Err(());
            }
            outcome => {
                if self.finish("release", "", started, outcome)? == Released::Deleted {
                    self.lease = None;
                    self.note("resume", "skipped: the configuration does not reuse leases");
                    return Ok(());
                }
            }
        }
        let resumed = self.step("resume", "", || host.resume(&held))?;
        if resumed.expired {
            self.lease = None;
            self.fail("resume", ProviderError::internal("the lease expired between release and resume"));
            return Err(());
        }
        let held = HeldLease { lease: resumed, ..held };
        self.lease = Some(held.clone());
        self.execute("execute-again", &format!("cat {PROBE_FILE}"), "lifecycle-was-here")?;
        self.step("destroy", "", || host.destroy(&held))?;
        self.lease = None;
        Ok(())
    }

    /// Runs a shell command in the lease, streaming its output live, and
    /// checks that its stdout contains `expect`.
    fn execute(&mut self, step: &'static str, script: &str, expect: &str) -> Result<(), ()> {
        if !self.host.can_execute() {
            self.note(step, "skipped: the provider does not implement execute");
            return Ok(());
        }
        let held = self.lease.clone().unwrap_or_else(|| HeldLease::new(0, Default::default()));
        let params = ExecuteParams {
            command: "/bin/sh".into(),
            args: vec!["-c".into(), script.into()].into(),
            ..Default::default()
        };
        let host = self.host;
        self.refuse_if_interrupted(step)?;
        let started = Instant::now();
        let outcome = {
            let reporter = &mut *self.reporter;
            let mut live = |stream: OutputStream, chunk: &str| reporter.output(stream, chunk);
            host.execute(&held, params, &mut OutputSink::new(&mut live))
        };
        let result = self.finish(step, "", started, outcome)?;
        if result.exit_code.into_option() != Some(0) || !result.stdout.contains(expect) {
            self.fail(
                step,
                ProviderError::internal(format!("the command did not print `{expect}` and exit 0")),
            );
            return Err(());
        }
        Ok(())
    }

    /// Runs one hook as step `step`; after an interruption the step fails
    /// without calling it, so the lifecycle cleans up instead.
    fn step<T>(
        &mut self,
        step: &'static str,
        note: &str,
        hook: impl FnOnce() -> HookResult<T>,
    ) -> Result<T, ()> {
        self.refuse_if_interrupted(step)?;
        let started = Instant::now();
        let outcome = hook();
        self.finish(step, note, started, outcome)
    }

    fn refuse_if_interrupted(&mut self, step: &'static str) -> Result<(), ()> {
        if interrupt::requested().is_some() {
            self.fail(step, interrupt::stopped());
            return Err(());
        }
        Ok(())
    }

    fn finish<T>(
        &mut self,
        step: &'static str,
        note: &str,
        started: Instant,
        outcome: HookResult<T>,
    ) -> Result<T, ()> {
        let duration = started.elapsed();
        let error = outcome.as_ref().err().cloned();
        self.ok &= error.is_none();
        self.emit(StepReport { step, duration, error, lease_id: self.lease_id(), note: note.to_owned() });
        outcome.map_err(|_| ())
    }

    fn note(&mut self, step: &'static str, note: &str) {
        self.emit(StepReport {
            step,
            duration: Duration::ZERO,
            error: None,
            lease_id: self.lease_id(),
            note: note.into(),
        });
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

    /// Destroys the lease this lifecycle still holds, if any (also after an
    /// interruption: clean-up is what an interruption asks for).
    fn clean_up(&mut self) {
        let Some(held) = self.lease.take() else { return };
        let host = self.host;
        self.lease = Some(held.clone());
        let started = Instant::now();
        let outcome = host.destroy(&held);
        let _ = self.finish("destroy", "clean-up after a failed step", started, outcome);
        self.lease = None;
    }

    fn lease_id(&self) -> Option<String> {
        self.lease.as_ref().and_then(|held| held.id().map(str::to_owned))
    }

    fn emit(&mut self, report: StepReport) {
        self.reporter.step(&report);
    }
}
