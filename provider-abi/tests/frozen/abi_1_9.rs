//! The ABI 1.9 hook table (execute with a pulled standard input) and its
//! byte source as they ship. Frozen once 1.9 shipped: never edit this file.

#![allow(dead_code, missing_docs)]

use crate::frozen::{FfiResult, InstancePtr};
use abi_stable::{
    std_types::{RResult, RSliceMut},
    StableAbi,
};
use async_ffi::FfiFuture;
use provider_abi::{ExecuteParams, ExecuteResult, OwnedByteSink, ProviderError};
use std::ffi::c_void;

#[repr(C)]
#[derive(StableAbi)]
pub struct OwnedByteSource {
    pub context: *mut c_void,
    pub read_chunk: unsafe extern "C" fn(*mut c_void, RSliceMut<'_, u8>) -> RResult<usize, ProviderError>,
    pub drop_context: unsafe extern "C" fn(*mut c_void),
}

#[repr(C)]
#[derive(StableAbi, Copy, Clone)]
pub struct HookTableV1_9 {
    pub execute_stdin_async: extern "C" fn(
        InstancePtr,
        &ExecuteParams,
        OwnedByteSource,
        OwnedByteSink,
    ) -> FfiFuture<FfiResult<ExecuteResult>>,
}
