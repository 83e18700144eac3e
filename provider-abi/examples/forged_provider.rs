//! A forged provider library, built by `cargo test` for `tests/forged_module.rs`
//! (an example, so its types belong to this package as a shipped library's
//! do), written without `export_provider!` from the shipped 1.1 definitions (as any
//! library can be): its root module and hook tables have the genuine ABI 1.1
//! layouts, but its 1.1 extension pairs the genuine table layout with a
//! pointer to other data. A host that trusted the layout check alone would
//! call `inspect_lease` at address 0x10; the loader must refuse the library.

mod forged;

use abi_stable::{export_root_module, std_types::RSome, StableAbi};
use forged::{
    frozen::{Extension, ProviderModuleRef},
    RNone, ROption,
};

/// What the forged table points at: data where a function should be.
static OTHER_DATA: [usize; 1] = [0x10];

extern "C" fn extension(minor: u16) -> ROption<Extension> {
    match minor {
        1 => RSome(Extension {
            layout: (<forged::frozen::HookTableV1_1 as StableAbi>::LAYOUT
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
    forged::root_module(forged::drop_instance, extension)
}
