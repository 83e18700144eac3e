//! The root module and the hook table keep the layout ABI 2.0 libraries were
//! built with: a library built from the frozen 2.0 definitions loads into
//! this host, and a library built now loads into a 2.0 host. The fixture
//! libraries `fixture-frozen` and `fixture-next-minor` prove the same by
//! loading; this test compares the definitions themselves.

#[path = "frozen/abi_2_0.rs"]
mod frozen;

use abi_stable::{
    abi_stability::abi_checking::check_layout_compatibility, type_layout::TypeLayout, StableAbi,
};
use provider_abi::{module, ProviderModuleRef};

/// Each pair is (as shipped, as defined now).
fn pairs() -> [(&'static str, &'static TypeLayout, &'static TypeLayout); 3] {
    [
        ("root module", frozen::ProviderModuleRef::LAYOUT, ProviderModuleRef::LAYOUT),
        ("instance pointer", frozen::InstancePtr::LAYOUT, module::InstancePtr::LAYOUT),
        ("hook table", frozen::HookTableRef::LAYOUT, module::HookTableRef::LAYOUT),
    ]
}

#[test]
fn shipped_and_current_layouts_are_compatible_both_ways() {
    for (name, shipped, current) in pairs() {
        check_layout_compatibility(shipped, current)
            .unwrap_or_else(|error| panic!("{name}: a 2.0 library would not load: {error}"));
        check_layout_compatibility(current, shipped)
            .unwrap_or_else(|error| panic!("{name}: a new library would not load in a 2.0 host: {error}"));
    }
}

#[test]
fn the_check_tells_different_layouts_apart() {
    // The comparison above would be worthless if any two layouts passed.
    let result = check_layout_compatibility(frozen::InstancePtr::LAYOUT, module::HookTableRef::LAYOUT);
    assert!(result.is_err(), "an instance pointer and a hook table must not be interchangeable");
}
