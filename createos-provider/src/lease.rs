//! The lease hooks: acquire, resume, release, destroy, probe, realize and
//! inspect, exactly as `createos-api.md` ("Lease semantics") describes.

use crate::{
    client::{CallOptions, CreateosClient},
    config::ProviderConfig,
    error::{op, Error, ErrorKind},
    metadata::{LeaseMetadata, MARKER_PATH, REMOTE_CWD, RUNTIME_DIR},
    pacer::Priority,
    registry::{LeaseScope, Registry},
    transition::{self, transition, Desired, Estimates, Lifecycle},
};
use provider_abi::{
    AcquireParams, CreationRecorder, EnvironmentParams, Lease, LeaseParams, LeaseStatus, ProbeReport,
    ReleaseReport, Workspace,
};
use serde_json::json;
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// What every hook needs: the HTTP client (one connection pool per provider
/// instance), the lease registry and the shutdown signal. Clones share all
/// three.
#[derive(Clone)]
pub struct Context {
    /// The shared HTTP client.
    pub http: reqwest::Client,
    /// Closing, unconfirmed and running-command state.
    pub registry: Registry,
    /// Cancelled by `shutdown`: every command stops.
    pub shutdown: CancellationToken,
}

/// A lease hook's view of its lease: the parsed configuration, the checked
/// metadata, the sandbox id and the registry key.
pub struct OwnedLease {
    /// The provider configuration.
    pub config: ProviderConfig,
    /// The lease metadata, checked against the environment.
    pub metadata: LeaseMetadata,
    /// The sandbox id.
    pub sandbox_id: String,
    /// The registry key of the lease.
    pub scope: LeaseScope,
}

impl Context {
    /// A client for `config`, sharing this instance's connection pool and the
    /// process-wide pacer of the config's origin and key.
    pub fn client(&self, config: &ProviderConfig) -> Result<CreateosClient, Error> {
        CreateosClient::new(config, self.http.clone())
    }

    /// Parses the configuration, checks the lease id's form, that the lease
    /// belongs to this environment and that its record's binding verifies
    /// (see `metadata.rs`); sends no request. `Ok(None)` when there is no
    /// lease id.
    pub fn own(&self, params: &LeaseParams) -> Result<Option<OwnedLease>, Error> {
        let config = parse_config(&params.env)?;
        let Some(sandbox_id) = params.provider_lease_id.as_ref().into_option() else {
            return Ok(None);
        };
        // A malformed id is refused here, before any hook acts on it: a
        // request that was never sent must not read as an unconfirmed one.
        crate::client::check_id(sandbox_id, "sandbox")?;
        let metadata = LeaseMetadata::owned(&params.metadata_json, sandbox_id, &params.env, &config)?;
        let scope = LeaseScope {
            origin: config.origin(),
            company_id: metadata.company_id.clone(),
            environment_id: metadata.environment_id.clone(),
            sandbox_id: sandbox_id.to_string(),
        };
        Ok(Some(OwnedLease { config, metadata, sandbox_id: sandbox_id.to_string(), scope }))
    }

    /// Like [`Context::own`], but a lease id is required.
    pub fn own_required(&self, params: &LeaseParams) -> Result<OwnedLease, Error> {
        self.own(params)?.ok_or_else(|| Error::invalid_input("CreateOS lease has no provider lease id."))
    }
}

/// Parses the provider configuration of a hook.
pub fn parse_config(env: &EnvironmentParams) -> Result<ProviderConfig, Error> {
    let value: serde_json::Value = serde_json::from_str(&env.config_json).map_err(|_| {
        Error::invalid_config("Invalid CreateOS config: the configuration is not valid JSON.")
    })?;
    ProviderConfig::from_json(&value)
}

fn deadline(config: &ProviderConfig) -> Instant {
    Instant::now() + Duration::from_millis(config.timeout_ms)
}

