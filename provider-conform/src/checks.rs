//! The checks of the lease contract, and the run that goes through them.
//!
//! Each [`Check`] pairs a name with the contract sentence it tests (the
//! sentences are those of `docs/writing-a-provider.md`), and every failure
//! names both. Checks call the provider directly, not through a
//! [`provider_host::host::Host`]:
//! the host's defensive policy (destroy an unconfirmed lease instead of
//! reusing it) would hide exactly the provider behaviour being checked. So
//! conform opens no ledger; every lease a check acquires is destroyed when
//! the check ends, pass or fail.
//!
//! Commands run in leases as `/bin/sh -c SCRIPT` with relative paths (the
//! workspace is the default working directory): conform expects a POSIX
//! shell with `printf`, `cat`, `kill` and `sleep` in the lease.
//!
//! Panics: conform cannot make an arbitrary provider's own code panic (that
//! needs a provider-specific trigger). It checks the two places where a
//! panic on the host's side of a hook call must come back as data: a
//! recorder that panics inside `acquire_lease` (the hook must fail with that
//! error and delete what it created) and an output sink that panics inside
//! `execute` (the call must still complete).
//!
//! The hooks that return a future are awaited on the check's thread
//! ([`provider_host::wait`]). Panics in the
//! provider's own hook code become `internal` errors in the export layer
//! (`provider_abi::export::guard`, tested there) for every provider built with
//! `export_provider!` and without `panic = "abort"`.

use crate::report::{CheckReport, Report, Verdict};
use provider_abi::{
    ready, AcquireParams, ByteSink, ByteSource, CreationRecorder, EnvironmentParams, ErrorKind,
    ExecuteParams, ExecuteResult, Hook, HookFuture, HookResult, Lease, LeaseParams, OutputStream, Provider,
    ProviderError, RecordCreation,
};
use provider_host::{environment::Environment, loader::LoadedProvider, wait};
use serde_json::Value;
use std::{
    ops::ControlFlow,
    sync::{mpsc, Arc, Barrier, Mutex, Once},
    time::{Duration, Instant},
};

/// One check of the contract.
#[derive(Clone, Copy)]
pub struct Check {
    /// A short stable name (`destroy-twice`).
    pub name: &'static str,
    /// The contract sentence a failure breaks.
    pub contract: &'static str,
    run: fn(&Ctx) -> Result<String, Verdict>,
}

/// How long a whole check may take before it is failed (and its thread
/// left behind): far above what any check needs, so only a hung hook hits it.
pub const CHECK_BOUND: Duration = Duration::from_secs(180);
/// How long `validate_config` of an empty configuration may take: generous,
/// yet far below a network timeout, so a provider that waits on the network
/// (or on anything else) there fails.
pub const VALIDATE_BOUND: Duration = Duration::from_secs(5);
/// The timeout given to the command that must outlive it.
pub const COMMAND_TIMEOUT_MS: u64 = 1000;
/// How long after its timeout a timed-out command's `execute` may return
/// (the provider's cleanup runs on a fresh bound of its own).
pub const TIMEOUT_SLACK: Duration = Duration::from_secs(30);
/// How many leases the concurrency check holds at once.
pub const CONCURRENT_LEASES: usize = 32;
/// The longest any single wait inside a check lasts (a command's first
/// output, a cancelled command's return).
const WAIT: Duration = Duration::from_secs(60);

/// Every check, in the order they run.
pub const CHECKS: &[Check] = &[
    Check {
        name: "manifest",
        contract: "The manifest names the provider, its version and driver key and a JSON-object configuration schema; the library's table has every required hook, and the hooks it has answer.",
        run: manifest,
    },
    Check {
        name: "validate-empty-config",
        contract: "validate_config reports every problem of a configuration at once, as a report rather than an error, one line each, and sends nothing: it answers at once.",
        run: validate_empty,
    },
    Check {
        name: "validate-config",
        contract: "validate_config accepts a usable configuration and returns its normalised form.",
        run: validate_given,
    },
    Check {
        name: "lifecycle",
        contract: "acquire, realize, execute, release, resume, execute and destroy work in turn: execute reports the exit code, keeps stdout and stderr apart and streams output before the command ends; a lease the release kept is handed back by resume.",
        run: lifecycle,
    },
    Check {
        name: "destroy-twice",
        contract: "Destroying a lease that is already gone is not an error.",
        run: destroy_twice,
    },
    Check {
        name: "resume-after-destroy",
        contract: "Resuming a destroyed lease reports it expired (expired, no lease id), never hands it back.",
        run: resume_after_destroy,
    },
    Check {
        name: "execute-after-destroy",
        contract: "Execute on a destroyed lease is refused with an error.",
        run: execute_after_destroy,
    },
    Check {
        name: "other-environment",
        contract: "A lease is used only by the company and environment that acquired it: every lease hook refuses another environment's lease with not_this_environment and changes nothing.",
        run: other_environment,
    },
    Check {
        name: "concurrent-release",
        contract: "A second release of a lease while one is in progress is refused with cleanup_in_progress; release first stops the commands running in the lease.",
        run: concurrent_release,
    },
    Check {
        name: "timeout",
        contract: "A command that outlives its timeout comes back timed out with no exit code and its partial output, and its processes are gone.",
        run: timeout,
    },
    Check {
        name: "many-leases",
        contract: "Leases held at once are independent: each command sees only its own lease's workspace and output.",
        run: many_leases,
    },
    Check {
        name: "recorder-panic",
        contract: "acquire_lease tells the host before its creation request leaves and hands it the lease before going on; when the host's recorder fails (here: panics), the hook fails with the recorder's error and deletes what it created.",
        run: recorder_panic,
    },
    Check {
        name: "sink-panic",
        contract: "A panic in the host's output sink stays on the host's side: execute still runs the command to its end and returns its exit code and output.",
        run: sink_panic,
    },
];

