// Building an instance pointer out of thin air.
#![forbid(unsafe_code)]
use provider_abi::module::InstancePtr;

fn main() {
    let _forged = InstancePtr(std::ptr::without_provenance(0x10));
}