/// `acquire_lease`: tell `recorder` right before the creation request
/// leaves, create a sandbox, hand it to `recorder` the moment its id is known, wait for `running`, prepare the workspace and write the
/// marker; on any failure delete the sandbox.
pub async fn acquire(
    ctx: &Context,
    params: &AcquireParams,
    recorder: &mut CreationRecorder,
) -> Result<Lease, Error> {
    let config = parse_config(&params.env)?;
    if params.requested_expires_at.is_some() {
        return Err(Error::invalid_input(
            "CreateOS leases cannot honour requestedExpiresAt: CreateOS has no guaranteed expiry.",
        ));
    }
    let client = ctx.client(&config)?;
    let (id, metadata) = create_lease(&client, &config, &params.env, recorder).await?;
    Ok(lease_of(&id, &metadata, &config))
}

/// The lease a host holds for sandbox `id`, its record bound to the sandbox:
/// what `acquire_lease` returns and what the write-ahead record carries, so a
/// host can destroy either.
fn lease_of(id: &str, metadata: &LeaseMetadata, config: &ProviderConfig) -> Lease {
    Lease {
        provider_lease_id: Some(id.into()).into(),
        metadata_json: metadata.clone().bind(id, config).to_json().into(),
        expires_at: None.into(),
        expired: false,
    }
}

/// The work of `acquire_lease` (and of `probe`): once admitted, create a
/// sandbox (the host hears of the request right before it leaves), have the
/// host record it, wait for `running`, prepare the
/// workspace and write the marker; on any failure (the host's record
/// included) delete the sandbox. Returns its id and the lease metadata.
async fn create_lease(
    client: &CreateosClient,
    config: &ProviderConfig,
    env: &EnvironmentParams,
    recorder: &mut CreationRecorder,
) -> Result<(String, LeaseMetadata), Error> {
    let _admission = admit(client, config).await?;
    let metadata = LeaseMetadata::new(env, config);
    let id = create_sandbox(client, config, recorder).await?;
    tracing::info!(sandbox = %id, shape = %config.shape, "CreateOS sandbox created");
    let prepared = match recorder.record(&lease_of(&id, &metadata, config)).await {
        Ok(()) => {
            let estimates = Estimates::shared(&config.origin());
            prepare_workspace(client, &id, &metadata, deadline(config), &estimates).await
        }
        Err(refusal) => Err(Error::NotRecorded { sandbox: id.clone(), reason: refusal.message.to_string() }),
    };
    match prepared {
        Ok(()) => Ok((id, metadata)),
        Err(error) => Err(match delete_sandbox(client, &id, config).await {
            Ok(()) => error,
            Err(_) => Error::SandboxCleanupUnconfirmed(id.clone()),
        }),
    }
}

/// How many `timeoutMs` a new acquisition may wait for admission behind
/// work already in flight before it gives up. Waiting costs nothing
/// remotely: nothing is sent before admission.
pub const ADMISSION_PATIENCE: u32 = 4;

/// The share of `timeoutMs` the request backlog may represent when new work
/// is admitted: an acquisition makes about two sequential requests and a
/// whole lifecycle about fourteen, so a backlog of a tenth of the deadline
/// keeps every admitted operation's requests well inside it.
pub const ADMISSION_SHARE_OF_TIMEOUT: u32 = 10;

/// Waits until the shared budget can carry one more new operation (an
/// acquisition or a command); the admitted work then runs at in-flight
/// priority.
pub(crate) async fn admit(
    client: &CreateosClient,
    config: &ProviderConfig,
) -> Result<impl Sized + Send, Error> {
    let timeout = Duration::from_millis(config.timeout_ms);
    let horizon = timeout / ADMISSION_SHARE_OF_TIMEOUT;
    tokio::time::timeout(timeout * ADMISSION_PATIENCE, client.pacer().admit_new_work(horizon))
        .await
        .map_err(|_| Error::NotSent(op::SANDBOX_LIFECYCLE))
}