/// Runs every check against `provider` (loaded and set up) in
/// `environment`, in order, handing each report to `observe` as it
/// finishes; no further check starts once `observe` breaks (a host that
/// was interrupted). Returns the reports of the checks that ran.
pub fn run(
    provider: Arc<LoadedProvider>,
    environment: &Environment,
    observe: &mut dyn FnMut(&CheckReport) -> ControlFlow<()>,
) -> Report {
    let env = environment.params(&provider.manifest().driver_key);
    let ctx = Ctx { provider, env };
    quiet_deliberate_panics();
    let mut checks = Vec::with_capacity(CHECKS.len());
    for check in CHECKS {
        let started = Instant::now();
        let (ctx, run) = (ctx.clone(), check.run);
        let verdict = match bounded(CHECK_BOUND, move || run(&ctx)) {
            Some(Ok(note)) => Verdict::Passed(note),
            Some(Err(verdict)) => verdict,
            None => Verdict::Failed(format!("the check did not finish within {} s", CHECK_BOUND.as_secs())),
        };
        let finished =
            CheckReport { name: check.name, contract: check.contract, verdict, duration: started.elapsed() };
        let next = observe(&finished);
        checks.push(finished);
        if next.is_break() {
            // No new check starts; the one that ran cleaned up after itself.
            break;
        }
    }
    Report { checks }
}

/// The panic message the host-side closures of `recorder-panic` and
/// `sink-panic` panic with; the panic hook keeps it off stderr.
const DELIBERATE_PANIC: &str = "conform: the host's closure panics on purpose";

/// Keeps conform's deliberate panics off stderr from the first run on; every
/// other panic goes to the hook installed before (libtest's, in a test).
fn quiet_deliberate_panics() {
    static INSTALLED: Once = Once::new();
    INSTALLED.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if info.payload().downcast_ref::<&str>() != Some(&DELIBERATE_PANIC) {
                previous(info);
            }
        }));
    });
}

/// Runs `call` on a thread of its own, waiting at most `limit` for it;
/// `None` when it did not return in time (the thread is left behind).
fn bounded<T: Send + 'static>(limit: Duration, call: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    let (sender, receiver) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = sender.send(call());
    });
    receiver.recv_timeout(limit).ok()
}

/// What every check shares: the provider and the environment under test.
#[derive(Clone)]
struct Ctx {
    provider: Arc<LoadedProvider>,
    env: EnvironmentParams,
}

fn failed(detail: impl Into<String>) -> Verdict {
    Verdict::Failed(detail.into())
}

/// "`hook` failed: message \[kind\]", of an error.
fn hook_failed(hook: &str) -> impl Fn(ProviderError) -> Verdict + '_ {
    move |error| failed(format!("{hook} failed: {} [{}]", error.message, error.kind))
}

/// The output a command streamed, in order, by stream.
type Streamed = Vec<(OutputStream, Vec<u8>)>;

/// What was streamed on `stream`, as text.
fn text(streamed: &Streamed, stream: OutputStream) -> String {
    let bytes: Vec<u8> =
        streamed.iter().filter(|(s, _)| *s == stream).flat_map(|(_, chunk)| chunk.clone()).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// What a creating hook reported to its recorder, in order.
#[derive(Debug, Clone, PartialEq)]
enum Moment {
    Sending,
    Created(Lease),
}

/// A recorder keeping every moment, panicking (on purpose) at the lease
/// when `panics`.
struct Journal {
    moments: Arc<Mutex<Vec<Moment>>>,
    panics: bool,
}

impl RecordCreation for Journal {
    fn sending(&mut self) -> HookFuture<()> {
        locked(&self.moments).push(Moment::Sending);
        ready(Ok(()))
    }

    fn created(&mut self, lease: &Lease) -> HookFuture<()> {
        locked(&self.moments).push(Moment::Created(lease.clone()));
        if self.panics {
            std::panic::panic_any(DELIBERATE_PANIC);
        }
        ready(Ok(()))
    }
}

fn locked<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poison| poison.into_inner())
}

