//! The ABI 1.8 hook table (async sync, async write-ahead creation) and its
//! async recorder as they ship. Frozen once 1.8 shipped: never edit this file.

#![allow(dead_code, missing_docs)]

use crate::frozen::{FfiResult, InstancePtr};
use abi_stable::StableAbi;
use async_ffi::FfiFuture;
use provider_abi::{AcquireParams, EnvironmentParams, Lease, ProbeReport, SyncParams, SyncResult};
use std::ffi::c_void;

#[repr(C)]
#[derive(StableAbi)]
pub struct AsyncCreationRecorder {
    pub context: *mut c_void,
    pub record_lease: unsafe extern "C" fn(*mut c_void, &Lease) -> FfiFuture<FfiResult<()>>,
    pub drop_context: unsafe extern "C" fn(*mut c_void),
}

#[repr(C)]
#[derive(StableAbi, Copy, Clone)]
pub struct HookTableV1_8 {
    pub sync_in_async: extern "C" fn(InstancePtr, &SyncParams) -> FfiFuture<FfiResult<SyncResult>>,
    pub sync_out_async: extern "C" fn(InstancePtr, &SyncParams) -> FfiFuture<FfiResult<SyncResult>>,
    pub acquire_lease_recording_async:
        extern "C" fn(InstancePtr, &AcquireParams, AsyncCreationRecorder) -> FfiFuture<FfiResult<Lease>>,
    pub probe_recording_async: extern "C" fn(
        InstancePtr,
        &EnvironmentParams,
        AsyncCreationRecorder,
    ) -> FfiFuture<FfiResult<ProbeReport>>,
}
