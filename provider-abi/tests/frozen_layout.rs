//! The root module and the hook table keep the layouts ABI 2.0 and 2.1
//! libraries were built with: a library built from the frozen definitions
//! loads into this host, and a library built now loads into a host of
//! either. The fixture libraries `fixture-frozen` (2.0) and
//! `fixture-next-minor` (2.2, appending to the frozen 2.1 table) prove the
//! same by loading; this test compares the definitions themselves.

#[path = "frozen/abi_2_0.rs"]
mod frozen_2_0;
#[path = "frozen/abi_2_1.rs"]
mod frozen_2_1;

use abi_stable::{
    abi_stability::abi_checking::{check_layout_compatibility_with_globals, CheckingGlobals},
    type_layout::TypeLayout,
    StableAbi,
};
use provider_abi::{module, ProviderModuleRef};

/// Each triple is (what, as shipped, as defined now).
type Pair = (&'static str, &'static TypeLayout, &'static TypeLayout);

fn pairs_2_0() -> [Pair; 3] {
    [
        ("root module", frozen_2_0::ProviderModuleRef::LAYOUT, ProviderModuleRef::LAYOUT),
        ("instance pointer", frozen_2_0::InstancePtr::LAYOUT, module::InstancePtr::LAYOUT),
        ("hook table", frozen_2_0::HookTableRef::LAYOUT, module::HookTableRef::LAYOUT),
    ]
}

fn pairs_2_1() -> [Pair; 3] {
    [
        ("root module", frozen_2_1::ProviderModuleRef::LAYOUT, ProviderModuleRef::LAYOUT),
        ("instance pointer", frozen_2_1::InstancePtr::LAYOUT, module::InstancePtr::LAYOUT),
        ("hook table", frozen_2_1::HookTableRef::LAYOUT, module::HookTableRef::LAYOUT),
    ]
}

/// `expected` against `actual`, with checking state of its own: abi_stable's
/// process-wide state remembers the prefix types it saw, and a check of one
/// pair must not depend on which pairs this process checked before.
fn check(expected: &'static TypeLayout, actual: &'static TypeLayout) -> Result<(), String> {
    check_layout_compatibility_with_globals(expected, actual, &CheckingGlobals::new())
        .map_err(|error| error.to_string())
}

#[test]
fn shipped_2_1_and_current_layouts_are_compatible_both_ways() {
    for (name, shipped, current) in pairs_2_1() {
        check(shipped, current)
            .unwrap_or_else(|error| panic!("{name}: a 2.1 library would not load: {error}"));
        check(current, shipped)
            .unwrap_or_else(|error| panic!("{name}: a new library would not load in a 2.1 host: {error}"));
    }
}

#[test]
fn a_shipped_2_0_layout_is_a_prefix_of_the_current_one() {
    // One check answers both questions: a host reads an older minor's
    // library with the library's layout as the expected one, and a 2.0 host
    // reads a new library with its own as the expected one.
    for (name, shipped, current) in pairs_2_0() {
        check(shipped, current).unwrap_or_else(|error| panic!("{name}: 2.0 and now disagree: {error}"));
    }
    // The other way round abi_stable refuses: the current table has more
    // fields than a 2.0 library's (which is why the loader checks an older
    // minor's library the other way round).
    let (_, shipped, current) = pairs_2_0()[2];
    let refused = check(current, shipped).expect_err("a longer table is not a 2.0 table");
    assert!(refused.contains("too many fields"), "{refused}");
}

#[test]
fn the_check_tells_different_layouts_apart() {
    // The comparisons above would be worthless if any two layouts passed.
    let result = check(frozen_2_0::InstancePtr::LAYOUT, module::HookTableRef::LAYOUT);
    assert!(result.is_err(), "an instance pointer and a hook table must not be interchangeable");
}