/// A sink collecting into `streamed`.
fn collecting(streamed: &Arc<Mutex<Streamed>>) -> ByteSink {
    let streamed = Arc::clone(streamed);
    ByteSink::new(move |stream: OutputStream, chunk: &[u8]| locked(&streamed).push((stream, chunk.to_vec())))
}

/// A lease a check holds; destroyed when dropped unless already destroyed,
/// so a failing check leaves nothing behind.
struct Held {
    ctx: Ctx,
    lease: Lease,
    live: bool,
}

impl Held {
    fn params(&self) -> LeaseParams {
        self.ctx.params(&self.lease)
    }

    fn id(&self) -> String {
        self.lease.provider_lease_id.as_ref().map(|id| id.to_string()).unwrap_or_default()
    }

    fn destroy(&mut self) -> Result<(), Verdict> {
        let outcome = wait(self.ctx.provider.destroy_lease(self.params()));
        self.live = false;
        outcome.map_err(hook_failed("destroy_lease"))
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if self.live {
            if let Err(error) = wait(self.ctx.provider.destroy_lease(self.params())) {
                tracing::warn!(lease = %self.id(), error = %error, "conform could not destroy a lease it acquired");
            }
        }
    }
}

impl Ctx {
    fn params(&self, lease: &Lease) -> LeaseParams {
        LeaseParams::new(self.env.clone(), "conform", lease)
    }

    /// Holds `lease`: destroyed when dropped.
    fn hold(&self, lease: Lease) -> Held {
        Held { ctx: self.clone(), lease, live: true }
    }

    /// Calls `acquire_lease` with a [`Journal`] (panicking at the lease when
    /// `panics`); returns its outcome and the moments it recorded.
    fn acquire_recorded(&self, panics: bool) -> (HookResult<Lease>, Vec<Moment>) {
        let params = AcquireParams { env: self.env.clone(), run_id: "conform".into(), ..Default::default() };
        let moments = Arc::new(Mutex::new(Vec::new()));
        let recorder = CreationRecorder::new(Journal { moments: Arc::clone(&moments), panics });
        let outcome = wait(self.provider.acquire_lease(params, recorder));
        let moments = locked(&moments).clone();
        (outcome, moments)
    }

    /// A lease acquired and then destroyed.
    fn destroyed(&self) -> Result<Held, Verdict> {
        let mut held = self.acquire()?;
        held.destroy()?;
        Ok(held)
    }

    /// Acquires a lease, checking the write-ahead promise: the request is
    /// reported before the lease, and the lease returned is the one recorded.
    fn acquire(&self) -> Result<Held, Verdict> {
        let (lease, moments) = self.acquire_recorded(false);
        let held = self.hold(lease.map_err(hook_failed("acquire_lease"))?);
        if moments != [Moment::Sending, Moment::Created(held.lease.clone())] {
            let seen: Vec<&str> = moments
                .iter()
                .map(|moment| match moment {
                    Moment::Sending => "sending",
                    Moment::Created(lease) if *lease == held.lease => "this lease",
                    Moment::Created(_) => "another lease",
                })
                .collect();
            return Err(failed(format!(
                "acquire_lease returned lease {} after reporting [{}] to its recorder, not the request leaving and then that lease",
                held.id(),
                seen.join(", ")
            )));
        }
        if held.lease.expired || held.lease.provider_lease_id.is_none() {
            return Err(failed("acquire returned an expired lease or one without an id"));
        }
        Ok(held)
    }

    /// Runs `/bin/sh -c script` in the lease of `lease`, its output going to `sink`.
    fn shell(
        &self,
        lease: LeaseParams,
        script: &str,
        timeout_ms: Option<u64>,
        sink: ByteSink,
    ) -> HookResult<ExecuteResult> {
        let params = ExecuteParams {
            lease,
            command: "/bin/sh".into(),
            args: vec!["-c".into(), script.into()].into(),
            timeout_ms: timeout_ms.into(),
            ..Default::default()
        };
        wait(self.provider.execute(params, ByteSource::empty(), sink))
    }

    /// Runs `script` in `lease` and expects exit code 0; returns its stdout.
    fn sh_ok(&self, lease: &Lease, script: &str) -> Result<String, Verdict> {
        let result = self
            .shell(self.params(lease), script, None, ByteSink::discard())
            .map_err(hook_failed("execute"))?;
        match result.exit_code.into_option() {
            Some(0) => Ok(result.stdout.to_string()),
            code => Err(failed(format!(
                "`{}` ended with exit code {code:?} (timed out: {}), stderr {:?}",
                one_line(script),
                result.timed_out,
                result.stderr.as_str()
            ))),
        }
    }

