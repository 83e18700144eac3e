//! The provider trait: one method per operation, for linked-in and loaded
//! providers alike.

use crate::{
    error::{HookResult, ProviderError},
    file_sync::{SyncParams, SyncResult},
    future::{ready, HookFuture},
    log::{LogLevel, LogSink},
    memory::MemoryEntry,
    recorder::CreationRecorder,
    sink::ByteSink,
    source::ByteSource,
    types::*,
    version::Hook,
};

/// The hooks of a sandbox provider: one method per operation.
///
/// A provider implements it and exports it with [`crate::export_provider!`];
/// a host calls it on the provider type directly or on a loaded library,
/// which implements it too. Methods may be called from many threads at once.
///
/// The nine methods without a default are the ones every provider writes.
/// The operations that wait on the network return a [`HookFuture`]: `'static`
/// (it owns its parameters), polled by the host from any executor and
/// dropped to cancel the call. A provider without an async runtime writes a
/// blocking body and wraps it with [`crate::blocking`]. The cheap local
/// operations are plain calls.
///
/// The optional operations (`probe`, `inspect_lease`, `sync_files`,
/// `import_unconfirmed`, `grant_request_share`, `export_memory`,
/// `import_memory`) are in a library's table only when its export names them; their defaults answer `unsupported`
/// for a provider linked in directly.
pub trait Provider: Send + Sync + 'static {
    /// Identity, version and configuration schema. The `hooks` list is
    /// filled in from the exported table by the export layer.
    fn manifest(&self) -> Manifest;

    /// Called once after loading, before any other hook: `logs` receives the
    /// provider's log events up to `max_level` for the rest of the process.
    fn setup(&self, _params: &SetupParams, _logs: LogSink, _max_level: LogLevel) -> HookResult<()> {
        Ok(())
    }

    /// Cancels work in flight; called before the host drops the provider.
    fn shutdown(&self) -> HookResult<()> {
        Ok(())
    }

    /// A cheap liveness check that sends no request.
    fn health(&self) -> HookResult<HealthReport>;

    /// Checks a configuration without sending a request.
    fn validate_config(&self, params: &EnvironmentParams) -> HookResult<ValidationReport>;

    /// Acquires a lease, runs a command in it and destroys it: can this
    /// environment run work? A lease it creates goes through `recorder` as in
    /// [`Provider::acquire_lease`].
    fn probe(&self, _params: EnvironmentParams, _recorder: CreationRecorder) -> HookFuture<ProbeReport> {
        ready(Err(unsupported(Hook::Probe)))
    }

    /// Creates a lease. Write-ahead: the provider awaits
    /// [`CreationRecorder::sending`] right before the creation request leaves
    /// (after any pacing), and [`CreationRecorder::record`] with the lease as
    /// soon as the reply names it, before anything else; when either answers
    /// `Err` it deletes what it created (if anything) and fails with that error.
    fn acquire_lease(&self, params: AcquireParams, recorder: CreationRecorder) -> HookFuture<Lease>;

    /// Makes a released lease usable again, or reports it expired.
    fn resume_lease(&self, params: LeaseParams) -> HookFuture<Lease>;

    /// Gives a lease back: kept (paused, resumable) or deleted, as reported.
    fn release_lease(&self, params: LeaseParams) -> HookFuture<ReleaseReport>;

    /// Deletes a lease's remote resource; deleting one already gone succeeds.
    fn destroy_lease(&self, params: LeaseParams) -> HookFuture<()>;

    /// Where work runs inside a lease.
    fn realize_workspace(&self, params: &LeaseParams) -> HookResult<Workspace>;

    /// Runs a command in a lease. Its standard input is pulled from `stdin`
    /// (see [`ByteSource`] for the threads that may read it); its output is
    /// written to `output` as raw bytes as it arrives (decoding is the
    /// host's business).
    fn execute(
        &self,
        params: ExecuteParams,
        stdin: ByteSource,
        output: ByteSink,
    ) -> HookFuture<ExecuteResult>;

    /// A lease's remote state, without changing it.
    fn inspect_lease(&self, _params: LeaseParams) -> HookFuture<LeaseStatus> {
        ready(Err(unsupported(Hook::InspectLease)))
    }

    /// Copies files into (`SyncDirection::In`) or out of a lease.
    fn sync_files(&self, _params: SyncParams) -> HookFuture<SyncResult> {
        ready(Err(unsupported(Hook::SyncFiles)))
    }

    /// Learns that a lease's cleanup is unconfirmed: the host knew it from
    /// another version of this provider, so this one refuses to reuse it
    /// until it is destroyed.
    fn import_unconfirmed(&self, _params: &LeaseParams) -> HookResult<()> {
        Err(unsupported(Hook::ImportUnconfirmed))
    }

    /// The share of its request budget the provider may spend, in parts per
    /// million (1,000,000: all of it), when several hosts share one account.
    fn grant_request_share(&self, _parts_per_million: u32) -> HookResult<()> {
        Err(unsupported(Hook::GrantRequestShare))
    }

    /// What the provider learnt that a later process (or the next version
    /// after a swap) may use, at most [`crate::MEMORY_LIMIT`] bytes, as
    /// keyed entries the host stores and hands back through
    /// [`Provider::import_memory`]. Cheap and local: it sends no request.
    fn export_memory(&self) -> HookResult<Vec<MemoryEntry>> {
        Err(unsupported(Hook::ExportMemory))
    }

    /// Takes back what an earlier process exported, after `setup` and
    /// before the lease hooks. The entries may be stale, damaged or of
    /// another version: the provider keeps what it can use and ignores the
    /// rest (an error is logged by the host, never fatal).
    fn import_memory(&self, _entries: &[MemoryEntry]) -> HookResult<()> {
        Err(unsupported(Hook::ImportMemory))
    }
}

/// The error a hook the provider lacks returns.
pub fn unsupported(hook: Hook) -> ProviderError {
    ProviderError::unsupported(format!("The provider does not implement the `{hook}` hook."))
}
