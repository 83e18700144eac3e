//! A whole lease lifecycle, step by step: validate, probe, acquire, realize,
//! sync-in, execute, sync-out, release for reuse (pause), resume, execute
//! again, destroy. The sync steps copy a small host directory into the
//! workspace before the first command and its result back after it; they
//! are skipped for a provider without file sync (`sync_files`), and
//! [`run_with`] can leave them out (`soak` measures leases alone).
//!
//! Each step is reported with its duration and outcome to a [`Reporter`]
//! (the `lifecycle` command prints them; `soak` aggregates them quietly).
//! Hooks go through a [`Host`], so every lease is in the ledger and the release
//! rule applies: a release that reports cleanup unconfirmed falls back to
//! destroy, and a failed lifecycle destroys whatever lease it holds.

use crate::interrupt;
use provider_abi::{ByteSource, ErrorKind, HookResult, OutputStream, ProviderError, SyncDirection};
use provider_host::{
    host::{HeldLease, Host, Released},
    FileTransfer, PathMapping, RemoteCommand, TransferOperation, TransferOutcome,
};
use serde_json::{json, Value};
use std::{
    future::Future,
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

    /// A chunk of a command's output, the bytes as it wrote them, as they
    /// arrive (default: to stderr, so stdout stays one report per step).
    fn output(&mut self, _stream: OutputStream, chunk: &[u8]) {
        let _ = std::io::stderr().write_all(chunk);
    }
}

impl<F: FnMut(&StepReport) + Send> Reporter for F {
    fn step(&mut self, report: &StepReport) {
        self(report)
    }
}

/// Runs a lifecycle through `host` on this thread, reporting each step.
/// Returns true when every step succeeded.
pub fn run(host: &Host<'_>, reporter: &mut dyn Reporter) -> bool {
    provider_host::wait(run_with(host, reporter, true))
}

/// Runs a lifecycle through `host`, with the sync steps when `sync` is true
/// (`soak` measures leases alone). Dropping the future cancels the hook
/// under way and leaves the lease it holds to the ledger (a `sweep`
/// destroys it).
pub async fn run_with(host: &Host<'_>, reporter: &mut dyn Reporter, sync: bool) -> bool {
    // Every step that fails ends the lifecycle.
    let mut lifecycle = Lifecycle { host, lease: None, reporter, sync };
    let completed = lifecycle.steps().await.is_ok();
    if !completed {
        lifecycle.clean_up().await;
    }
    completed
}

/// The workspace file the first command writes and the second reads back.
const PROBE_FILE: &str = "harness-lifecycle.txt";
/// The workspace directory sync-in fills.
const SYNC_INPUT: &str = "harness-input";
/// The workspace file the first command makes from the synced input and
/// sync-out brings back.
const SYNC_RESULT: &str = "harness-result.txt";
/// What the synced input file holds.
const SYNC_GREETING: &str = "hello from the host\n";

struct Lifecycle<'a, 'h> {
    host: &'a Host<'h>,
    lease: Option<HeldLease>,
    reporter: &'a mut dyn Reporter,
    sync: bool,
}

