//! The root module a provider library exports, frozen for all of ABI 1.x.
//!
//! abi_stable refuses a library whose root module has fewer prefix fields than
//! the host expects, so nothing here may change within a major version. Hooks
//! added in a minor version live in an *extension table* the host asks for by
//! minor number through [`ProviderModule::extension`]; each table's layout is
//! checked on its own, and a library that lacks it answers `None`, which the
//! host reports as an unsupported hook.
//!
//! # Soundness
//!
//! Nothing here can be reached from safe code outside this crate: the fields of
//! [`ProviderModule`], the hook tables and [`InstancePtr`] are crate-private
//! (abi_stable's accessors follow field visibility, and visibility is not part
//! of the checked layout), and an [`Extension`] can only be built through its
//! `unsafe` constructor. A provider author meets the module only through
//! [`crate::export_provider!`], a host only through [`crate::LoadedProvider`].
//! So an instance is created, called and dropped only by the loader, which
//! drops it exactly once, after every call has returned.
//!
//! # Adding a minor version (checklist)
//!
//! 1. Add `ABI_1_N` in `version.rs`, make it `ABI_VERSION`, bump the crate's
//!    minor version, and give the new hooks `since() == ABI_1_N`.
//! 2. Add `HookTableV1_N` here with crate-private fields; never change an
//!    existing table, type or the root module (they are frozen once landed).
//!    Copy its definition into `tests/frozen/abi_1_N.rs` and compare the two
//!    in `tests/frozen_layout.rs` (done from 1.6 on).
//! 3. Export it from `export::extensions` under minor `N`, and look it up in
//!    `LoadedProvider::load_as` with `extension_table` when the host's ABI is
//!    at least `1.N`; a library without it reports the hooks `unsupported`.
//! 4. List every function pointer of the table in its [`CodeAddresses`] impl,
//!    so the loader checks they lie in the library it loaded, and forge the
//!    table in `examples/forged/table.rs` with a `forged_table_1_N` example
//!    (`Cargo.toml`), which `tests/forged_module.rs` checks is refused.
//! 5. Add a fixture library exported at `1.N` and grow the version-matrix
//!    test (`tests/e2e/tests/e2e/abi.rs`) with it: every older fixture loads
//!    into the new host, and the new fixture loads into a 1.0 host.
//! 6. Forward the new hooks where a host wraps a provider by hand
//!    (`provider-host`'s `HostedProvider` and `ProviderSet`), and carry them
//!    through the isolation protocol (`host-harness/src/isolation/`): a
//!    `Call` variant and, for a new result type, a `Reply` variant
//!    (`protocol.rs`; the new parameter and result types derive serde under
//!    this crate's `serde` feature), a match arm in the worker's `run`
//!    (`worker.rs`) and the `Provider` method of `IsolatedProvider`
//!    (`client.rs`); callbacks the hook takes cross as frames on the call's
//!    socket (output, created leases) or on the control socket (log events).
//!    `IsolatedProvider::supports` answers from the worker's library, so a
//!    library older than the hook reports `unsupported` as in process; test
//!    each new hook through `--isolate` (`host-harness/tests/isolation.rs`).
//!    Grow the swap matrix (`host-harness/tests/provider_set.rs`) with the
//!    new fixture as the newest.

use crate::{
    error::ProviderError,
    log::{LogLevel, LogSink},
    recorder::{AsyncCreationRecorder, CreationRecorder},
    sink::{ByteSink, OutputSink, OwnedByteSink},
    source::OwnedByteSource,
    sync::{SyncParams, SyncResult},
    types::*,
    version::AbiVersion,
};
use abi_stable::{
    declare_root_module_statics,
    library::RootModule,
    package_version_strings,
    sabi_types::VersionStrings,
    std_types::{ROption, RResult},
    type_layout::TypeLayout,
    StableAbi,
};
use std::ffi::c_void;

/// An opaque pointer to a provider instance owned by the library.
///
/// Only the export layer creates one (in `new_instance`) and only the loader
/// holds one, so safe code can neither forge an instance nor drop it twice.
#[repr(transparent)]
#[derive(StableAbi, Copy, Clone, Debug)]
pub struct InstancePtr(pub(crate) *const c_void);

// SAFETY: providers are `Send + Sync` (required by the `Provider` trait).
unsafe impl Send for InstancePtr {}
// SAFETY: as above.
unsafe impl Sync for InstancePtr {}

