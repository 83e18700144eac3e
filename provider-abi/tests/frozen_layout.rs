//! The root module and the hook tables keep the layout ABI 1.0/1.1 libraries
//! were built with: making their fields crate-private changed no layout
//! abi_stable checks, so every shipped library still loads (the version-matrix
//! test loads them; this test compares the definitions themselves). The ABI
//! 1.6, 1.7 and 1.8 tables (and 1.8's async recorder) are pinned the same
//! way from the day they shipped.

#[path = "frozen/abi_1_1.rs"]
mod frozen;
#[path = "frozen/abi_1_6.rs"]
mod frozen_1_6;
#[path = "frozen/abi_1_7.rs"]
mod frozen_1_7;
#[path = "frozen/abi_1_8.rs"]
mod frozen_1_8;
#[path = "frozen/abi_1_9.rs"]
mod frozen_1_9;

use abi_stable::{
    abi_stability::abi_checking::check_layout_compatibility, type_layout::TypeLayout, StableAbi,
};
use provider_abi::{module, ProviderModuleRef};

/// Each pair is (as shipped, as defined now).
fn pairs() -> [(&'static str, &'static TypeLayout, &'static TypeLayout); 11] {
    [
        ("root module", frozen::ProviderModuleRef::LAYOUT, ProviderModuleRef::LAYOUT),
        ("instance pointer", frozen::InstancePtr::LAYOUT, module::InstancePtr::LAYOUT),
        ("ABI 1.0 hooks", frozen::HookTableV1_0::LAYOUT, module::HookTableV1_0::LAYOUT),
        ("ABI 1.1 hooks", frozen::HookTableV1_1::LAYOUT, module::HookTableV1_1::LAYOUT),
        ("extension", frozen::Extension::LAYOUT, module::Extension::LAYOUT),
        ("ABI 1.6 hooks", frozen_1_6::HookTableV1_6::LAYOUT, module::HookTableV1_6::LAYOUT),
        ("ABI 1.7 hooks", frozen_1_7::HookTableV1_7::LAYOUT, module::HookTableV1_7::LAYOUT),
        ("ABI 1.8 hooks", frozen_1_8::HookTableV1_8::LAYOUT, module::HookTableV1_8::LAYOUT),
        (
            "ABI 1.8 async recorder",
            frozen_1_8::AsyncCreationRecorder::LAYOUT,
            provider_abi::AsyncCreationRecorder::LAYOUT,
        ),
        ("ABI 1.9 hooks", frozen_1_9::HookTableV1_9::LAYOUT, module::HookTableV1_9::LAYOUT),
        ("ABI 1.9 byte source", frozen_1_9::OwnedByteSource::LAYOUT, provider_abi::OwnedByteSource::LAYOUT),
    ]
}

#[test]
fn shipped_and_current_layouts_are_compatible_both_ways() {
    for (name, shipped, current) in pairs() {
        check_layout_compatibility(shipped, current)
            .unwrap_or_else(|error| panic!("{name}: a shipped library would not load: {error}"));
        check_layout_compatibility(current, shipped).unwrap_or_else(|error| {
            panic!("{name}: a new library would not load in a shipped host: {error}")
        });
    }
}

#[test]
fn the_check_tells_different_tables_apart() {
    // The comparison above would be worthless if any two layouts passed.
    let result = check_layout_compatibility(frozen::HookTableV1_0::LAYOUT, module::HookTableV1_1::LAYOUT);
    assert!(result.is_err(), "the 1.0 and 1.1 tables must not be interchangeable");
}
