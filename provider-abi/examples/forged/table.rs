//! The root module of the `forged_table_1_N` examples: genuine layouts, but
//! its ABI 1.N hook table hands over a pointer outside the library, and it
//! has no other extension.
//!
//! - 1.0: the root module's hook table hands over the C library's `abort` as
//!   `shutdown`, a function outside the library.
//! - 1.1 and later: the extension pairs the genuine table layout with a
//!   pointer to other data, so a host that trusted the layout check alone
//!   would call address 0x10.
//!
//! The loader must refuse each library before it calls anything the module
//! hands over, naming the table.

use super::{
    frozen::{Extension, FfiResult, HookTableV1_0, InstancePtr, ProviderModuleRef},
    RNone, ROption,
};
use abi_stable::{std_types::RSome, type_layout::TypeLayout, StableAbi};
use provider_abi::module::{
    HookTableV1_1, HookTableV1_2, HookTableV1_3, HookTableV1_4, HookTableV1_5, HookTableV1_6, HookTableV1_7,
    HookTableV1_8, HookTableV1_9,
};

/// What a forged extension table points at: data where functions should be.
static OTHER_DATA: [usize; 16] = [0x10; 16];

// The C library's `abort`, declared with the signature of `shutdown`. Never
// called (the loader refuses the library first, and no instance is ever
// made), so the hook's result type need not be one C knows.
#[allow(improper_ctypes)]
unsafe extern "C" {
    #[link_name = "abort"]
    safe fn foreign_shutdown(instance: InstancePtr) -> FfiResult<()>;
}

/// The extension that pairs table `T`'s genuine layout with `OTHER_DATA`.
fn pointing_at_data<T: StableAbi>() -> ROption<Extension> {
    const { assert!(size_of::<T>() <= size_of::<[usize; 16]>(), "the table must lie within OTHER_DATA") };
    RSome(Extension { layout: (T::LAYOUT as *const TypeLayout).cast(), table: OTHER_DATA.as_ptr().cast() })
}

/// The extension tables of a library that forges only its 1.`FORGED` table.
extern "C" fn extension<const FORGED: u16>(minor: u16) -> ROption<Extension> {
    if minor != FORGED {
        return RNone;
    }
    match minor {
        1 => pointing_at_data::<HookTableV1_1>(),
        2 => pointing_at_data::<HookTableV1_2>(),
        3 => pointing_at_data::<HookTableV1_3>(),
        4 => pointing_at_data::<HookTableV1_4>(),
        5 => pointing_at_data::<HookTableV1_5>(),
        6 => pointing_at_data::<HookTableV1_6>(),
        7 => pointing_at_data::<HookTableV1_7>(),
        8 => pointing_at_data::<HookTableV1_8>(),
        9 => pointing_at_data::<HookTableV1_9>(),
        _ => RNone,
    }
}

/// The root module of a library whose ABI 1.`FORGED` hook table points
/// outside it.
pub fn root_module<const FORGED: u16>() -> ProviderModuleRef {
    let hooks = match FORGED {
        0 => HookTableV1_0 { shutdown: foreign_shutdown, ..super::hooks() },
        _ => super::hooks(),
    };
    super::root_module(super::drop_instance, hooks, extension::<FORGED>)
}