/// Shorthand for the result every hook function returns across the boundary.
pub type FfiResult<T> = RResult<T, ProviderError>;

/// The hooks of ABI 1.0. Frozen.
#[repr(C)]
#[derive(StableAbi, Copy, Clone)]
pub struct HookTableV1_0 {
    pub(crate) manifest: extern "C" fn(InstancePtr) -> FfiResult<Manifest>,
    pub(crate) setup: extern "C" fn(InstancePtr, &SetupParams) -> FfiResult<()>,
    pub(crate) shutdown: extern "C" fn(InstancePtr) -> FfiResult<()>,
    pub(crate) health: extern "C" fn(InstancePtr) -> FfiResult<HealthReport>,
    pub(crate) validate_config: extern "C" fn(InstancePtr, &EnvironmentParams) -> FfiResult<ValidationReport>,
    pub(crate) probe: extern "C" fn(InstancePtr, &EnvironmentParams) -> FfiResult<ProbeReport>,
    pub(crate) acquire_lease: extern "C" fn(InstancePtr, &AcquireParams) -> FfiResult<Lease>,
    pub(crate) resume_lease: extern "C" fn(InstancePtr, &LeaseParams) -> FfiResult<Lease>,
    pub(crate) release_lease: extern "C" fn(InstancePtr, &LeaseParams) -> FfiResult<()>,
    pub(crate) destroy_lease: extern "C" fn(InstancePtr, &LeaseParams) -> FfiResult<()>,
    pub(crate) realize_workspace: extern "C" fn(InstancePtr, &LeaseParams) -> FfiResult<Workspace>,
    pub(crate) execute:
        extern "C" fn(InstancePtr, &ExecuteParams, &mut OutputSink<'_>) -> FfiResult<ExecuteResult>,
}

/// The hooks ABI 1.1 added. Frozen once 1.1 shipped.
#[repr(C)]
#[derive(StableAbi, Copy, Clone)]
pub struct HookTableV1_1 {
    pub(crate) inspect_lease: extern "C" fn(InstancePtr, &LeaseParams) -> FfiResult<LeaseStatus>,
}

/// The hooks ABI 1.2 added. Frozen once 1.2 shipped.
#[repr(C)]
#[derive(StableAbi, Copy, Clone)]
pub struct HookTableV1_2 {
    pub(crate) acquire_lease_recording:
        extern "C" fn(InstancePtr, &AcquireParams, &mut CreationRecorder<'_>) -> FfiResult<Lease>,
    pub(crate) probe_recording:
        extern "C" fn(InstancePtr, &EnvironmentParams, &mut CreationRecorder<'_>) -> FfiResult<ProbeReport>,
    pub(crate) release_lease_reporting: extern "C" fn(InstancePtr, &LeaseParams) -> FfiResult<ReleaseReport>,
}

/// The hooks ABI 1.3 added. Frozen once 1.3 shipped.
#[repr(C)]
#[derive(StableAbi, Copy, Clone)]
pub struct HookTableV1_3 {
    pub(crate) execute_bytes:
        extern "C" fn(InstancePtr, &ExecuteParams, &mut ByteSink<'_>) -> FfiResult<ExecuteResult>,
    pub(crate) setup_with_logs: extern "C" fn(InstancePtr, &SetupParams, LogSink, LogLevel) -> FfiResult<()>,
}

/// The hooks ABI 1.4 added: file sync. Frozen once 1.4 shipped.
#[repr(C)]
#[derive(StableAbi, Copy, Clone)]
pub struct HookTableV1_4 {
    pub(crate) sync_in: extern "C" fn(InstancePtr, &SyncParams) -> FfiResult<SyncResult>,
    pub(crate) sync_out: extern "C" fn(InstancePtr, &SyncParams) -> FfiResult<SyncResult>,
}

/// The hooks ABI 1.5 added: state a host hands over between provider
/// versions. Frozen once 1.5 shipped.
#[repr(C)]
#[derive(StableAbi, Copy, Clone)]
pub struct HookTableV1_5 {
    pub(crate) import_unconfirmed: extern "C" fn(InstancePtr, &LeaseParams) -> FfiResult<()>,
}

/// The hooks ABI 1.6 added: a request budget shared by several hosts.
/// Frozen once 1.6 shipped.
#[repr(C)]
#[derive(StableAbi, Copy, Clone)]
pub struct HookTableV1_6 {
    pub(crate) grant_request_share: extern "C" fn(InstancePtr, u32) -> FfiResult<()>,
}

/// A hook's result as a future the host polls (ABI 1.7).
pub type FfiHookFuture<T> = async_ffi::FfiFuture<FfiResult<T>>;

/// The hooks ABI 1.7 added: async variants of the hooks that wait on the
/// network. Frozen once 1.7 shipped.
#[repr(C)]
#[derive(StableAbi, Copy, Clone)]
pub struct HookTableV1_7 {
    pub(crate) health_async: extern "C" fn(InstancePtr) -> FfiHookFuture<HealthReport>,
    pub(crate) probe_async: extern "C" fn(InstancePtr, &EnvironmentParams) -> FfiHookFuture<ProbeReport>,
    pub(crate) acquire_lease_async: extern "C" fn(InstancePtr, &AcquireParams) -> FfiHookFuture<Lease>,
    pub(crate) resume_lease_async: extern "C" fn(InstancePtr, &LeaseParams) -> FfiHookFuture<Lease>,
    pub(crate) release_lease_async: extern "C" fn(InstancePtr, &LeaseParams) -> FfiHookFuture<ReleaseReport>,
    pub(crate) destroy_lease_async: extern "C" fn(InstancePtr, &LeaseParams) -> FfiHookFuture<()>,
    pub(crate) execute_async:
        extern "C" fn(InstancePtr, &ExecuteParams, OwnedByteSink) -> FfiHookFuture<ExecuteResult>,
}

/// The hooks ABI 1.8 added: async file sync, and the write-ahead creation
/// hooks of ABI 1.2 as futures whose recorder answers with a future. Frozen
/// once 1.8 shipped.
#[repr(C)]
#[derive(StableAbi, Copy, Clone)]
pub struct HookTableV1_8 {
    pub(crate) sync_in_async: extern "C" fn(InstancePtr, &SyncParams) -> FfiHookFuture<SyncResult>,
    pub(crate) sync_out_async: extern "C" fn(InstancePtr, &SyncParams) -> FfiHookFuture<SyncResult>,
    pub(crate) acquire_lease_recording_async:
        extern "C" fn(InstancePtr, &AcquireParams, AsyncCreationRecorder) -> FfiHookFuture<Lease>,
    pub(crate) probe_recording_async:
        extern "C" fn(InstancePtr, &EnvironmentParams, AsyncCreationRecorder) -> FfiHookFuture<ProbeReport>,
}

/// The hook ABI 1.9 added: `execute_async` whose standard input the
/// provider pulls from a byte source. Frozen once 1.9 shipped.
#[repr(C)]
#[derive(StableAbi, Copy, Clone)]
pub struct HookTableV1_9 {
    pub(crate) execute_stdin_async: extern "C" fn(
        InstancePtr,
        &ExecuteParams,
        OwnedByteSource,
        OwnedByteSink,
    ) -> FfiHookFuture<ExecuteResult>,
}

/// An extension table as the library hands it over: its type layout, checked
/// by the host before use, and the table itself.
#[repr(C)]
#[derive(StableAbi, Copy, Clone)]
pub struct Extension {
    /// `&'static abi_stable::type_layout::TypeLayout` of the table.
    layout: *const c_void,
    /// `&'static` table.
    table: *const c_void,
}

impl Extension {
    /// Pairs a table with its layout.
    ///
    /// # Safety
    /// `table` must point to a `T` that lives for the rest of the process and
    /// whose `<T as StableAbi>::LAYOUT` is `layout`: the host reads `table` as
    /// whatever type `layout` describes once it has checked that layout.
    pub const unsafe fn new(layout: &'static TypeLayout, table: *const c_void) -> Self {
        Self { layout: (layout as *const TypeLayout).cast(), table }
    }

    /// The extension for `table`, pairing it with its own type's layout.
    pub(crate) fn of<T: StableAbi>(table: &'static T) -> Self {
        // SAFETY: `table` is a `&'static T` and `T::LAYOUT` is its layout.
        unsafe { Self::new(T::LAYOUT, (table as *const T).cast()) }
    }

    /// The layout pointer, as the library handed it over.
    pub(crate) fn layout(self) -> *const c_void {
        self.layout
    }

    /// The table pointer, as the library handed it over.
    pub(crate) fn table(self) -> *const c_void {
        self.table
    }
}

/// The library's root module. Frozen for ABI 1.x.
#[repr(C)]
#[derive(StableAbi)]
#[sabi(kind(Prefix(prefix_ref = ProviderModuleRef)))]
#[sabi(missing_field(panic))]
pub struct ProviderModule {
    /// The ABI level the provider was built for.
    pub abi_version: AbiVersion,
    /// Creates a provider instance.
    pub(crate) new_instance: extern "C" fn() -> FfiResult<InstancePtr>,
    /// Drops an instance created by `new_instance`.
    pub(crate) drop_instance: extern "C" fn(InstancePtr),
    /// The ABI 1.0 hooks.
    pub(crate) hooks: HookTableV1_0,
    /// The extension table of minor version `minor` (1 for ABI 1.1...), if
    /// the provider was built for it.
    #[sabi(last_prefix_field)]
    pub(crate) extension: extern "C" fn(minor: u16) -> ROption<Extension>,
}

impl RootModule for ProviderModuleRef {
    declare_root_module_statics! {ProviderModuleRef}
    const BASE_NAME: &'static str = "sandbox_provider";
    const NAME: &'static str = "sandbox provider";
    const VERSION_STRINGS: VersionStrings = package_version_strings!();
}

/// The code addresses a hook table holds, which the loader checks lie inside
/// the library it loaded (a table that points elsewhere is a lie).
pub(crate) trait CodeAddresses {
    /// Every function pointer of the table.
    fn code_addresses(&self) -> Vec<*const c_void>;
}

impl CodeAddresses for HookTableV1_0 {
    fn code_addresses(&self) -> Vec<*const c_void> {
        vec![
            self.manifest as *const c_void,
            self.setup as *const c_void,
            self.shutdown as *const c_void,
            self.health as *const c_void,
            self.validate_config as *const c_void,
            self.probe as *const c_void,
            self.acquire_lease as *const c_void,
            self.resume_lease as *const c_void,
            self.release_lease as *const c_void,
            self.destroy_lease as *const c_void,
            self.realize_workspace as *const c_void,
            self.execute as *const c_void,
        ]
    }
}

impl CodeAddresses for HookTableV1_1 {
    fn code_addresses(&self) -> Vec<*const c_void> {
        vec![self.inspect_lease as *const c_void]
    }
}

impl CodeAddresses for HookTableV1_2 {
    fn code_addresses(&self) -> Vec<*const c_void> {
        vec![
            self.acquire_lease_recording as *const c_void,
            self.probe_recording as *const c_void,
            self.release_lease_reporting as *const c_void,
        ]
    }
}

impl CodeAddresses for HookTableV1_3 {
    fn code_addresses(&self) -> Vec<*const c_void> {
        vec![self.execute_bytes as *const c_void, self.setup_with_logs as *const c_void]
    }
}

impl CodeAddresses for HookTableV1_4 {
    fn code_addresses(&self) -> Vec<*const c_void> {
        vec![self.sync_in as *const c_void, self.sync_out as *const c_void]
    }
}

impl CodeAddresses for HookTableV1_5 {
    fn code_addresses(&self) -> Vec<*const c_void> {
        vec![self.import_unconfirmed as *const c_void]
    }
}

impl CodeAddresses for HookTableV1_6 {
    fn code_addresses(&self) -> Vec<*const c_void> {
        vec![self.grant_request_share as *const c_void]
    }
}

impl CodeAddresses for HookTableV1_7 {
    fn code_addresses(&self) -> Vec<*const c_void> {
        vec![
            self.health_async as *const c_void,
            self.probe_async as *const c_void,
            self.acquire_lease_async as *const c_void,
            self.resume_lease_async as *const c_void,
            self.release_lease_async as *const c_void,
            self.destroy_lease_async as *const c_void,
            self.execute_async as *const c_void,
        ]
    }
}

impl CodeAddresses for HookTableV1_9 {
    fn code_addresses(&self) -> Vec<*const c_void> {
        vec![self.execute_stdin_async as *const c_void]
    }
}

impl CodeAddresses for HookTableV1_8 {
    fn code_addresses(&self) -> Vec<*const c_void> {
        vec![
            self.sync_in_async as *const c_void,
            self.sync_out_async as *const c_void,
            self.acquire_lease_recording_async as *const c_void,
            self.probe_recording_async as *const c_void,
        ]
    }
}
