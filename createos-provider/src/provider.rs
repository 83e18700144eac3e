//! The CreateOS provider behind the ABI: owns its tokio runtime, blocks the
//! calling host thread on each blocking hook, spawns the work of each async
//! hook (ABI 1.7 and 1.8) on that runtime, and converts errors once, here.
//!
//! Dropping an async hook's future cancels the call (see [`CreateosProvider`]'s
//! `spawn`): an acquire (recording or not) finishes its create, then deletes
//! the lease or marks it unconfirmed; a sync stops as release stops it (its
//! current request or post-upload command is cancelled, the command's
//! process tree terminated, the scratch file removed): files already moved
//! stay, a host file is replaced only whole (a temporary file renamed over
//! it), an extraction on the host is never interrupted, and the lease stays
//! usable unless a command's termination could not be confirmed, which marks
//! it unconfirmed exactly as a failed sync would.

use crate::{
    client::build_http_client,
    config::{self, config_schema},
    error::{Error, ErrorKind},
    handoff,
    lease::{self, Context, Record},
    registry::Registry,
};
use provider_abi::{
    ready, AcquireParams, AsyncCreationRecorder, ByteSink, CreationRecorder, EnvironmentParams,
    ExecuteParams, ExecuteResult, HealthReport, Hook, HookFuture, HookResult, Lease, LeaseParams,
    LeaseStatus, LogLevel, LogSink, Manifest, OutputSink, OwnedByteSink, OwnedByteSource, ProbeReport,
    Provider, ProviderError, ReleaseReport, SetupParams, SyncParams, SyncResult, ValidationReport, Workspace,
    ABI_VERSION,
};
use std::{future::Future, sync::OnceLock};
use tokio::runtime::Runtime;
use tokio_util::sync::CancellationToken;

/// The CreateOS sandbox provider.
#[derive(Default)]
pub struct CreateosProvider {
    runtime: OnceLock<Runtime>,
    context: OnceLock<Result<Context, ProviderError>>,
}