impl Lifecycle<'_, '_> {
    async fn steps(&mut self) -> Result<(), ()> {
        let host = self.host;
        // One verdict for the step: a configuration the provider finds
        // invalid fails it with the provider's reasons.
        let validate = async {
            let validation = host.validate()?;
            if validation.ok {
                return Ok(());
            }
            let message = validation.errors.iter().map(|error| error.as_str()).collect::<Vec<_>>().join(" ");
            Err(ProviderError::new(ErrorKind::INVALID_CONFIG, message))
        };
        self.step("validate", validate).await?;
        self.step("probe", host.probe()).await?;
        let held = self.step("acquire", host.acquire()).await?;
        self.lease = Some(held.clone());
        let workspace = self.step("realize", async { host.realize(&held) }).await?;
        let synced = self.sync_in(&held, &workspace.cwd).await?;
        let script = match synced {
            Some(_) => format!(
                "cp {SYNC_INPUT}/hello.txt {SYNC_RESULT} && echo lifecycle-was-here > {PROBE_FILE} && echo written"
            ),
            None => format!("echo lifecycle-was-here > {PROBE_FILE} && echo written"),
        };
        self.execute("execute", &script, "written").await?;
        if let Some(local) = synced {
            self.sync_out(&held, &workspace.cwd, local.path()).await?;
        }
        self.refuse_if_interrupted("release")?;
        let started = Instant::now();
        match Box::pin(host.release(&held)).await {
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
        let resumed = self.step("resume", host.resume(&held)).await?;
        if resumed.expired {
            self.lease = None;
            return self
                .fail("resume", ProviderError::internal("the lease expired between release and resume"));
        }
        let held = HeldLease { lease: resumed, ..held };
        self.lease = Some(held.clone());
        self.execute("execute-again", &format!("cat {PROBE_FILE}"), "lifecycle-was-here").await?;
        self.step("destroy", host.destroy(&held)).await?;
        self.lease = None;
        Ok(())
    }

    /// Runs a shell command in the lease, streaming its output live, and
    /// checks that its stdout contains `expect`.
    async fn execute(&mut self, step: &'static str, script: &str, expect: &str) -> Result<(), ()> {
        let held = self.lease.clone().unwrap_or_else(|| HeldLease::new(0, Default::default()));
        let command = RemoteCommand::new("/bin/sh").args(["-c", script]);
        let host = self.host;
        self.refuse_if_interrupted(step)?;
        let started = Instant::now();
        let outcome = {
            let reporter = &mut *self.reporter;
            let mut live = |stream: OutputStream, chunk: &[u8]| reporter.output(stream, chunk);
            Box::pin(host.execute(&held, command, ByteSource::empty(), &mut live)).await
        };
        let result = self.finish(step, "", started, outcome)?;
        if !result.success() || !result.stdout.contains(expect) {
            let error = ProviderError::internal(format!("the command did not print `{expect}` and exit 0"));
            return self.fail(step, error);
        }
        Ok(())
    }

    /// Copies a small host directory into the workspace; `None` when the
    /// provider has no file sync (or the lifecycle runs without it).
    async fn sync_in(&mut self, held: &HeldLease, cwd: &str) -> Result<Option<tempfile::TempDir>, ()> {
        if !self.sync {
            return Ok(None);
        }
        if !self.host.can_sync() {
            self.note("sync-in", "skipped: the provider does not implement file sync");
            return Ok(None);
        }
        let local = tempfile::tempdir()
            .and_then(|dir| {
                std::fs::create_dir(dir.path().join("input"))?;
                std::fs::write(dir.path().join("input/hello.txt"), SYNC_GREETING)?;
                Ok(dir)
            })
            .or_else(|error| {
                self.fail("sync-in", ProviderError::internal(format!("cannot stage the input: {error}")))
            })?;
        let source = local.path().join("input").to_string_lossy().into_owned();
        let params = one_mapping(
            SyncDirection::In,
            "input",
            PathMapping::directory(source, format!("{cwd}/{SYNC_INPUT}")),
        );
        self.noted_step("sync-in", self.host.sync(held, params), moved).await?;
        Ok(Some(local))
    }

    /// Copies the first command's result back and checks it.
    async fn sync_out(&mut self, held: &HeldLease, cwd: &str, local: &std::path::Path) -> Result<(), ()> {
        let target = local.join("result.txt");
        let source = format!("{cwd}/{SYNC_RESULT}");
        let params =
            one_mapping(SyncDirection::Out, "result", PathMapping::file(source, target.to_string_lossy()));
        self.noted_step("sync-out", self.host.sync(held, params), moved).await?;
        if std::fs::read_to_string(&target).ok().as_deref() != Some(SYNC_GREETING) {
            return self
                .fail("sync-out", ProviderError::internal("the synced result does not match the input"));
        }
        Ok(())
    }

    /// Runs one hook as step `step`; after an interruption the step fails
    /// without calling it (the future is dropped unpolled), so the
    /// lifecycle cleans up instead.
    async fn step<T>(
        &mut self,
        step: &'static str,
        hook: impl Future<Output = HookResult<T>>,
    ) -> Result<T, ()> {
        self.noted_step(step, hook, |_| String::new()).await
    }

    /// [`Lifecycle::step`], its report noting `note` of the outcome.
    async fn noted_step<T>(
        &mut self,
        step: &'static str,
        hook: impl Future<Output = HookResult<T>>,
        note: impl FnOnce(&HookResult<T>) -> String,
    ) -> Result<T, ()> {
        self.refuse_if_interrupted(step)?;
        let started = Instant::now();
        // On the heap while it runs: a lifecycle in flight then holds only
        // the step under way, not room for the largest of them.
        let outcome = Box::pin(hook).await;
        self.finish(step, &note(&outcome), started, outcome)
    }

    fn refuse_if_interrupted(&mut self, step: &'static str) -> Result<(), ()> {
        match interrupt::requested() {
            Some(_) => self.fail(step, interrupt::stopped()),
            None => Ok(()),
        }
    }

    fn finish<T>(
        &mut self,
        step: &'static str,
        note: &str,
        started: Instant,
        outcome: HookResult<T>,
    ) -> Result<T, ()> {
        self.emit(step, started.elapsed(), outcome.as_ref().err().cloned(), note);
        outcome.map_err(|_| ())
    }

    /// Reports `step` as done without a hook call: `note` says why.
    fn note(&mut self, step: &'static str, note: &str) {
        self.emit(step, Duration::ZERO, None, note);
    }

    /// Reports `step` failed with `error`; the lifecycle goes no further.
    fn fail<T>(&mut self, step: &'static str, error: ProviderError) -> Result<T, ()> {
        self.emit(step, Duration::ZERO, Some(error), "");
        Err(())
    }

    /// Destroys the lease this lifecycle still holds, if any (also after an
    /// interruption: clean-up is what an interruption asks for).
    async fn clean_up(&mut self) {
        let Some(held) = self.lease.clone() else { return };
        let host = self.host;
        let started = Instant::now();
        let outcome = Box::pin(host.destroy(&held)).await;
        let _ = self.finish("destroy", "clean-up after a failed step", started, outcome);
        self.lease = None;
    }

    /// Reports a step.
    fn emit(&mut self, step: &'static str, duration: Duration, error: Option<ProviderError>, note: &str) {
        let lease_id = self.lease.as_ref().and_then(|held| held.id().map(str::to_owned));
        self.reporter.step(&StepReport { step, duration, error, lease_id, note: note.to_owned() });
    }
}

/// One operation of one mapping, moving files `direction`.
fn one_mapping(direction: SyncDirection, id: &str, mapping: PathMapping) -> FileTransfer {
    FileTransfer::new(direction).operation(TransferOperation::new(id).mapping(mapping))
}

/// "N files, M bytes" of a sync's outcome.
fn moved(outcome: &HookResult<TransferOutcome>) -> String {
    outcome.as_ref().map_or_else(
        |_| String::new(),
        |moved| {
            let (files, bytes) = moved.totals();
            format!("{files} files, {bytes} bytes")
        },
    )
}
