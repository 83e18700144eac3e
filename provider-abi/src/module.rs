//! The root module a provider library exports: its ABI version, its
//! constructor and its hook table.
//!
//! # Growth
//!
//! The hook table is one abi_stable prefix type. `#[sabi(last_prefix_field)]`
//! marks the last hook of 2.0; a later minor version appends fields after it
//! (never between, never changing one), and their accessors return `Option`:
//! a library built before the field existed answers `None`, which the host
//! reports as `unsupported`. 2.1 appended `export_memory` and
//! `import_memory`. A library built after loads into an older host, which
//! never looks past the fields it knows. The optional hooks (2.0's and
//! 2.1's) are nullable fields a library leaves empty when its export does
//! not name them. So whether a library has hook X has exactly one answer: its table.
//!
//! Parameter and result structs are frozen within a major version (every
//! type a table reaches is part of the layout abi_stable checks). A new input
//! in a minor version crosses in [`crate::EnvironmentParams::extensions_json`],
//! which every lease operation carries: a JSON object whose keys a minor
//! version defines, and which a provider built before that version ignores.
//! A host that needs the provider to honour a key checks the library's minor
//! version first. A new output is a new hook.
//!
//! # Adding a hook in a later minor version (checklist)
//!
//! 1. Append its field at the end of [`HookTable`] (after the last field) and
//!    its row to the `hooks!` table in `version.rs` (field, `optional`, since
//!    the new version); bump `ABI_VERSION` and the crate's minor version.
//! 2. Add its trait method to `Provider` with a default answering
//!    `unsupported`.
//! 3. Add its export shim in `export.rs`.
//! 4. Forward it in `Instance` (the loaded library's `Provider` impl) and in
//!    the host's wrappers, which the compiler lists (each implements
//!    `Provider`).
//! 5. Add its row to the growth test (`tests/e2e/tests/e2e/abi.rs`): a
//!    library built before it reports it `unsupported`.
//!
//! # Soundness
//!
//! Nothing here can be reached from safe code outside this crate: the fields
//! of [`ProviderModule`] and [`HookTable`] and [`InstancePtr`]'s are
//! crate-private (abi_stable's accessors follow field visibility, and
//! visibility is not part of the checked layout). A provider author meets the
//! module only through [`crate::export_provider!`], a host only through
//! [`crate::Instance`], whose one constructor is `unsafe`. So an instance is
//! created, called and dropped only by `Instance`, which drops it exactly
//! once, after every call has returned.

use crate::{
    error::ProviderError,
    file_sync::{SyncParams, SyncResult},
    log::{LogLevel, LogSink},
    memory::MemoryEntry,
    recorder::CreationRecorder,
    sink::ByteSink,
    source::ByteSource,
    types::*,
    version::{AbiVersion, Hook},
};
use abi_stable::{
    declare_root_module_statics,
    library::RootModule,
    package_version_strings,
    sabi_types::VersionStrings,
    std_types::{RResult, RSlice, RVec},
    StableAbi,
};
use std::ffi::c_void;

/// An opaque pointer to a provider instance owned by the library.
///
/// Only the export layer creates one (in `new_instance`) and only
/// [`crate::Instance`] holds one, so safe code can neither forge an instance
/// nor drop it twice.
#[repr(transparent)]
#[derive(StableAbi, Copy, Clone, Debug)]
pub struct InstancePtr(pub(crate) *const c_void);

// SAFETY: providers are `Send + Sync` (required by the `Provider` trait).
unsafe impl Send for InstancePtr {}
// SAFETY: as above.
unsafe impl Sync for InstancePtr {}

/// Shorthand for the result every synchronous hook returns across the boundary.
pub type FfiResult<T> = RResult<T, ProviderError>;

/// A hook's result as a future the host polls.
pub type FfiHookFuture<T> = async_ffi::FfiFuture<FfiResult<T>>;