impl CreateosProvider {
    /// The provider's runtime: a small multi-thread tokio runtime of its own,
    /// created on first use. Leases never get a thread each.
    fn runtime(&self) -> &Runtime {
        self.runtime.get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("createos-provider")
                .enable_all()
                .build()
                .expect("the CreateOS provider cannot start its runtime")
        })
    }

    fn context(&self) -> HookResult<&Context> {
        self.context
            .get_or_init(|| {
                let http = build_http_client().map_err(to_abi)?;
                Ok(Context { http, registry: Registry::default(), shutdown: CancellationToken::new() })
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    /// Runs a hook's future to completion on the provider runtime, blocking
    /// the calling host thread.
    fn run<'a, T, F>(&'a self, hook: impl FnOnce(&'a Context) -> F) -> HookResult<T>
    where
        F: Future<Output = Result<T, Error>>,
    {
        let context = self.context()?;
        self.runtime().block_on(hook(context)).map_err(to_abi)
    }

    /// Spawns an async hook's work on the provider runtime and hands back a
    /// future of its result, which any executor may poll.
    ///
    /// The work gets a context of its own whose shutdown token is a child of
    /// the provider's: dropping the returned future before the result arrives
    /// cancels it, which stops a running command exactly as `shutdown` does
    /// (its process tree is terminated, or the lease marked unconfirmed).
    /// Everything else runs to its end on the provider runtime: a create
    /// learns its outcome, a delete is never abandoned half-way. A result
    /// nobody awaits any more, whether the future was dropped before it was
    /// sent or after it arrived unread, goes to `unclaimed` (an acquired
    /// lease is deleted there).
    fn spawn<T, F, U>(
        &self,
        work: impl FnOnce(Context) -> F,
        unclaimed: impl FnOnce(Context, T) -> U + Send + 'static,
    ) -> HookFuture<T>
    where
        T: Send + 'static,
        F: Future<Output = Result<T, Error>> + Send + 'static,
        U: Future<Output = ()> + Send + 'static,
    {
        let context = match self.context() {
            Ok(context) => context.clone(),
            Err(error) => return ready(Err(error)),
        };
        let call = Context { shutdown: context.shutdown.child_token(), ..context.clone() };
        let cancel_on_drop = call.shutdown.clone().drop_guard();
        let (giver, claim) = handoff::channel(self.runtime().handle().clone(), move |result| async move {
            if let Ok(value) = result {
                unclaimed(context, value).await;
            }
        });
        // Boxed, so that the work's state (4.5 KiB for an acquire) is freed
        // the moment it finishes: a tokio task's cell holds its future inline
        // and stays allocated while anything still holds a waker of the task.
        // Measured with heaptrack on a soak of 1,000 lifecycles in flight:
        // the peak heap fell from 55.3 to 50.3 MB.
        let task = Box::pin(work(call));
        self.runtime().spawn(async move { giver.give(task.await.map_err(to_abi)).await });
        Box::pin(async move {
            let result = claim.await;
            cancel_on_drop.disarm();
            result.unwrap_or_else(|| {
                Err(ProviderError::internal(
                    "The CreateOS provider's task ended without a result (it panicked, or the provider was dropped).",
                ))
            })
        })
    }
}

/// What an async hook whose result nobody claims leaves behind: nothing.
async fn keep<T>(_context: Context, _value: T) {}

/// The provider's version: the crate's, with `+TAG` for a build made with
/// `CREATEOS_PROVIDER_BUILD_TAG=TAG` (a second build to swap to, in tests and
/// benchmarks of hot swap).
fn version() -> String {
    match option_env!("CREATEOS_PROVIDER_BUILD_TAG") {
        Some(tag) if !tag.is_empty() => format!("{}+{tag}", env!("CARGO_PKG_VERSION")),
        _ => env!("CARGO_PKG_VERSION").to_owned(),
    }
}

/// The one conversion from the provider's errors to the ABI's.
pub fn to_abi(error: Error) -> ProviderError {
    let kind = match error.kind() {
        ErrorKind::InvalidConfig => provider_abi::ErrorKind::INVALID_CONFIG,
        ErrorKind::InvalidInput => provider_abi::ErrorKind::INVALID_INPUT,
        ErrorKind::NotThisEnvironment => provider_abi::ErrorKind::NOT_THIS_ENVIRONMENT,
        ErrorKind::CleanupInProgress => provider_abi::ErrorKind::CLEANUP_IN_PROGRESS,
        ErrorKind::CleanupUnconfirmed => provider_abi::ErrorKind::CLEANUP_UNCONFIRMED,
        ErrorKind::CreationUnconfirmed => provider_abi::ErrorKind::CREATION_UNCONFIRMED,
        ErrorKind::Api => provider_abi::ErrorKind::API,
        ErrorKind::Protocol => provider_abi::ErrorKind::PROTOCOL,
        ErrorKind::Connection => provider_abi::ErrorKind::CONNECTION,
        ErrorKind::Timeout => provider_abi::ErrorKind::TIMEOUT,
        ErrorKind::Cancelled => provider_abi::ErrorKind::CANCELLED,
        ErrorKind::Unsupported => provider_abi::ErrorKind::UNSUPPORTED,
        ErrorKind::Internal => provider_abi::ErrorKind::INTERNAL,
        ErrorKind::Unauthorized => provider_abi::ErrorKind::UNAUTHORIZED,
    };
    ProviderError::new(kind, error.to_string()).with_http(error.http_status(), error.operation())
}

impl Provider for CreateosProvider {
    fn manifest(&self) -> Manifest {
        Manifest {
            id: "createos".into(),
            version: version().into(),
            display_name: "CreateOS sandboxes".into(),
            driver_key: "createos".into(),
            abi_version: ABI_VERSION,
            hooks: Hook::ALL.iter().map(|hook| hook.name().into()).collect(),
            config_schema_json: config_schema().to_string().into(),
        }
    }

    fn setup(&self, _params: &SetupParams) -> HookResult<()> {
        self.runtime();
        self.context().map(|_| ())
    }

    fn setup_with_logs(&self, params: &SetupParams, logs: LogSink, max_level: LogLevel) -> HookResult<()> {
        crate::logs::install(logs, max_level);
        self.setup(params)
    }

    fn shutdown(&self) -> HookResult<()> {
        self.run(|context| async move {
            context.shutdown.cancel();
            context.registry.stop_all_commands().await;
            Ok(())
        })
    }

    fn health(&self) -> HookResult<HealthReport> {
        Ok(HealthReport {
            status: "ok".into(),
            message: "CreateOS provider loaded; probe an environment to check connectivity.".into(),
        })
    }

    fn validate_config(&self, params: &EnvironmentParams) -> HookResult<ValidationReport> {
        let value = serde_json::from_str::<serde_json::Value>(&params.config_json);
        let unknown = value.as_ref().map(config::unknown_key_warnings).unwrap_or_default();
        let parsed = value
            .map_err(|_| vec!["the configuration is not valid JSON.".to_owned()])
            .and_then(|value| config::validate(&value));
        tracing::debug!(valid = parsed.is_ok(), "CreateOS configuration checked");
        Ok(match parsed {
            Ok((config, warnings)) => ValidationReport {
                ok: true,
                normalized_config_json: Some(config.normalized_json().to_string().into()).into(),
                errors: Default::default(),
                warnings: warnings.into_iter().map(Into::into).collect(),
            },
            Err(errors) => ValidationReport {
                ok: false,
                normalized_config_json: None.into(),
                errors: errors.into_iter().map(Into::into).collect(),
                warnings: unknown.into_iter().map(Into::into).collect(),
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
        self.run(|context| lease::probe(context, params, recorder))
    }

    fn acquire_lease(&self, params: &AcquireParams) -> HookResult<Lease> {
        self.acquire_lease_recording(params, &mut CreationRecorder::discard())
    }

    fn acquire_lease_recording(
        &self,
        params: &AcquireParams,
        recorder: &mut CreationRecorder<'_>,
    ) -> HookResult<Lease> {
        self.run(|context| lease::acquire(context, params, recorder))
    }

    fn resume_lease(&self, params: &LeaseParams) -> HookResult<Lease> {
        self.run(|context| lease::resume(context, params))
    }

    fn release_lease(&self, params: &LeaseParams) -> HookResult<()> {
        self.release_lease_reporting(params).map(|_| ())
    }

    fn release_lease_reporting(&self, params: &LeaseParams) -> HookResult<ReleaseReport> {
        self.run(|context| lease::release(context, params, false))
    }

    fn destroy_lease(&self, params: &LeaseParams) -> HookResult<()> {
        self.run(|context| lease::release(context, params, true)).map(|_| ())
    }

    fn realize_workspace(&self, params: &LeaseParams) -> HookResult<Workspace> {
        self.context().and_then(|context| lease::realize(context, params).map_err(to_abi))
    }

    fn execute(&self, params: &ExecuteParams, output: &mut OutputSink<'_>) -> HookResult<ExecuteResult> {
        self.run(|context| crate::execute::execute(context, params, output))
    }

    fn execute_bytes(&self, params: &ExecuteParams, output: &mut ByteSink<'_>) -> HookResult<ExecuteResult> {
        self.run(|context| crate::execute::execute_bytes(context, params, output))
    }

    fn inspect_lease(&self, params: &LeaseParams) -> HookResult<LeaseStatus> {
        self.run(|context| lease::inspect(context, params))
    }

    /// ABI 1.6: every account's budget in this process is scaled to the
    /// share (see [`crate::pacer`]); sends no request.
    fn grant_request_share(&self, parts_per_million: u32) -> HookResult<()> {
        tracing::debug!(parts_per_million, "request share granted");
        crate::pacer::grant_share_to_all(parts_per_million);
        Ok(())
    }

    fn import_unconfirmed(&self, params: &LeaseParams) -> HookResult<()> {
        self.context().and_then(|context| lease::import_unconfirmed(context, params).map_err(to_abi))
    }

    fn sync_in(&self, params: &SyncParams) -> HookResult<SyncResult> {
        self.run(|context| crate::sync::sync_in(context, params))
    }

    fn sync_out(&self, params: &SyncParams) -> HookResult<SyncResult> {
        self.run(|context| crate::sync::sync_out(context, params))
    }

    fn health_async(&self) -> HookFuture<HealthReport> {
        ready(self.health())
    }

    fn probe_async(&self, params: EnvironmentParams) -> HookFuture<ProbeReport> {
        self.probe_async_with(params, CreationRecorder::discard())
    }

    fn probe_recording_async(
        &self,
        params: EnvironmentParams,
        recorder: AsyncCreationRecorder,
    ) -> HookFuture<ProbeReport> {
        self.probe_async_with(params, recorder)
    }

    fn acquire_lease_async(&self, params: AcquireParams) -> HookFuture<Lease> {
        self.acquire_async(params, CreationRecorder::discard())
    }

    fn acquire_lease_recording_async(
        &self,
        params: AcquireParams,
        recorder: AsyncCreationRecorder,
    ) -> HookFuture<Lease> {
        self.acquire_async(params, recorder)
    }

    fn sync_in_async(&self, params: SyncParams) -> HookFuture<SyncResult> {
        self.spawn(move |context| async move { crate::sync::sync_in(&context, &params).await }, keep)
    }

    fn sync_out_async(&self, params: SyncParams) -> HookFuture<SyncResult> {
        self.spawn(move |context| async move { crate::sync::sync_out(&context, &params).await }, keep)
    }

    fn resume_lease_async(&self, params: LeaseParams) -> HookFuture<Lease> {
        self.spawn(move |context| async move { lease::resume(&context, &params).await }, keep)
    }

    fn release_lease_async(&self, params: LeaseParams) -> HookFuture<ReleaseReport> {
        self.spawn(move |context| async move { lease::release(&context, &params, false).await }, keep)
    }

    fn destroy_lease_async(&self, params: LeaseParams) -> HookFuture<()> {
        self.spawn(
            move |context| async move { lease::release(&context, &params, true).await.map(|_| ()) },
            keep,
        )
    }

    fn execute_async(&self, params: ExecuteParams, output: OwnedByteSink) -> HookFuture<ExecuteResult> {
        self.spawn(
            move |context| async move { crate::execute::execute_owned(&context, &params, output).await },
            keep,
        )
    }

    fn execute_stdin_async(
        &self,
        params: ExecuteParams,
        stdin: OwnedByteSource,
        output: OwnedByteSink,
    ) -> HookFuture<ExecuteResult> {
        self.spawn(
            move |context| async move {
                crate::execute::execute_pulling(&context, &params, stdin, output).await
            },
            keep,
        )
    }
}

impl CreateosProvider {
    /// `probe_async` and `probe_recording_async`: the probe deletes its own
    /// sandbox, so a result nobody awaits leaves nothing behind.
    fn probe_async_with(
        &self,
        params: EnvironmentParams,
        mut recorder: impl Record + 'static,
    ) -> HookFuture<ProbeReport> {
        self.spawn(move |context| async move { lease::probe(&context, &params, &mut recorder).await }, keep)
    }

    /// `acquire_lease_async` and `acquire_lease_recording_async` (ABI 1.7,
    /// 1.8): the recorder is awaited right after the creation reply; on its
    /// refusal the sandbox is deleted (or the lease marked unconfirmed).
    fn acquire_async(&self, params: AcquireParams, mut recorder: impl Record + 'static) -> HookFuture<Lease> {
        let env = params.env.clone();
        let run_id = params.run_id.clone();
        self.spawn(
            move |context| async move { lease::acquire(&context, &params, &mut recorder).await },
            // The host dropped the future: nobody holds the lease, so it is
            // deleted (or marked unconfirmed if the delete cannot be confirmed).
            move |context, lease: Lease| async move {
                let params = LeaseParams {
                    env,
                    run_id,
                    provider_lease_id: lease.provider_lease_id,
                    metadata_json: lease.metadata_json,
                };
                if let Err(error) = lease::release(&context, &params, true).await {
                    tracing::warn!(error = %error, "CreateOS lease of a cancelled acquire could not be deleted");
                }
            },
        )
    }
}

impl Drop for CreateosProvider {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}
