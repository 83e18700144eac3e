//! The ABI 1.6 extension table exactly as it shipped. Frozen: never edit
//! this file.

#![allow(dead_code, missing_docs)]

use crate::frozen::{FfiResult, InstancePtr};
use abi_stable::StableAbi;

#[repr(C)]
#[derive(StableAbi, Copy, Clone)]
pub struct HookTableV1_6 {
    pub grant_request_share: extern "C" fn(InstancePtr, u32) -> FfiResult<()>,
}