/// The hooks, one per operation. Growth: see the module documentation.
#[repr(C)]
#[derive(StableAbi)]
#[sabi(kind(Prefix(prefix_ref = HookTableRef)))]
#[sabi(missing_field(option))]
pub struct HookTable {
    pub(crate) manifest: extern "C" fn(InstancePtr) -> FfiResult<Manifest>,
    pub(crate) setup: extern "C" fn(InstancePtr, &SetupParams, LogSink, LogLevel) -> FfiResult<()>,
    pub(crate) shutdown: extern "C" fn(InstancePtr) -> FfiResult<()>,
    pub(crate) health: extern "C" fn(InstancePtr) -> FfiResult<HealthReport>,
    pub(crate) validate_config: extern "C" fn(InstancePtr, &EnvironmentParams) -> FfiResult<ValidationReport>,
    pub(crate) probe: Option<
        extern "C" fn(InstancePtr, &EnvironmentParams, CreationRecorder) -> FfiHookFuture<ProbeReport>,
    >,
    pub(crate) acquire_lease:
        extern "C" fn(InstancePtr, &AcquireParams, CreationRecorder) -> FfiHookFuture<Lease>,
    pub(crate) resume_lease: extern "C" fn(InstancePtr, &LeaseParams) -> FfiHookFuture<Lease>,
    pub(crate) release_lease: extern "C" fn(InstancePtr, &LeaseParams) -> FfiHookFuture<ReleaseReport>,
    pub(crate) destroy_lease: extern "C" fn(InstancePtr, &LeaseParams) -> FfiHookFuture<()>,
    pub(crate) realize_workspace: extern "C" fn(InstancePtr, &LeaseParams) -> FfiResult<Workspace>,
    pub(crate) execute:
        extern "C" fn(InstancePtr, &ExecuteParams, ByteSource, ByteSink) -> FfiHookFuture<ExecuteResult>,
    pub(crate) inspect_lease: Option<extern "C" fn(InstancePtr, &LeaseParams) -> FfiHookFuture<LeaseStatus>>,
    pub(crate) sync_files: Option<extern "C" fn(InstancePtr, &SyncParams) -> FfiHookFuture<SyncResult>>,
    pub(crate) import_unconfirmed: Option<extern "C" fn(InstancePtr, &LeaseParams) -> FfiResult<()>>,
    /// The last hook of ABI 2.0; later minor versions append after it.
    #[sabi(last_prefix_field)]
    pub(crate) grant_request_share: Option<extern "C" fn(InstancePtr, u32) -> FfiResult<()>>,
    /// Appended in 2.1: what the provider learnt, for a later process.
    pub(crate) export_memory: Option<extern "C" fn(InstancePtr) -> FfiResult<RVec<MemoryEntry>>>,
    /// Appended in 2.1: hands back what an earlier process exported.
    pub(crate) import_memory: Option<extern "C" fn(InstancePtr, RSlice<'_, MemoryEntry>) -> FfiResult<()>>,
}

/// The library's root module.
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
    /// The hooks.
    #[sabi(last_prefix_field)]
    pub(crate) hooks: HookTableRef,
}

impl RootModule for ProviderModuleRef {
    declare_root_module_statics! {ProviderModuleRef}
    const BASE_NAME: &'static str = "sandbox_provider";
    const NAME: &'static str = "sandbox provider";
    const VERSION_STRINGS: VersionStrings = package_version_strings!();
}

impl HookTableRef {
    /// True when the library's table has `hook`.
    pub(crate) fn has(self, hook: Hook) -> bool {
        self.address(hook).is_some()
    }
}

impl ProviderModuleRef {
    /// Every function the module hands over, each with what it is: a host
    /// checks they all lie inside the library it loaded (a module that
    /// points elsewhere is forged or corrupt). The module and its table are
    /// data the library built at load time (on its heap), so what they hold
    /// is checked, not where they are.
    pub fn code_addresses(self) -> Vec<(&'static str, *const c_void)> {
        let hooks = self.hooks();
        // The required hooks in table order, then the optional ones present.
        let mut order = Hook::ALL;
        order.sort_by_key(|hook| hook.is_optional());
        let present = order.into_iter().filter_map(|hook| Some((hook.function(), hooks.address(hook)?)));
        let module = [
            ("root module constructor", self.new_instance() as *const c_void),
            ("root module destructor", self.drop_instance() as *const c_void),
        ];
        module.into_iter().chain(present).collect()
    }

    /// The ABI version the library was built for.
    pub fn library_abi(self) -> AbiVersion {
        self.abi_version()
    }
}
