//! The ABI 1.7 hook table (the async hooks) as it ships. Frozen once 1.7
//! shipped: never edit this file.

#![allow(dead_code, missing_docs)]

use crate::frozen::{FfiResult, InstancePtr};
use abi_stable::StableAbi;
use async_ffi::FfiFuture;
use provider_abi::{
    AcquireParams, EnvironmentParams, ExecuteParams, ExecuteResult, HealthReport, Lease, LeaseParams,
    OwnedByteSink, ProbeReport, ReleaseReport,
};

#[repr(C)]
#[derive(StableAbi, Copy, Clone)]
pub struct HookTableV1_7 {
    pub health_async: extern "C" fn(InstancePtr) -> FfiFuture<FfiResult<HealthReport>>,
    pub probe_async: extern "C" fn(InstancePtr, &EnvironmentParams) -> FfiFuture<FfiResult<ProbeReport>>,
    pub acquire_lease_async: extern "C" fn(InstancePtr, &AcquireParams) -> FfiFuture<FfiResult<Lease>>,
    pub resume_lease_async: extern "C" fn(InstancePtr, &LeaseParams) -> FfiFuture<FfiResult<Lease>>,
    pub release_lease_async: extern "C" fn(InstancePtr, &LeaseParams) -> FfiFuture<FfiResult<ReleaseReport>>,
    pub destroy_lease_async: extern "C" fn(InstancePtr, &LeaseParams) -> FfiFuture<FfiResult<()>>,
    pub execute_async:
        extern "C" fn(InstancePtr, &ExecuteParams, OwnedByteSink) -> FfiFuture<FfiResult<ExecuteResult>>,
}
