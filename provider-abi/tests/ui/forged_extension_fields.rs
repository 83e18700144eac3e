// Building an extension table from its fields, which would skip the
// constructor's contract.
#![forbid(unsafe_code)]
use provider_abi::module::Extension;

fn main() {
    let _by_fields = Extension { layout: std::ptr::null(), table: std::ptr::null() };
}
