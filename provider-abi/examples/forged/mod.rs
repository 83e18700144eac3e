//! The parts of a forged provider library shared by the `forged_table_1_N`
//! and `foreign_provider` examples: the genuine ABI 1.1 root module and 1.0
//! hook table, written from the shipped definitions without
//! `export_provider!`, whose every hook refuses (so no instance is ever
//! made). Each example fills in what it forges.

#[path = "../../tests/frozen/abi_1_1.rs"]
pub mod frozen;
#[allow(dead_code)] // the `foreign_provider` example forges no table
pub mod table;

use abi_stable::prefix_type::PrefixTypeTrait;
use abi_stable::std_types::RErr;
pub use abi_stable::std_types::{RNone, ROption};
use frozen::{Extension, FfiResult, HookTableV1_0, InstancePtr, ProviderModule, ProviderModuleRef};
use provider_abi::{OutputSink, ProviderError, ABI_1_1};

fn refuse<T>() -> FfiResult<T> {
    RErr(ProviderError::internal("forged provider"))
}

extern "C" fn new_instance() -> FfiResult<InstancePtr> {
    refuse()
}

/// Drops nothing: no instance is ever made.
#[allow(dead_code)] // the `foreign_provider` example hands over another function
pub extern "C" fn drop_instance(_: InstancePtr) {}

extern "C" fn manifest(_: InstancePtr) -> FfiResult<provider_abi::Manifest> {
    refuse()
}

extern "C" fn no_params<T>(_: InstancePtr) -> FfiResult<T> {
    refuse()
}

extern "C" fn with_params<P, T>(_: InstancePtr, _: &P) -> FfiResult<T> {
    refuse()
}

extern "C" fn execute(
    _: InstancePtr,
    _: &provider_abi::ExecuteParams,
    _: &mut OutputSink<'_>,
) -> FfiResult<provider_abi::ExecuteResult> {
    refuse()
}

/// A genuine ABI 1.0 hook table, every hook of which refuses.
pub fn hooks() -> HookTableV1_0 {
    HookTableV1_0 {
        manifest,
        setup: with_params,
        shutdown: no_params,
        health: no_params,
        validate_config: with_params,
        probe: with_params,
        acquire_lease: with_params,
        resume_lease: with_params,
        release_lease: with_params,
        destroy_lease: with_params,
        realize_workspace: with_params,
        execute,
    }
}

/// The root module of a library whose instance is dropped by
/// `drop_instance`, whose 1.0 hooks are `hooks` and whose extension tables
/// `extension` hands out.
pub fn root_module(
    drop_instance: extern "C" fn(InstancePtr),
    hooks: HookTableV1_0,
    extension: extern "C" fn(u16) -> ROption<Extension>,
) -> ProviderModuleRef {
    ProviderModule { abi_version: ABI_1_1, new_instance, drop_instance, hooks, extension }.leak_into_prefix()
}