/// `POST /sandboxes`, whose lost reply would leak a sandbox nobody can name:
/// any failure after the request was sent that is not a plain refusal is
/// "creation unconfirmed"; a request that never left (no connection could be
/// made, its deadline passed in the pacer, or the host refused to record
/// that it leaves) created nothing. It runs after admission, so it is work
/// under way (in-flight priority), not new work that in-flight requests may
/// starve.
async fn create_sandbox(
    client: &CreateosClient,
    config: &ProviderConfig,
    recorder: &mut CreationRecorder,
) -> Result<String, Error> {
    let options = CallOptions::new(deadline(config), Priority::InFlight);
    client
        .create_sandbox(&config.shape, config.rootfs.as_deref(), config.region.as_deref(), options, recorder)
        .await
        .map_err(|error| match error.http_status() {
            _ if error.is_not_sent() || error.is_unreachable() => error,
            Some(status) if (400..500).contains(&status) => error,
            _ => Error::SandboxCreationUnconfirmed,
        })
}

/// The workspace preparation `exec` runs: `mkdir -p` the runtime directory,
/// then write the marker (`$2`) to its path (`$3`) with no newline. One
/// request instead of an `exec` and a `PUT /files`; every value is a
/// positional argument, never part of the script.
pub const PREPARE_SCRIPT: &str = r#"mkdir -p -- "$1" && printf %s "$2" > "$3""#;

/// Waits for `running`, then prepares the workspace and writes the marker
/// in one `exec`. The `exec` itself is the first poll, at the learnt
/// schedule (the creation reply already said `creating`): a command that
/// ran proves the sandbox runs, so when the schedule was right no state is
/// read at all; when it was early, the state is polled as usual and the
/// `exec` (repeatable: `mkdir -p`, the same marker) sent again once running.
async fn prepare_workspace(
    client: &CreateosClient,
    id: &str,
    metadata: &LeaseMetadata,
    deadline: Instant,
    estimates: &Estimates,
) -> Result<(), Error> {
    let options = CallOptions::new(deadline, Priority::InFlight);
    let args = ["-c", PREPARE_SCRIPT, "sh", RUNTIME_DIR, &metadata.marker, MARKER_PATH].map(String::from);
    let prepare = || client.exec(id, "/bin/sh", &args, options);
    let prepared =
        transition::created_then(client, id, deadline, Priority::InFlight, estimates, prepare).await?;
    if prepared.exit_code != 0 {
        return Err(Error::WorkspaceCommandFailed(prepared.exit_code));
    }
    Ok(())
}

/// How many times a cleanup delete is sent before its failure is reported.
pub const DELETE_ATTEMPTS: u32 = 3;
/// The pause before the first repeat of a failed delete; it doubles after.
pub const DELETE_RETRY_DELAY: Duration = Duration::from_millis(250);

/// Deletes a sandbox at cleanup priority under a fresh deadline (the
/// operation's own may be what just ran out). DELETE is idempotent (404
/// counts as gone), so a failure whose outcome is unknown (5xx, 429, a lost
/// or malformed reply) is sent again, up to [`DELETE_ATTEMPTS`] times: a
/// sandbox left behind here may be one no host can name. A repeat that the
/// deadline cuts short says nothing new: the failure the API reported
/// before it is the one reported.
async fn delete_sandbox(client: &CreateosClient, id: &str, config: &ProviderConfig) -> Result<(), Error> {
    let deadline = deadline(config);
    let mut delay = DELETE_RETRY_DELAY;
    let mut attempt = 1;
    let mut reported = None;
    loop {
        let result = match client.delete_sandbox(id, CallOptions::new(deadline, Priority::Cleanup)).await {
            Err(error) if error.kind() == ErrorKind::TIMEOUT && Instant::now() >= deadline => {
                Err(reported.take().unwrap_or(error))
            }
            result => result,
        };
        let worth_repeating =
            matches!(&result, Err(error) if error.is_transient() || error.kind() == ErrorKind::PROTOCOL);
        if !worth_repeating || attempt == DELETE_ATTEMPTS || Instant::now() + delay >= deadline {
            return result;
        }
        reported = result.err();
        tokio::time::sleep(delay).await;
        delay *= 2;
        attempt += 1;
    }
}

