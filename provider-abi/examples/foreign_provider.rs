//! A forged provider library, built by `cargo test` for `tests/forged_module.rs`:
//! genuine ABI 1.1 layouts (see `forged/mod.rs`), but the function its root
//! module hands over to drop an instance is the C library's `free`, a
//! function outside the library. The loader must refuse it before it calls
//! anything the module hands over.

mod forged;

use abi_stable::export_root_module;
use forged::{
    frozen::{Extension, InstancePtr, ProviderModuleRef},
    RNone, ROption,
};

unsafe extern "C" {
    /// The C library's `free`, declared with the signature of `drop_instance`
    /// (never called: the loader refuses the library first, and no instance
    /// is ever made).
    safe fn free(instance: InstancePtr);
}

extern "C" fn no_extensions(_minor: u16) -> ROption<Extension> {
    RNone
}

/// The forged root module.
#[export_root_module]
pub fn provider_root_module() -> ProviderModuleRef {
    forged::root_module(free, forged::hooks(), no_extensions)
}