    /// Resumes `held` and expects it expired.
    fn expect_expired(&self, held: &Held, what: &str) -> Result<(), Verdict> {
        let resumed = wait(self.provider.resume_lease(held.params())).map_err(hook_failed("resume_lease"))?;
        if resumed.expired && resumed.provider_lease_id.is_none() {
            Ok(())
        } else {
            Err(failed(format!(
                "resume_lease of {what} lease {} handed it back (expired: {}, id: {:?})",
                held.id(),
                resumed.expired,
                resumed.provider_lease_id.as_ref().map(|id| id.to_string()).into_option()
            )))
        }
    }
}

fn manifest(ctx: &Ctx) -> Result<String, Verdict> {
    let manifest = ctx.provider.manifest();
    let abi = ctx.provider.library_abi();
    let fields = [("id", &manifest.id), ("version", &manifest.version), ("driver key", &manifest.driver_key)];
    let empty = fields.into_iter().filter(|(_, value)| value.trim().is_empty());
    let mut problems: Vec<String> = empty.map(|(field, _)| format!("the {field} is empty")).collect();
    let missing = Hook::ALL.into_iter().filter(|hook| !hook.is_optional() && !ctx.provider.supports(*hook));
    problems.extend(missing.map(|hook| format!("lacks the required `{hook}` hook")));
    match serde_json::from_str::<Value>(&manifest.config_schema_json) {
        Ok(Value::Object(_)) => {}
        _ => problems.push("the configuration schema is not a JSON object".into()),
    }
    match ctx.provider.health() {
        Ok(report) if ["ok", "degraded", "error"].contains(&report.status.as_str()) => {}
        Ok(report) => problems.push(format!("health reports unknown status {:?}", report.status.as_str())),
        Err(error) => problems.push(format!("health failed: {} [{}]", error.message, error.kind)),
    }
    if problems.is_empty() {
        Ok(format!("{} {}, ABI {abi}, {} hooks", manifest.id, manifest.version, manifest.hooks.len()))
    } else {
        Err(failed(format!("the manifest {}", problems.join("; "))))
    }
}

fn validate_empty(ctx: &Ctx) -> Result<String, Verdict> {
    let env = EnvironmentParams { config_json: "{}".into(), ..ctx.env.clone() };
    let started = Instant::now();
    let provider = ctx.provider.clone();
    let report = bounded(VALIDATE_BOUND, move || provider.validate_config(&env))
        .ok_or_else(|| failed(format!("validate_config of an empty configuration did not answer within {} s (does it wait on the network?)", VALIDATE_BOUND.as_secs())))?
        .map_err(hook_failed("validate_config of an empty configuration"))?;
    let ms = started.elapsed().as_secs_f64() * 1e3;
    if report.ok {
        return Ok(format!("an empty configuration is valid for this provider ({ms:.1} ms)"));
    }
    if report.errors.is_empty() {
        return Err(failed("validate_config rejected an empty configuration without naming a problem"));
    }
    if let Some(bad) = report.errors.iter().find(|error| error.trim().is_empty() || error.contains('\n')) {
        return Err(failed(format!("a problem is not one line: {:?}", bad.as_str())));
    }
    Ok(format!("{} problem(s) in {ms:.1} ms", report.errors.len()))
}

fn validate_given(ctx: &Ctx) -> Result<String, Verdict> {
    let report = ctx.provider.validate_config(&ctx.env).map_err(hook_failed("validate_config"))?;
    if !report.ok {
        let errors: Vec<&str> = report.errors.iter().map(|error| error.as_str()).collect();
        return Err(failed(format!("the configuration under test is invalid: {}", errors.join("; "))));
    }
    match report.normalized_config_json.as_ref().into_option().map(|text| serde_json::from_str::<Value>(text))
    {
        Some(Ok(Value::Object(_))) => Ok(String::new()),
        _ => Err(failed("validate_config accepted the configuration without a normalised JSON object")),
    }
}

/// A shell loop that waits (a tenth of a second at a time where `sleep`
/// takes fractions, else a second) until `file` exists, exiting 91 after
/// about ten seconds: `wait_for(".conform-go")`.
fn wait_for(file: &str) -> String {
    format!(
        "i=0; while [ ! -e {file} ]; do i=$((i+1)); [ $i -gt 100 ] && exit 91; \
         sleep 0.1 2>/dev/null || sleep 1; done"
    )
}

/// The streaming command: prints a line on each stream, then waits until a
/// second command creates `.conform-go`, which conform runs only once the
/// first line has reached the output sink; so the command ends (exit 7)
/// only if its output is streamed while it runs. Exits 91 otherwise.
fn streaming_script() -> String {
    format!(
        "rm -f .conform-go\nprintf 'conform-out\\n'\nprintf 'conform-err\\n' >&2\n{}\nprintf 'after-go\\n'\nexit 7",
        wait_for(".conform-go")
    )
}

