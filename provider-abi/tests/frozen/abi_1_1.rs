//! The ABI 1.1 root module exactly as it shipped (fields public, as they were
//! before the fields became crate-private). Frozen: never edit this file.
//!
//! The layout test compares it with the crate's current definitions, and the
//! `fixture-liar` library builds a forged module from it, as any library
//! written without `export_provider!` could.

#![allow(dead_code, missing_docs)]

use abi_stable::{
    declare_root_module_statics,
    library::RootModule,
    sabi_types::VersionStrings,
    std_types::{ROption, RResult},
    StableAbi,
};
use provider_abi::{
    AbiVersion, AcquireParams, EnvironmentParams, ExecuteParams, ExecuteResult, HealthReport, Lease,
    LeaseParams, LeaseStatus, Manifest, OutputSink, ProbeReport, ProviderError, SetupParams,
    ValidationReport, Workspace,
};
use std::ffi::c_void;

#[repr(transparent)]
#[derive(StableAbi, Copy, Clone, Debug)]
pub struct InstancePtr(pub *const c_void);

pub type FfiResult<T> = RResult<T, ProviderError>;

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

#[repr(C)]
#[derive(StableAbi, Copy, Clone)]
pub struct HookTableV1_1 {
    pub inspect_lease: extern "C" fn(InstancePtr, &LeaseParams) -> FfiResult<LeaseStatus>,
}

#[repr(C)]
#[derive(StableAbi, Copy, Clone)]
pub struct Extension {
    pub layout: *const c_void,
    pub table: *const c_void,
}

#[repr(C)]
#[derive(StableAbi)]
#[sabi(kind(Prefix(prefix_ref = ProviderModuleRef)))]
#[sabi(missing_field(panic))]
pub struct ProviderModule {
    pub abi_version: AbiVersion,
    pub new_instance: extern "C" fn() -> FfiResult<InstancePtr>,
    pub drop_instance: extern "C" fn(InstancePtr),
    pub hooks: HookTableV1_0,
    #[sabi(last_prefix_field)]
    pub extension: extern "C" fn(minor: u16) -> ROption<Extension>,
}

impl RootModule for ProviderModuleRef {
    declare_root_module_statics! {ProviderModuleRef}
    const BASE_NAME: &'static str = "sandbox_provider";
    const NAME: &'static str = "sandbox provider";
    const VERSION_STRINGS: VersionStrings = VersionStrings::new("1.1.0");
}