/// An expired lease: the host must acquire a new one.
fn expired(params: &LeaseParams) -> Lease {
    Lease {
        provider_lease_id: None.into(),
        metadata_json: params.metadata_json.clone(),
        expires_at: None.into(),
        expired: true,
    }
}

/// `resume_lease`: bring a paused lease back to `running` and check its
/// marker. 404, `destroyed`/`failed`, a changed configuration or a marker that
/// does not match expire the lease; transient failures are errors and
/// delete nothing.
pub async fn resume(ctx: &Context, params: &LeaseParams) -> Result<Lease, Error> {
    let Some(lease) = ctx.own(params)? else {
        return Ok(expired(params));
    };
    ctx.registry.accepts_work(&lease.scope)?;
    if lease.metadata.config_changed(&lease.config) || !lease.metadata.marker_is_well_formed() {
        return Ok(expired(params));
    }
    let client = ctx.client(&lease.config)?;
    let deadline = deadline(&lease.config);
    let estimates = Estimates::shared(&lease.config.origin());
    match transition(&client, &lease.sandbox_id, Desired::Running, deadline, Priority::InFlight, &estimates)
        .await
    {
        Ok(()) => {}
        Err(error) if error.is_not_found() || error.is_terminal_state() => return Ok(expired(params)),
        Err(error) => return Err(error),
    }
    let options = CallOptions::new(deadline, Priority::InFlight);
    let (mut marker, ours) = (Vec::new(), lease.metadata.marker.as_bytes());
    let read = client.get_file_into(&lease.sandbox_id, MARKER_PATH, &mut marker, ours.len() as u64, options);
    match read.await {
        Ok(_) if marker == ours => Ok(Lease {
            provider_lease_id: params.provider_lease_id.clone(),
            expired: false,
            ..expired(params)
        }),
        // Another marker, or one longer than ours (`UnsafeArchive`: past the cap).
        Ok(_) | Err(Error::UnsafeArchive) => Ok(expired(params)),
        Err(error) if error.is_not_found() => Ok(expired(params)),
        Err(error) => Err(error),
    }
}

/// `release_lease` (`destroy = false`) and `destroy_lease` (`destroy =
/// true`): the release rule. Stops the lease's commands first; deletes
/// when destroying or not reusing (clearing the unconfirmed flag); refuses to
/// pause an unconfirmed lease; pauses otherwise (404 tolerated before the
/// pause is submitted). A pause that cannot be confirmed marks the lease
/// unconfirmed.
///
/// Reports whether the lease was kept (paused, resumable): a lease without
/// a sandbox, a deleted one and one already gone before the pause was
/// submitted are not.
pub async fn release(ctx: &Context, params: &LeaseParams, destroy: bool) -> Result<ReleaseReport, Error> {
    const DELETED: ReleaseReport = ReleaseReport { kept: false };
    let Some(lease) = ctx.own(params)? else {
        return Ok(DELETED);
    };
    let _closing = ctx.registry.begin_closing(&lease.scope)?;
    ctx.registry.stop_commands(&lease.scope).await;
    let client = ctx.client(&lease.config)?;
    if destroy || !lease.config.reuse_lease {
        delete_sandbox(&client, &lease.sandbox_id, &lease.config).await?;
        ctx.registry.clear_unconfirmed(&lease.scope);
        return Ok(DELETED);
    }
    if ctx.registry.is_unconfirmed(&lease.scope) {
        return Err(Error::CleanupUnconfirmed);
    }
    let paused = transition(
        &client,
        &lease.sandbox_id,
        Desired::Paused,
        deadline(&lease.config),
        Priority::Cleanup,
        &Estimates::shared(&lease.config.origin()),
    )
    .await;
    match paused {
        Ok(()) => {
            tracing::info!(sandbox = %lease.sandbox_id, "CreateOS sandbox paused for reuse");
            Ok(ReleaseReport { kept: true })
        }
        // Gone before the pause was submitted (after it, the transition
        // reports that the sandbox did not reach `paused`).
        Err(error) if error.is_not_found() => Ok(DELETED),
        Err(error) => {
            ctx.registry.mark_unconfirmed(&lease.scope);
            Err(Error::PauseUnconfirmed(Box::new(error)))
        }
    }
}

