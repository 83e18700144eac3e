//! The provider trait: one trait for linked-in and loaded providers alike.

use crate::{
    error::{HookResult, ProviderError},
    future::{ready, HookFuture},
    log::{LogLevel, LogSink},
    recorder::{AsyncCreationRecorder, CreationRecorder},
    sink::{ByteSink, OutputSink, OwnedByteSink},
    source::OwnedByteSource,
    sync::{SyncParams, SyncResult},
    types::*,
    version::Hook,
};

/// The hooks of a sandbox provider.
///
/// A provider implements it and exports it with [`crate::export_provider!`];
/// a host calls it on the provider type directly or on a
/// [`crate::LoadedProvider`], which implements it too. Hooks block the calling
/// thread and may be called from many threads at once.
pub trait Provider: Send + Sync + 'static {
    /// Identity, version, hooks and configuration schema.
    fn manifest(&self) -> Manifest;

    /// Called once after loading, before any other hook.
    fn setup(&self, _params: &SetupParams) -> HookResult<()> {
        Ok(())
    }

    /// Cancels work in flight and releases the provider's resources.
    fn shutdown(&self) -> HookResult<()> {
        Ok(())
    }

    /// Cheap liveness check; sends no request.
    fn health(&self) -> HookResult<HealthReport>;

    /// Checks a configuration, reporting every problem at once.
    fn validate_config(&self, params: &EnvironmentParams) -> HookResult<ValidationReport>;

    /// Acquires a lease, runs a real command in it and always destroys it.
    fn probe(&self, params: &EnvironmentParams) -> HookResult<ProbeReport>;

    /// Creates a lease for a run.
    fn acquire_lease(&self, params: &AcquireParams) -> HookResult<Lease>;

    /// Makes a released (paused) lease usable again, or reports it expired.
    fn resume_lease(&self, params: &LeaseParams) -> HookResult<Lease>;

    /// Gives a lease back: paused for reuse, or deleted.
    fn release_lease(&self, params: &LeaseParams) -> HookResult<()>;

    /// Deletes a lease; the only way to clear unconfirmed cleanup.
    fn destroy_lease(&self, params: &LeaseParams) -> HookResult<()>;

    /// Where work runs inside the lease.
    fn realize_workspace(&self, params: &LeaseParams) -> HookResult<Workspace>;

    /// Runs a command in the lease, streaming its output to `output`.
    fn execute(&self, params: &ExecuteParams, output: &mut OutputSink<'_>) -> HookResult<ExecuteResult>;

    /// Reports a lease's remote state without changing it (ABI 1.1).
    fn inspect_lease(&self, _params: &LeaseParams) -> HookResult<LeaseStatus> {
        Err(unsupported(Hook::InspectLease))
    }

    /// `acquire_lease`, handing the lease to `recorder` the moment its remote
    /// resource exists and going on only once the host recorded it; if the
    /// host refuses, deletes what it created and fails with that error (ABI 1.2).
    fn acquire_lease_recording(
        &self,
        _params: &AcquireParams,
        _recorder: &mut CreationRecorder<'_>,
    ) -> HookResult<Lease> {
        Err(unsupported(Hook::AcquireLeaseRecording))
    }

    /// `probe`, handing its lease to `recorder` as `acquire_lease_recording`
    /// does (ABI 1.2).
    fn probe_recording(
        &self,
        _params: &EnvironmentParams,
        _recorder: &mut CreationRecorder<'_>,
    ) -> HookResult<ProbeReport> {
        Err(unsupported(Hook::ProbeRecording))
    }

    /// `release_lease`, reporting whether the lease was kept for reuse or
    /// deleted (ABI 1.2). A host never resumes a lease reported deleted.
    fn release_lease_reporting(&self, _params: &LeaseParams) -> HookResult<ReleaseReport> {
        Err(unsupported(Hook::ReleaseLeaseReporting))
    }

    /// `execute`, streaming the output to `output` as the raw bytes the
    /// command wrote (ABI 1.3). The result keeps the text tails.
    fn execute_bytes(
        &self,
        _params: &ExecuteParams,
        _output: &mut ByteSink<'_>,
    ) -> HookResult<ExecuteResult> {
        Err(unsupported(Hook::ExecuteBytes))
    }

    /// `setup`, also forwarding the provider's log events at `max_level` or
    /// more severe to `logs` for the rest of the process (ABI 1.3). Called
    /// instead of `setup`, not after it.
    fn setup_with_logs(&self, _params: &SetupParams, _logs: LogSink, _max_level: LogLevel) -> HookResult<()> {
        Err(unsupported(Hook::SetupWithLogs))
    }

    /// Copies host files and directories into the lease, then runs each
    /// operation's post-upload commands (ABI 1.4). Every mapping is checked
    /// before anything moves.
    fn sync_in(&self, _params: &SyncParams) -> HookResult<SyncResult> {
        Err(unsupported(Hook::SyncIn))
    }

    /// Copies lease files and directories to the host (ABI 1.4). Every
    /// mapping is checked before anything moves.
    fn sync_out(&self, _params: &SyncParams) -> HookResult<SyncResult> {
        Err(unsupported(Hook::SyncOut))
    }

    /// Learns that the cleanup of `params`' lease is unconfirmed (ABI 1.5):
    /// what another version of this provider knew only in memory, handed
    /// over by the host when this version becomes active. From then on the
    /// lease must be refused reuse (release for reuse, resume, execute) until
    /// it is destroyed, exactly as if this version had marked it itself.
    fn import_unconfirmed(&self, _params: &LeaseParams) -> HookResult<()> {
        Err(unsupported(Hook::ImportUnconfirmed))
    }

    /// Grants the provider `parts_per_million` of its own request budget
    /// (ABI 1.6): the host's share when several hosts send requests to the
    /// same account from the same caller. A lower share applies at once
    /// (requests already sent still count where the provider's budget counts
    /// them), a higher one no sooner than the other hosts' requests stop
    /// counting. Without this hook a provider keeps its whole budget.
    fn grant_request_share(&self, _parts_per_million: u32) -> HookResult<()> {
        Err(unsupported(Hook::GrantRequestShare))
    }

    // The async hooks (ABI 1.7). Each returns a `'static` future that owns
    // what it needs: the provider runs the work on its own runtime and the
    // future only waits for the result, so a host polls it from any executor.
    // Dropping the future before it is ready cancels the call with the
    // guarantees `release_lease` gives: a running command's process tree is
    // terminated, a lease being created is deleted once its creation is
    // known (or marked unconfirmed), and a cleanup delete runs to its end.

    /// `health`, as a future (ABI 1.7).
    fn health_async(&self) -> HookFuture<HealthReport> {
        ready(Err(unsupported(Hook::HealthAsync)))
    }

    /// `probe`, as a future (ABI 1.7).
    fn probe_async(&self, _params: EnvironmentParams) -> HookFuture<ProbeReport> {
        ready(Err(unsupported(Hook::ProbeAsync)))
    }

    /// `acquire_lease`, as a future (ABI 1.7). Dropped before it is ready,
    /// it leaves no lease behind: one already created is deleted.
    fn acquire_lease_async(&self, _params: AcquireParams) -> HookFuture<Lease> {
        ready(Err(unsupported(Hook::AcquireLeaseAsync)))
    }

    /// `resume_lease`, as a future (ABI 1.7).
    fn resume_lease_async(&self, _params: LeaseParams) -> HookFuture<Lease> {
        ready(Err(unsupported(Hook::ResumeLeaseAsync)))
    }

    /// `release_lease_reporting`, as a future (ABI 1.7). Dropped before it is
    /// ready, the release still runs to its end.
    fn release_lease_async(&self, _params: LeaseParams) -> HookFuture<ReleaseReport> {
        ready(Err(unsupported(Hook::ReleaseLeaseAsync)))
    }

    /// `destroy_lease`, as a future (ABI 1.7). Dropped before it is ready,
    /// the delete still runs to its end.
    fn destroy_lease_async(&self, _params: LeaseParams) -> HookFuture<()> {
        ready(Err(unsupported(Hook::DestroyLeaseAsync)))
    }

    /// `execute_bytes`, as a future streaming to `output` as the output
    /// arrives (ABI 1.7). Dropped before it is ready, the command is stopped
    /// as release stops it.
    fn execute_async(&self, _params: ExecuteParams, _output: OwnedByteSink) -> HookFuture<ExecuteResult> {
        ready(Err(unsupported(Hook::ExecuteAsync)))
    }

    // The async hooks of ABI 1.8, with the same cancellation guarantees.

    /// `acquire_lease_recording`, as a future (ABI 1.8): the lease goes to
    /// `recorder` the moment its remote resource exists and the provider
    /// awaits the host's durable record before going on; if the host refuses,
    /// the provider deletes what it created and fails with that error.
    /// Dropped before it is ready, it leaves no lease behind: one already
    /// created is deleted once its creation is known (or marked unconfirmed).
    fn acquire_lease_recording_async(
        &self,
        _params: AcquireParams,
        _recorder: AsyncCreationRecorder,
    ) -> HookFuture<Lease> {
        ready(Err(unsupported(Hook::AcquireLeaseRecordingAsync)))
    }

    /// `probe_recording`, as a future (ABI 1.8), recording its lease as
    /// `acquire_lease_recording_async` does.
    fn probe_recording_async(
        &self,
        _params: EnvironmentParams,
        _recorder: AsyncCreationRecorder,
    ) -> HookFuture<ProbeReport> {
        ready(Err(unsupported(Hook::ProbeRecordingAsync)))
    }

    /// `sync_in`, as a future (ABI 1.8). Dropped before it is ready, the sync
    /// stops as release stops it, leaving no more than a failed sync would.
    fn sync_in_async(&self, _params: SyncParams) -> HookFuture<SyncResult> {
        ready(Err(unsupported(Hook::SyncInAsync)))
    }

    /// `sync_out`, as a future (ABI 1.8). Dropped before it is ready, the
    /// sync stops as release stops it, leaving no more than a failed sync
    /// would.
    fn sync_out_async(&self, _params: SyncParams) -> HookFuture<SyncResult> {
        ready(Err(unsupported(Hook::SyncOutAsync)))
    }

    /// `execute_async`, the command's standard input pulled from `stdin`
    /// (ABI 1.9) instead of `params.stdin` (which must be `None`): the
    /// provider reads it in pieces as it sends it on, so input of any size
    /// costs bounded memory, and stops reading when the call is cancelled,
    /// times out or fails. The end of `stdin` is the end of the input; a
    /// read error fails the call. Dropped before it is ready, the command is
    /// stopped as release stops it, the input's transfer included.
    fn execute_stdin_async(
        &self,
        _params: ExecuteParams,
        _stdin: OwnedByteSource,
        _output: OwnedByteSink,
    ) -> HookFuture<ExecuteResult> {
        ready(Err(unsupported(Hook::ExecuteStdinAsync)))
    }
}

/// The error a hook the provider lacks returns.
pub fn unsupported(hook: Hook) -> ProviderError {
    ProviderError::unsupported(format!("The provider does not implement the `{hook}` hook."))
}
