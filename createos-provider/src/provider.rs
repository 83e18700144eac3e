//! The CreateOS provider behind the ABI: owns its tokio runtime, blocks the
//! calling host thread on each hook, and converts errors once, here.

use crate::{
    client::build_http_client,
    config::{self, config_schema},
    error::{Error, ErrorKind},
    lease::{self, Context},
    registry::Registry,
};
use provider_abi::{
    AcquireParams, ByteSink, CreationRecorder, EnvironmentParams, ExecuteParams, ExecuteResult, HealthReport,
    Hook, HookResult, Lease, LeaseParams, LeaseStatus, LogLevel, LogSink, Manifest, OutputSink, ProbeReport,
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
}

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
}

impl Drop for CreateosProvider {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}