fn lifecycle(ctx: &Ctx) -> Result<String, Verdict> {
    let mut held = ctx.acquire()?;
    let workspace =
        ctx.provider.realize_workspace(&held.params()).map_err(hook_failed("realize_workspace"))?;
    if workspace.cwd.trim().is_empty() {
        return Err(failed("realize_workspace returned an empty working directory"));
    }
    streaming_execute(ctx, &held.lease)?;
    let kept = wait(ctx.provider.release_lease(held.params())).map_err(hook_failed("release_lease"))?.kept;
    let note = if !kept {
        "release deleted the lease (configure lease reuse to check resume)"
    } else {
        let resumed = wait(ctx.provider.resume_lease(held.params())).map_err(hook_failed("resume_lease"))?;
        if resumed.expired || resumed.provider_lease_id != held.lease.provider_lease_id {
            return Err(failed(format!("resume_lease did not hand back released lease {}", held.id())));
        }
        held.lease = resumed;
        let out = ctx.sh_ok(&held.lease, "printf resumed")?;
        if out != "resumed" {
            return Err(failed(format!("after resume, execute printed {out:?} instead of \"resumed\"")));
        }
        "released, resumed and ran again"
    };
    held.destroy()?;
    Ok(note.into())
}

/// Runs [`streaming_script`], letting it finish once its first stdout line
/// has reached the sink, and checks what came back.
fn streaming_execute(ctx: &Ctx, lease: &Lease) -> Result<(), Verdict> {
    let (seen_sender, seen) = mpsc::channel();
    let streamed = Arc::new(Mutex::new(Streamed::default()));
    let collect = {
        let streamed = Arc::clone(&streamed);
        ByteSink::new(move |stream: OutputStream, chunk: &[u8]| {
            let mut streamed = locked(&streamed);
            streamed.push((stream, chunk.to_vec()));
            if text(&streamed, OutputStream::Stdout).contains("conform-out\n") {
                let _ = seen_sender.send(());
            }
        })
    };
    let (result, released) = std::thread::scope(|scope| {
        let worker = scope.spawn(|| ctx.shell(ctx.params(lease), &streaming_script(), Some(30_000), collect));
        // Only once the first line arrived does the second command let the
        // first one finish: output that arrives only at the end never gets here.
        let released = seen
            .recv_timeout(WAIT)
            .ok()
            .map(|()| ctx.shell(ctx.params(lease), ": > .conform-go", Some(30_000), ByteSink::discard()));
        (worker.join(), released)
    });
    let result = result.map_err(|_| failed("execute panicked in the host"))?;
    let streamed = locked(&streamed).clone();
    let result = result.map_err(hook_failed("execute"))?;
    if released.is_none() || result.exit_code.into_option() == Some(91) {
        return Err(failed(
            "the command's first output line did not reach the output sink while the command ran: output is not streamed",
        ));
    }
    if let Some(Err(error)) = released {
        return Err(hook_failed("execute (a second command in the same lease)")(error));
    }
    let expected_out = "conform-out\nafter-go\n";
    let expected_err = "conform-err\n";
    if result.exit_code.into_option() != Some(7) {
        return Err(failed(format!(
            "execute reported exit code {:?}, the command exited 7",
            result.exit_code.into_option()
        )));
    }
    if result.stdout != expected_out || result.stderr != expected_err {
        return Err(failed(format!(
            "execute returned stdout {:?} and stderr {:?}, expected {expected_out:?} and {expected_err:?}",
            result.stdout.as_str(),
            result.stderr.as_str()
        )));
    }
    let (out, err) = (text(&streamed, OutputStream::Stdout), text(&streamed, OutputStream::Stderr));
    if out != expected_out || err != expected_err {
        return Err(failed(format!(
            "the output sink received stdout {out:?} and stderr {err:?}, expected {expected_out:?} and {expected_err:?}"
        )));
    }
    Ok(())
}

fn destroy_twice(ctx: &Ctx) -> Result<String, Verdict> {
    let held = ctx.destroyed()?;
    wait(ctx.provider.destroy_lease(held.params())).map_err(hook_failed("the second destroy_lease"))?;
    Ok(String::new())
}

fn resume_after_destroy(ctx: &Ctx) -> Result<String, Verdict> {
    ctx.expect_expired(&ctx.destroyed()?, "destroyed")?;
    Ok(String::new())
}

