//! The host side of the boundary: a provider instance created from a loaded
//! root module, implementing [`Provider`] by calling its table, so host code
//! is the same for linked-in and loaded providers.

use crate::{
    error::HookResult,
    export::Place,
    file_sync::{SyncParams, SyncResult},
    future::{imported, ready, HookFuture},
    log::{LogLevel, LogSink},
    memory::MemoryEntry,
    module::*,
    provider::{unsupported, Provider},
    recorder::CreationRecorder,
    sink::ByteSink,
    source::ByteSource,
    types::*,
    version::{AbiVersion, Hook},
};
use abi_stable::std_types::{RSlice, RString};

/// A provider instance of a loaded library.
///
/// Dropping it drops the instance inside the library; the library itself
/// stays loaded for the life of the process.
pub struct Instance {
    instance: InstancePtr,
    module: ProviderModuleRef,
    hooks: HookTableRef,
    manifest: Manifest,
}

impl Instance {
    /// Creates the provider instance of `module` and reads its manifest,
    /// whose `hooks` and `abi_version` come from the table, not from the
    /// provider's word.
    ///
    /// # Safety
    /// `module` must be the root module of a library that stays loaded for
    /// the rest of the process, obtained through abi_stable (which checked
    /// its layout), and every address of [`ProviderModuleRef::code_addresses`]
    /// must lie inside that library.
    pub unsafe fn new(module: ProviderModuleRef) -> HookResult<Self> {
        let instance = Result::from((module.new_instance())())?;
        let hooks = module.hooks();
        // An instance whose manifest fails is dropped before the error returns.
        let mut manifest =
            Result::from((hooks.manifest())(instance)).inspect_err(|_| (module.drop_instance())(instance))?;
        manifest.abi_version = module.abi_version();
        manifest.hooks = Hook::ALL
            .into_iter()
            .filter(|&hook| hooks.has(hook))
            .map(|hook| RString::from(hook.name()))
            .collect();
        Ok(Self { instance, module, hooks, manifest })
    }

    /// The ABI version the library was built for.
    pub fn library_abi(&self) -> AbiVersion {
        self.module.abi_version()
    }

    /// True when the library's table has `hook`.
    pub fn supports(&self, hook: Hook) -> bool {
        self.hooks.has(hook)
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        // Runs once per instance, after every `&self` call has returned; the
        // instance pointer never leaves this struct.
        (self.module.drop_instance())(self.instance);
    }
}

/// A hook's future as the host awaits it.
fn awaited<T: Send + 'static>(hook: Hook, future: FfiHookFuture<T>) -> HookFuture<T> {
    imported(Place::Hook(hook), future)
}

/// The future of an optional hook: its call, or `unsupported` without one.
fn optional<F, T: Send + 'static>(
    hook: Hook,
    function: Option<F>,
    call: impl FnOnce(F) -> FfiHookFuture<T>,
) -> HookFuture<T> {
    match function {
        Some(function) => awaited(hook, call(function)),
        None => ready(Err(unsupported(hook))),
    }
}

impl Provider for Instance {
    fn manifest(&self) -> Manifest {
        self.manifest.clone()
    }

    fn setup(&self, params: &SetupParams, logs: LogSink, max_level: LogLevel) -> HookResult<()> {
        (self.hooks.setup())(self.instance, params, logs, max_level).into()
    }

    fn shutdown(&self) -> HookResult<()> {
        (self.hooks.shutdown())(self.instance).into()
    }

    // Inlined into the host's forwarder: `health` is the hook a platform
    // polls, and its measured overhead over a direct call is this path.
    #[inline]
    fn health(&self) -> HookResult<HealthReport> {
        (self.hooks.health())(self.instance).into()
    }

    fn validate_config(&self, params: &EnvironmentParams) -> HookResult<ValidationReport> {
        (self.hooks.validate_config())(self.instance, params).into()
    }

    fn probe(&self, params: EnvironmentParams, recorder: CreationRecorder) -> HookFuture<ProbeReport> {
        optional(Hook::Probe, self.hooks.probe(), |probe| probe(self.instance, &params, recorder))
    }

    fn acquire_lease(&self, params: AcquireParams, recorder: CreationRecorder) -> HookFuture<Lease> {
        awaited(Hook::AcquireLease, (self.hooks.acquire_lease())(self.instance, &params, recorder))
    }

    fn resume_lease(&self, params: LeaseParams) -> HookFuture<Lease> {
        awaited(Hook::ResumeLease, (self.hooks.resume_lease())(self.instance, &params))
    }

    fn release_lease(&self, params: LeaseParams) -> HookFuture<ReleaseReport> {
        awaited(Hook::ReleaseLease, (self.hooks.release_lease())(self.instance, &params))
    }

    fn destroy_lease(&self, params: LeaseParams) -> HookFuture<()> {
        awaited(Hook::DestroyLease, (self.hooks.destroy_lease())(self.instance, &params))
    }

    fn realize_workspace(&self, params: &LeaseParams) -> HookResult<Workspace> {
        (self.hooks.realize_workspace())(self.instance, params).into()
    }

    fn execute(
        &self,
        params: ExecuteParams,
        stdin: ByteSource,
        output: ByteSink,
    ) -> HookFuture<ExecuteResult> {
        awaited(Hook::Execute, (self.hooks.execute())(self.instance, &params, stdin, output))
    }

    fn inspect_lease(&self, params: LeaseParams) -> HookFuture<LeaseStatus> {
        optional(Hook::InspectLease, self.hooks.inspect_lease(), |inspect| inspect(self.instance, &params))
    }

    fn sync_files(&self, params: SyncParams) -> HookFuture<SyncResult> {
        optional(Hook::SyncFiles, self.hooks.sync_files(), |sync| sync(self.instance, &params))
    }

    fn import_unconfirmed(&self, params: &LeaseParams) -> HookResult<()> {
        let import = self.hooks.import_unconfirmed().ok_or_else(|| unsupported(Hook::ImportUnconfirmed))?;
        import(self.instance, params).into()
    }

    fn grant_request_share(&self, parts_per_million: u32) -> HookResult<()> {
        let grant = self.hooks.grant_request_share().ok_or_else(|| unsupported(Hook::GrantRequestShare))?;
        grant(self.instance, parts_per_million).into()
    }

    fn export_memory(&self) -> HookResult<Vec<MemoryEntry>> {
        let export = self.hooks.export_memory().flatten().ok_or_else(|| unsupported(Hook::ExportMemory))?;
        HookResult::from(export(self.instance)).map(Vec::from)
    }

    fn import_memory(&self, entries: &[MemoryEntry]) -> HookResult<()> {
        let import = self.hooks.import_memory().flatten().ok_or_else(|| unsupported(Hook::ImportMemory))?;
        import(self.instance, RSlice::from_slice(entries)).into()
    }
}
