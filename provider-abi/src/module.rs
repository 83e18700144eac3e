//! The root module a provider library exports, frozen for all of ABI 1.x.
//!
//! abi_stable refuses a library whose root module has fewer prefix fields than
//! the host expects, so nothing here may change within a major version. Hooks
//! added in a minor version live in an *extension table* the host asks for by
//! minor number through [`ProviderModule::extension`]; each table's layout is
//! checked on its own, and a library that lacks it answers `None`, which the
//! host reports as an unsupported hook.

use crate::{error::ProviderError, sink::OutputSink, types::*, version::AbiVersion};
use abi_stable::{
    declare_root_module_statics,
    library::RootModule,
    package_version_strings,
    sabi_types::VersionStrings,
    std_types::{ROption, RResult},
    StableAbi,
};
use std::ffi::c_void;

/// An opaque pointer to a provider instance owned by the library.
#[repr(transparent)]
#[derive(StableAbi, Copy, Clone, Debug)]
pub struct InstancePtr(pub *const c_void);

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
    pub manifest: extern "C" fn(InstancePtr) -> FfiResult<Manifest>,
    pub setup: extern "C" fn(InstancePtr, &SetupParams) -> FfiResult<()>,
    pub shutdown: extern "C" fn(InstancePtr) -> FfiResult<()>,
    pub health: extern "C" fn(InstancePtr) -> FfiResult<HealthReport>,
    pub validate_config: extern "C" fn(InstancePtr, &EnvironmentParams) -> FfiResult<ValidationReport>,
    pub probe: extern "C" fn(InstancePtr, &EnvironmentParams) -> FfiResult<ProbeReport>,
    pub acquire_lease: extern "C" fn(InstancePtr, &AcquireParams) -> FfiResult<Lease>,
    pub resume_lease: extern "C" fn(InstancePtr, &LeaseParams) -> FfiResult<Lease>,
    pub release_lease: extern "C" fn(InstancePtr, &LeaseParams) -> FfiResult<()>,
    pub destroy_lease: extern "C" fn(InstancePtr, &LeaseParams) -> FfiResult<()>,
    pub realize_workspace: extern "C" fn(InstancePtr, &LeaseParams) -> FfiResult<Workspace>,
    pub execute: extern "C" fn(InstancePtr, &ExecuteParams, &mut OutputSink<'_>) -> FfiResult<ExecuteResult>,
}

/// The hooks ABI 1.1 added. Frozen once 1.1 shipped.
#[repr(C)]
#[derive(StableAbi, Copy, Clone)]
pub struct HookTableV1_1 {
    pub inspect_lease: extern "C" fn(InstancePtr, &LeaseParams) -> FfiResult<LeaseStatus>,
}

/// An extension table as the library hands it over: its type layout, checked
/// by the host before use, and the table itself.
#[repr(C)]
#[derive(StableAbi, Copy, Clone)]
pub struct Extension {
    /// `&'static abi_stable::type_layout::TypeLayout` of the table.
    pub layout: *const c_void,
    /// `&'static` table.
    pub table: *const c_void,
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
    pub new_instance: extern "C" fn() -> FfiResult<InstancePtr>,
    /// Drops an instance created by `new_instance`.
    pub drop_instance: extern "C" fn(InstancePtr),
    /// The ABI 1.0 hooks.
    pub hooks: HookTableV1_0,
    /// The extension table of minor version `minor` (1 for ABI 1.1...), if
    /// the provider was built for it.
    #[sabi(last_prefix_field)]
    pub extension: extern "C" fn(minor: u16) -> ROption<Extension>,
}

impl RootModule for ProviderModuleRef {
    declare_root_module_statics! {ProviderModuleRef}
    const BASE_NAME: &'static str = "sandbox_provider";
    const NAME: &'static str = "sandbox provider";
    const VERSION_STRINGS: VersionStrings = package_version_strings!();
}