fn execute_after_destroy(ctx: &Ctx) -> Result<String, Verdict> {
    let held = ctx.destroyed()?;
    match ctx.shell(held.params(), "printf ran", Some(30_000), ByteSink::discard()) {
        Err(error) => Ok(format!("refused: {}", error.kind)),
        Ok(result) => Err(failed(format!(
            "execute on destroyed lease {} ran (exit code {:?}, stdout {:?})",
            held.id(),
            result.exit_code.into_option(),
            result.stdout.as_str()
        ))),
    }
}

fn other_environment(ctx: &Ctx) -> Result<String, Verdict> {
    let held = ctx.acquire()?;
    ctx.sh_ok(&held.lease, "printf mine > .conform-owner")?;
    let env = &ctx.env;
    let (company, environment) =
        (format!("{}-other", env.company_id), format!("{}-other", env.environment_id));
    let strangers = [
        ("company", EnvironmentParams { company_id: company.into(), ..env.clone() }),
        ("environment", EnvironmentParams { environment_id: environment.into(), ..env.clone() }),
    ];
    let mut wrong = Vec::new();
    for (what, stranger) in strangers {
        let mut accepted = Vec::new();
        let params = LeaseParams { env: stranger, ..held.params() };
        let theirs = "printf theirs > .conform-owner";
        let provider = &ctx.provider;
        let outcomes: Vec<(Hook, Option<ProviderError>)> = vec![
            (Hook::RealizeWorkspace, provider.realize_workspace(&params).err()),
            (Hook::Execute, ctx.shell(params.clone(), theirs, None, ByteSink::discard()).err()),
            (Hook::ResumeLease, wait(provider.resume_lease(params.clone())).err()),
            (Hook::ReleaseLease, wait(provider.release_lease(params.clone())).err()),
            (Hook::DestroyLease, wait(provider.destroy_lease(params.clone())).err()),
        ];
        for (hook, error) in outcomes {
            match error {
                Some(error) if error.kind == ErrorKind::NOT_THIS_ENVIRONMENT => {}
                Some(error) => accepted.push(format!("{hook} failed with {}", error.kind)),
                None => accepted.push(format!("{hook} accepted it")),
            }
        }
        if !accepted.is_empty() {
            wrong.push(format!("another {what}'s lease: {}", accepted.join(", ")));
        }
    }
    if !wrong.is_empty() {
        return Err(failed(format!("not refused with not_this_environment: {}", wrong.join("; "))));
    }
    let owner = ctx.sh_ok(&held.lease, "cat .conform-owner").map_err(|_| {
        failed("the lease no longer works for its own environment after another environment's hooks")
    })?;
    if owner != "mine" {
        return Err(failed(format!("another environment's command ran in the lease (it holds {owner:?})")));
    }
    Ok("realize, execute, resume, release and destroy refused it".into())
}

/// A command that ignores SIGTERM, so that stopping it takes a release a
/// while and a second release surely overlaps the first. It says it runs
/// with a file, not output, so this check does not depend on streaming.
const STUBBORN_SCRIPT: &str = "trap '' TERM; : > .conform-running; sleep 60";

/// How often `concurrent-release` tries to make two releases overlap.
const RELEASE_ATTEMPTS: usize = 3;

/// How one attempt of `concurrent-release` went.
enum Race {
    /// One release was refused with `cleanup_in_progress`, the command stopped.
    Refused,
    /// Both succeeded, one after the other: nothing was observed.
    Sequential,
}

fn concurrent_release(ctx: &Ctx) -> Result<String, Verdict> {
    for attempt in 1..=RELEASE_ATTEMPTS {
        if let Race::Refused = release_race(ctx)? {
            return Ok(format!("one release refused, the running command stopped (attempt {attempt})"));
        }
    }
    Err(Verdict::Skipped(format!(
        "in {RELEASE_ATTEMPTS} attempts each release was over before the other began, so a refusal could not be observed"
    )))
}

