//! A forged provider library, built by `cargo test` for `tests/forged_module.rs`
//! (an example, so its types belong to this package as a shipped library's
//! do), written without `export_provider!` from the shipped 1.1 definitions (as any
//! library can be): its root module and hook tables have the genuine ABI 1.1
//! layouts, but its 1.1 extension pairs the genuine table layout with a
//! pointer to other data. A host that trusted the layout check alone would
//! call `inspect_lease` at address 0x10; the loader must refuse the library.

#[path = "../tests/frozen/abi_1_1.rs"]
mod frozen;

use abi_stable::{
    export_root_module,
    prefix_type::PrefixTypeTrait,
    std_types::{RErr, RNone, ROption, RSome},
    StableAbi,
};
use frozen::{Extension, FfiResult, HookTableV1_0, InstancePtr, ProviderModule, ProviderModuleRef};
use provider_abi::{OutputSink, ProviderError, ABI_1_1};

/// What the forged table points at: data where a function should be.
static OTHER_DATA: [usize; 1] = [0x10];

fn refuse<T>() -> FfiResult<T> {
    RErr(ProviderError::internal("forged provider"))
}

extern "C" fn new_instance() -> FfiResult<InstancePtr> {
    refuse()
}

extern "C" fn drop_instance(_: InstancePtr) {}

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

extern "C" fn extension(minor: u16) -> ROption<Extension> {
    match minor {
        1 => RSome(Extension {
            layout: (<frozen::HookTableV1_1 as StableAbi>::LAYOUT
                as *const abi_stable::type_layout::TypeLayout)
                .cast(),
            table: OTHER_DATA.as_ptr().cast(),
        }),
        _ => RNone,
    }
}

/// The forged root module.
#[export_root_module]
pub fn provider_root_module() -> ProviderModuleRef {
    ProviderModule {
        abi_version: ABI_1_1,
        new_instance,
        drop_instance,
        hooks: HookTableV1_0 {
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
        },
        extension,
    }
    .leak_into_prefix()
}
