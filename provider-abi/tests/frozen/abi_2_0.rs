//! The ABI 2.0 root module and hook table exactly as they shipped, with
//! public fields. Frozen: never edit these definitions.
//!
//! `tests/frozen_layout.rs` compares them with the crate's current
//! definitions; the `fixture-frozen` and `fixture-forged` libraries build
//! their root modules from them, as a library built against provider-abi
//! 2.0 (or written without `export_provider!`) does, and
//! `fixture-next-minor`'s tests load its library as a 2.0 host would. Those crates compile this file as package
//! `provider-abi` (see their `build.rs`): abi_stable checks a type's package
//! name and version along with its layout.

#![allow(dead_code, missing_docs)]

use abi_stable::{
    declare_root_module_statics, library::RootModule, sabi_types::VersionStrings, std_types::RResult,
    StableAbi,
};
use provider_abi::{
    AbiVersion, AcquireParams, ByteSink, ByteSource, CreationRecorder, EnvironmentParams, ExecuteParams,
    ExecuteResult, HealthReport, Lease, LeaseParams, LeaseStatus, LogLevel, LogSink, Manifest, ProbeReport,
    ProviderError, ReleaseReport, SetupParams, SyncParams, SyncResult, ValidationReport, Workspace,
};
use std::ffi::c_void;

#[repr(transparent)]
#[derive(StableAbi, Copy, Clone, Debug)]
pub struct InstancePtr(pub *const c_void);

pub type FfiResult<T> = RResult<T, ProviderError>;

pub type FfiHookFuture<T> = async_ffi::FfiFuture<FfiResult<T>>;

#[repr(C)]
#[derive(StableAbi)]
#[sabi(kind(Prefix(prefix_ref = HookTableRef)))]
#[sabi(missing_field(option))]
pub struct HookTable {
    pub manifest: extern "C" fn(InstancePtr) -> FfiResult<Manifest>,
    pub setup: extern "C" fn(InstancePtr, &SetupParams, LogSink, LogLevel) -> FfiResult<()>,
    pub shutdown: extern "C" fn(InstancePtr) -> FfiResult<()>,
    pub health: extern "C" fn(InstancePtr) -> FfiResult<HealthReport>,
    pub validate_config: extern "C" fn(InstancePtr, &EnvironmentParams) -> FfiResult<ValidationReport>,
    pub probe: Option<
        extern "C" fn(InstancePtr, &EnvironmentParams, CreationRecorder) -> FfiHookFuture<ProbeReport>,
    >,
    pub acquire_lease: extern "C" fn(InstancePtr, &AcquireParams, CreationRecorder) -> FfiHookFuture<Lease>,
    pub resume_lease: extern "C" fn(InstancePtr, &LeaseParams) -> FfiHookFuture<Lease>,
    pub release_lease: extern "C" fn(InstancePtr, &LeaseParams) -> FfiHookFuture<ReleaseReport>,
    pub destroy_lease: extern "C" fn(InstancePtr, &LeaseParams) -> FfiHookFuture<()>,
    pub realize_workspace: extern "C" fn(InstancePtr, &LeaseParams) -> FfiResult<Workspace>,
    pub execute:
        extern "C" fn(InstancePtr, &ExecuteParams, ByteSource, ByteSink) -> FfiHookFuture<ExecuteResult>,
    pub inspect_lease: Option<extern "C" fn(InstancePtr, &LeaseParams) -> FfiHookFuture<LeaseStatus>>,
    pub sync_files: Option<extern "C" fn(InstancePtr, &SyncParams) -> FfiHookFuture<SyncResult>>,
    pub import_unconfirmed: Option<extern "C" fn(InstancePtr, &LeaseParams) -> FfiResult<()>>,
    #[sabi(last_prefix_field)]
    pub grant_request_share: Option<extern "C" fn(InstancePtr, u32) -> FfiResult<()>>,
}

#[repr(C)]
#[derive(StableAbi)]
#[sabi(kind(Prefix(prefix_ref = ProviderModuleRef)))]
#[sabi(missing_field(panic))]
pub struct ProviderModule {
    pub abi_version: AbiVersion,
    pub new_instance: extern "C" fn() -> FfiResult<InstancePtr>,
    pub drop_instance: extern "C" fn(InstancePtr),
    #[sabi(last_prefix_field)]
    pub hooks: HookTableRef,
}

impl RootModule for ProviderModuleRef {
    declare_root_module_statics! {ProviderModuleRef}
    const BASE_NAME: &'static str = "sandbox_provider";
    const NAME: &'static str = "sandbox provider";
    const VERSION_STRINGS: VersionStrings = VersionStrings::new("2.0.0");
}