/// Starts [`STUBBORN_SCRIPT`] in a fresh lease, then two releases at once.
fn release_race(ctx: &Ctx) -> Result<Race, Verdict> {
    let mut held = ctx.acquire()?;
    let (done_sender, done) = mpsc::channel();
    let (stubborn_ctx, params) = (ctx.clone(), held.params());
    std::thread::spawn(move || {
        let _ =
            done_sender.send(stubborn_ctx.shell(params, STUBBORN_SCRIPT, Some(120_000), ByteSink::discard()));
    });
    ctx.sh_ok(&held.lease, &wait_for(".conform-running"))
        .map_err(|_| failed("the long-running command did not start"))?;
    let barrier = Barrier::new(2);
    let (outcomes, spans): (Vec<_>, Vec<_>) = std::thread::scope(|scope| {
        let release = || {
            barrier.wait();
            let started = Instant::now();
            let outcome = wait(ctx.provider.release_lease(held.params())).map(|_| ());
            (outcome, (started, Instant::now()))
        };
        let releases = [scope.spawn(release), scope.spawn(release)];
        releases.map(|release| {
            release.join().unwrap_or_else(|_| {
                let now = Instant::now();
                (Err(ProviderError::internal("release panicked in the host")), (now, now))
            })
        })
    })
    .into_iter()
    .unzip();
    let overlapped = spans[0].0 < spans[1].1 && spans[1].0 < spans[0].1;
    let refused = outcomes
        .iter()
        .filter(|outcome| matches!(outcome, Err(error) if error.kind == ErrorKind::CLEANUP_IN_PROGRESS))
        .count();
    match (refused, &outcomes[..]) {
        (1, _) => {}
        (_, [Ok(()), Ok(())]) if !overlapped => return Ok(Race::Sequential),
        (_, [Ok(()), Ok(())]) => {
            return Err(failed("two releases of the same lease at once both succeeded"));
        }
        _ => {
            let shown: Vec<String> = outcomes
                .iter()
                .map(|outcome| match outcome {
                    Ok(()) => "ok".to_owned(),
                    Err(error) => format!("{} [{}]", error.message, error.kind),
                })
                .collect();
            return Err(failed(format!(
                "two releases at once ended {}; expected one to be refused with cleanup_in_progress",
                shown.join(" and ")
            )));
        }
    }
    let stopped = match done.recv_timeout(WAIT) {
        Ok(Ok(result)) => result.exit_code.into_option() != Some(0),
        Ok(Err(_)) => true,
        Err(_) => false,
    };
    if !stopped {
        return Err(failed(format!(
            "the command running in the lease was not stopped by the release ({} s later)",
            WAIT.as_secs()
        )));
    }
    held.destroy()?;
    Ok(Race::Refused)
}

/// Starts a grandchild that would run for a minute, records its pid, prints
/// a line and waits.
const OUTLIVING_SCRIPT: &str = "sleep 60 & echo $! > .conform-pid; printf 'conform-partial\\n'; wait";

/// Prints `gone` unless the recorded process still runs (a zombie counts as
/// gone: it has ended and only waits to be reaped).
const GONE_SCRIPT: &str = "pid=$(cat .conform-pid) || exit 3
if kill -0 \"$pid\" 2>/dev/null; then
  state=$(sed -n 's/^[^)]*) \\(.\\).*/\\1/p' /proc/\"$pid\"/stat 2>/dev/null)
  if [ \"$state\" = Z ]; then echo gone; else echo alive; fi
else
  echo gone
fi";

fn timeout(ctx: &Ctx) -> Result<String, Verdict> {
    let mut held = ctx.acquire()?;
    let started = Instant::now();
    let streamed = Arc::new(Mutex::new(Streamed::default()));
    let (ctx2, params, sink) = (ctx.clone(), held.params(), collecting(&streamed));
    let result = bounded(Duration::from_millis(COMMAND_TIMEOUT_MS) + TIMEOUT_SLACK, move || {
        ctx2.shell(params, OUTLIVING_SCRIPT, Some(COMMAND_TIMEOUT_MS), sink)
    })
    .ok_or_else(|| {
        let slack = TIMEOUT_SLACK.as_secs();
        failed(format!("execute with a {COMMAND_TIMEOUT_MS} ms timeout had not returned {slack} s later"))
    })?;
    let elapsed = started.elapsed();
    let result = result.map_err(hook_failed("execute of a command that outlives its timeout"))?;
    if !result.timed_out || result.exit_code.is_some() {
        return Err(failed(format!(
            "a command that outlived its timeout came back with timed out {} and exit code {:?}",
            result.timed_out,
            result.exit_code.into_option()
        )));
    }
    if !result.stdout.contains("conform-partial")
        || !text(&locked(&streamed), OutputStream::Stdout).contains("conform-partial")
    {
        return Err(failed("the timed-out command's partial output was lost"));
    }
    let state = ctx.sh_ok(&held.lease, GONE_SCRIPT)?;
    if state.trim() != "gone" {
        return Err(failed("a process the timed-out command started is still running"));
    }
    held.destroy()?;
    Ok(format!("returned after {:.1} s", elapsed.as_secs_f64()))
}

fn many_leases(ctx: &Ctx) -> Result<String, Verdict> {
    let barrier = Barrier::new(CONCURRENT_LEASES);
    let lease = |index: usize| -> Result<(), Verdict> {
        let token = format!("conform-token-{index}-{}", std::process::id());
        let acquired = ctx.acquire();
        // Every lease is held before any writes: they all exist at once.
        barrier.wait();
        let mut held = acquired?;
        let wrote =
            ctx.sh_ok(&held.lease, &format!("printf %s {token} > .conform-token && cat .conform-token"))?;
        let read = ctx.sh_ok(&held.lease, "cat .conform-token")?;
        held.destroy()?;
        if wrote != token || read != token {
            let id = held.id();
            return Err(failed(format!("lease {id} wrote {token:?} and then saw {wrote:?} / {read:?}")));
        }
        Ok(())
    };
    let problems: Vec<Verdict> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..CONCURRENT_LEASES).map(|index| scope.spawn(move || lease(index))).collect();
        let joined = workers.into_iter().map(|worker| worker.join());
        joined
            .filter_map(|outcome| outcome.unwrap_or_else(|_| Err(failed("a lease's thread panicked"))).err())
            .collect()
    });
    match problems.first() {
        None => Ok(format!("{CONCURRENT_LEASES} leases at once")),
        Some(first) => Err(failed(format!(
            "{} of {CONCURRENT_LEASES} leases went wrong; first: {}",
            problems.len(),
            first.parts().1
        ))),
    }
}

