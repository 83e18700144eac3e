//! A provider as the host holds it: loaded into this process, or served
//! elsewhere (a worker process the embedder plugs in behind
//! [`OutOfProcess`]); the same [`Provider`] trait and the same question,
//! which hooks this host can call on it.

use crate::provider_set::ProviderSet;
use provider_abi::{
    AcquireParams, CreationRecorder, EnvironmentParams, ExecuteParams, ExecuteResult, HealthReport, Hook,
    HookResult, Lease, LeaseParams, LeaseStatus, LoadedProvider, Manifest, OutputSink, ProbeReport, Provider,
    ProviderError, ReleaseReport, SetupParams, ValidationReport, Workspace,
};
use provider_abi::{
    AsyncCreationRecorder, ByteSink, HookFuture, LogLevel, LogSink, OwnedByteSink, OwnedByteSource,
    SyncParams, SyncResult,
};
use std::path::{Path, PathBuf};

/// A provider the host can ask which hooks it can call ([`crate::host::Host`]
/// falls back to older hooks when a newer one is missing).
pub trait HookSupport: Provider {
    /// True when this host can call `hook` on the provider.
    fn supports(&self, hook: Hook) -> bool;

    /// True when `error` says the way to the provider failed (a worker
    /// process died under the call), not the provider: whatever the hook
    /// had started, its cleanup is unknown.
    fn is_transport_failure(&self, _error: &ProviderError) -> bool {
        false
    }
}

impl HookSupport for LoadedProvider {
    fn supports(&self, hook: Hook) -> bool {
        LoadedProvider::supports(self, hook)
    }
}

/// A provider served outside this process (host-harness plugs in its
/// worker-process isolation here).
pub trait OutOfProcess: HookSupport {
    /// The library file the provider came from.
    fn library(&self) -> &Path;

    /// How many times the process serving it crashed.
    fn crashes(&self) -> u64;

    /// The provider as the host calls it (`self`).
    fn hooks(&self) -> &dyn HookSupport;
}

/// A provider in process or out of process, chosen at run time.
// One per host, held for its whole run: the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
pub enum HostedProvider {
    /// Loaded into this process: nanoseconds a call; a crash is the host's.
    Loaded(LoadedProvider),
    /// Served by another process (a worker): microseconds a call; a crash is
    /// that process's.
    Isolated(Box<dyn OutOfProcess>),
    /// Loaded into this process, versions side by side and one active: a
    /// running host swaps between them.
    Set(ProviderSet),
}

impl HostedProvider {
    /// The library file the provider (its active version) came from.
    pub fn path(&self) -> PathBuf {
        match self {
            HostedProvider::Loaded(provider) => provider.path().to_path_buf(),
            HostedProvider::Isolated(provider) => provider.library().to_path_buf(),
            HostedProvider::Set(set) => set.active().path().to_path_buf(),
        }
    }

    /// The same provider, swappable: a loaded one becomes the first version
    /// of a [`ProviderSet`]; one out of process stays as it is.
    pub fn swappable(self) -> HostedProvider {
        match self {
            HostedProvider::Loaded(provider) => HostedProvider::Set(ProviderSet::new(provider)),
            other => other,
        }
    }

    /// The provider set, when the provider is swappable.
    pub fn provider_set(&self) -> Option<&ProviderSet> {
        match self {
            HostedProvider::Set(set) => Some(set),
            _ => None,
        }
    }

    /// The provider behind the enum.
    fn inner(&self) -> &dyn HookSupport {
        match self {
            HostedProvider::Loaded(provider) => provider,
            HostedProvider::Isolated(provider) => provider.hooks(),
            HostedProvider::Set(set) => set,
        }
    }
}

impl HookSupport for HostedProvider {
    fn supports(&self, hook: Hook) -> bool {
        self.inner().supports(hook)
    }

    fn is_transport_failure(&self, error: &ProviderError) -> bool {
        self.inner().is_transport_failure(error)
    }
}

impl Provider for HostedProvider {
    fn manifest(&self) -> Manifest {
        self.inner().manifest()
    }

    fn setup(&self, params: &SetupParams) -> HookResult<()> {
        self.inner().setup(params)
    }

    fn shutdown(&self) -> HookResult<()> {
        self.inner().shutdown()
    }

    fn health(&self) -> HookResult<HealthReport> {
        self.inner().health()
    }

    fn validate_config(&self, params: &EnvironmentParams) -> HookResult<ValidationReport> {
        self.inner().validate_config(params)
    }

    fn probe(&self, params: &EnvironmentParams) -> HookResult<ProbeReport> {
        self.inner().probe(params)
    }

