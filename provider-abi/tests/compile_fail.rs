//! Safe code outside the crate cannot reach the raw module: each program in
//! `tests/ui/` did undefined behaviour with ABI 1.1's public fields and must
//! now fail to compile, with the error recorded beside it.

#[test]
fn the_raw_module_is_unreachable_from_safe_code() {
    trybuild::TestCases::new().compile_fail("tests/ui/*.rs");
}