/// A script shown in a one-line message: its words, at most 80 characters.
fn one_line(script: &str) -> String {
    let words = script.split_whitespace().collect::<Vec<_>>().join(" ");
    match words.char_indices().nth(80) {
        Some((cut, _)) => format!("{}...", &words[..cut]),
        None => words,
    }
}

fn recorder_panic(ctx: &Ctx) -> Result<String, Verdict> {
    let (outcome, moments) = ctx.acquire_recorded(true);
    let created = moments.iter().find_map(|moment| match moment {
        Moment::Created(lease) => Some(ctx.hold(lease.clone())),
        Moment::Sending => None,
    });
    if moments.first() != Some(&Moment::Sending) {
        return Err(failed("acquire_lease did not report its creation request before it left"));
    }
    match (outcome, &created) {
        (_, None) => Err(failed("acquire_lease never handed the lease to the recorder")),
        (Ok(lease), Some(_)) => {
            drop(ctx.hold(lease));
            Err(failed("acquire_lease succeeded although the host's recorder failed"))
        }
        (Err(error), Some(held)) => {
            if error.kind != ErrorKind::INTERNAL {
                return Err(failed(format!(
                    "acquire_lease failed with {} ({}) instead of the recorder's internal error",
                    error.kind, error.message
                )));
            }
            ctx.expect_expired(held, "an unrecorded")?;
            Ok("the hook failed with the recorder's error and deleted its lease".into())
        }
    }
}

fn sink_panic(ctx: &Ctx) -> Result<String, Verdict> {
    let mut held = ctx.acquire()?;
    let script = "printf conform-a; printf conform-b >&2; exit 3";
    let explode = ByteSink::new(|_: OutputStream, _: &[u8]| std::panic::panic_any(DELIBERATE_PANIC));
    let result = ctx
        .shell(held.params(), script, Some(30_000), explode)
        .map_err(hook_failed("execute with a panicking output sink"))?;
    if result.exit_code.into_option() != Some(3)
        || result.stdout != "conform-a"
        || result.stderr != "conform-b"
    {
        return Err(failed(format!(
            "with a panicking sink, execute returned exit code {:?}, stdout {:?}, stderr {:?}",
            result.exit_code.into_option(),
            result.stdout.as_str(),
            result.stderr.as_str()
        )));
    }
    held.destroy()?;
    Ok(String::new())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::Summary;

    #[test]
    fn every_contract_sentence_is_the_guides_word_for_word() {
        let guide =
            include_str!("../../docs/writing-a-provider.md").split_whitespace().collect::<Vec<_>>().join(" ");
        for check in CHECKS {
            assert!(guide.contains(check.contract), "the guide lacks the sentence of `{}`", check.name);
        }
    }

    #[test]
    fn a_failure_line_names_the_check_and_its_contract_sentence() {
        let check = CHECKS.iter().find(|check| check.name == "destroy-twice").unwrap();
        let report = CheckReport {
            name: check.name,
            contract: check.contract,
            verdict: Verdict::Failed("the second destroy_lease failed".into()),
            duration: Duration::from_millis(3),
        };
        let line = report.to_line();
        assert!(line.starts_with("FAIL destroy-twice "), "{line}");
        assert!(
            line.ends_with("(contract: Destroying a lease that is already gone is not an error.)"),
            "{line}"
        );
        assert!(!line.contains('\n'));
        assert_eq!(report.to_json()["status"], "failed");
        let summary = Summary::of(&[report]);
        assert_eq!(summary, Summary { passed: 0, failed: 1, skipped: 0 });
        assert!(summary.to_line().ends_with("the provider does NOT conform"));
    }

    #[test]
    fn scripts_in_messages_are_one_line() {
        assert_eq!(one_line(GONE_SCRIPT).lines().count(), 1);
        assert!(one_line(GONE_SCRIPT).ends_with("..."));
        assert_eq!(one_line("printf  ok\n"), "printf ok");
    }

    #[test]
    fn check_names_are_unique() {
        let mut names: Vec<&str> = CHECKS.iter().map(|check| check.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), CHECKS.len());
    }
}