    fn acquire_lease(&self, params: &AcquireParams) -> HookResult<Lease> {
        self.inner().acquire_lease(params)
    }

    fn resume_lease(&self, params: &LeaseParams) -> HookResult<Lease> {
        self.inner().resume_lease(params)
    }

    fn release_lease(&self, params: &LeaseParams) -> HookResult<()> {
        self.inner().release_lease(params)
    }

    fn destroy_lease(&self, params: &LeaseParams) -> HookResult<()> {
        self.inner().destroy_lease(params)
    }

    fn realize_workspace(&self, params: &LeaseParams) -> HookResult<Workspace> {
        self.inner().realize_workspace(params)
    }

    fn execute(&self, params: &ExecuteParams, output: &mut OutputSink<'_>) -> HookResult<ExecuteResult> {
        self.inner().execute(params, output)
    }

    fn inspect_lease(&self, params: &LeaseParams) -> HookResult<LeaseStatus> {
        self.inner().inspect_lease(params)
    }

    fn acquire_lease_recording(
        &self,
        params: &AcquireParams,
        recorder: &mut CreationRecorder<'_>,
    ) -> HookResult<Lease> {
        self.inner().acquire_lease_recording(params, recorder)
    }

    fn probe_recording(
        &self,
        params: &EnvironmentParams,
        recorder: &mut CreationRecorder<'_>,
    ) -> HookResult<ProbeReport> {
        self.inner().probe_recording(params, recorder)
    }

    fn release_lease_reporting(&self, params: &LeaseParams) -> HookResult<ReleaseReport> {
        self.inner().release_lease_reporting(params)
    }

    fn execute_bytes(&self, params: &ExecuteParams, output: &mut ByteSink<'_>) -> HookResult<ExecuteResult> {
        self.inner().execute_bytes(params, output)
    }

    fn setup_with_logs(&self, params: &SetupParams, logs: LogSink, max_level: LogLevel) -> HookResult<()> {
        self.inner().setup_with_logs(params, logs, max_level)
    }

    fn sync_in(&self, params: &SyncParams) -> HookResult<SyncResult> {
        self.inner().sync_in(params)
    }

    fn sync_out(&self, params: &SyncParams) -> HookResult<SyncResult> {
        self.inner().sync_out(params)
    }

    fn import_unconfirmed(&self, params: &LeaseParams) -> HookResult<()> {
        self.inner().import_unconfirmed(params)
    }

    fn grant_request_share(&self, parts_per_million: u32) -> HookResult<()> {
        self.inner().grant_request_share(parts_per_million)
    }

    fn health_async(&self) -> HookFuture<HealthReport> {
        self.inner().health_async()
    }

    fn probe_async(&self, params: EnvironmentParams) -> HookFuture<ProbeReport> {
        self.inner().probe_async(params)
    }

    fn acquire_lease_async(&self, params: AcquireParams) -> HookFuture<Lease> {
        self.inner().acquire_lease_async(params)
    }

    fn resume_lease_async(&self, params: LeaseParams) -> HookFuture<Lease> {
        self.inner().resume_lease_async(params)
    }

    fn release_lease_async(&self, params: LeaseParams) -> HookFuture<ReleaseReport> {
        self.inner().release_lease_async(params)
    }

    fn destroy_lease_async(&self, params: LeaseParams) -> HookFuture<()> {
        self.inner().destroy_lease_async(params)
    }

    fn execute_async(&self, params: ExecuteParams, output: OwnedByteSink) -> HookFuture<ExecuteResult> {
        self.inner().execute_async(params, output)
    }

    fn execute_stdin_async(
        &self,
        params: ExecuteParams,
        stdin: OwnedByteSource,
        output: OwnedByteSink,
    ) -> HookFuture<ExecuteResult> {
        self.inner().execute_stdin_async(params, stdin, output)
    }

    fn acquire_lease_recording_async(
        &self,
        params: AcquireParams,
        recorder: AsyncCreationRecorder,
    ) -> HookFuture<Lease> {
        self.inner().acquire_lease_recording_async(params, recorder)
    }

    fn probe_recording_async(
        &self,
        params: EnvironmentParams,
        recorder: AsyncCreationRecorder,
    ) -> HookFuture<ProbeReport> {
        self.inner().probe_recording_async(params, recorder)
    }

    fn sync_in_async(&self, params: SyncParams) -> HookFuture<SyncResult> {
        self.inner().sync_in_async(params)
    }

    fn sync_out_async(&self, params: SyncParams) -> HookFuture<SyncResult> {
        self.inner().sync_out_async(params)
    }
}
