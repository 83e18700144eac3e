// Pairing a genuine table layout with a table pointer to other data.
#![forbid(unsafe_code)]
use provider_abi::{abi_stable::StableAbi, module::{Extension, HookTableV1_1}};

static OTHER_DATA: [usize; 1] = [0x10];

fn main() {
    let _by_constructor = Extension::new(HookTableV1_1::LAYOUT, OTHER_DATA.as_ptr().cast());
}