/// `realize_workspace`: where commands run; sends no request.
pub fn realize(ctx: &Context, params: &LeaseParams) -> Result<Workspace, Error> {
    let lease = ctx.own_required(params)?;
    Ok(Workspace {
        cwd: REMOTE_CWD.into(),
        metadata_json: json!({"sandboxId": lease.sandbox_id, "remoteCwd": REMOTE_CWD}).to_string().into(),
    })
}

/// `import_unconfirmed`: the host hands over a lease whose cleanup
/// another version of this provider could not confirm; from now on it can
/// only be destroyed, as if this version had marked it. Sends no request.
pub fn import_unconfirmed(ctx: &Context, params: &LeaseParams) -> Result<(), Error> {
    ctx.registry.mark_unconfirmed(&ctx.own_required(params)?.scope);
    Ok(())
}

/// `inspect_lease`: the sandbox's state, without changing it.
pub async fn inspect(ctx: &Context, params: &LeaseParams) -> Result<LeaseStatus, Error> {
    let lease = ctx.own_required(params)?;
    let unconfirmed = ctx.registry.is_unconfirmed(&lease.scope);
    let client = ctx.client(&lease.config)?;
    let options = CallOptions::new(deadline(&lease.config), Priority::InFlight);
    match client.get_sandbox(&lease.sandbox_id, options).await {
        Ok(state) => Ok(LeaseStatus { exists: true, state: state.into(), unconfirmed }),
        Err(error) if error.is_not_found() => {
            Ok(LeaseStatus { exists: false, state: "".into(), unconfirmed })
        }
        Err(error) => Err(error),
    }
}

/// The command `probe` runs, and what it must print.
pub const PROBE_COMMAND: &str = "/bin/echo";
/// The probe command's expected output.
pub const PROBE_OUTPUT: &str = "paperclip-createos-ready";

/// `probe`: acquire a lease, run a real command, check its output, and
/// always delete the sandbox; a failed delete is reported.
pub async fn probe(
    ctx: &Context,
    env: &EnvironmentParams,
    recorder: &mut CreationRecorder,
) -> Result<ProbeReport, Error> {
    let config = parse_config(env)?;
    let client = ctx.client(&config)?;
    let (id, _) = create_lease(&client, &config, env, recorder).await?;
    let started = Instant::now();
    let options = CallOptions::new(deadline(&config), Priority::InFlight);
    let ran = client.exec(&id, PROBE_COMMAND, &[PROBE_OUTPUT.into()], options).await;
    let deleted = delete_sandbox(&client, &id, &config).await;
    let ran = ran?;
    deleted.map_err(|_| Error::SandboxCleanupUnconfirmed(id.clone()))?;
    let ok = ran.exit_code == 0 && ran.stdout.trim() == PROBE_OUTPUT;
    Ok(ProbeReport {
        ok,
        message: if ok {
            "CreateOS sandbox ran a command and was deleted.".into()
        } else {
            "CreateOS probe command did not print the expected output.".into()
        },
        metadata_json: json!({
            "sandboxId": id,
            "shape": config.shape,
            "exitCode": ran.exit_code,
            "commandMs": started.elapsed().as_millis() as u64,
        })
        .to_string()
        .into(),
    })
}
