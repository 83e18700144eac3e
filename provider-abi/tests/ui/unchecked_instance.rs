// Creating an instance from a module whose addresses were never checked:
// the constructor is `unsafe`, so safe code cannot.
#![forbid(unsafe_code)]
use provider_abi::{Instance, ProviderModuleRef};

fn unchecked(module: ProviderModuleRef) {
    let _ = Instance::new(module);
}

fn main() {}
