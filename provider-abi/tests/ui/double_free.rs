// Dropping an instance twice through the module's raw `drop_instance`.
#![forbid(unsafe_code)]
use provider_abi::{abi_stable::library::RootModule, ProviderModuleRef};

fn main() {
    let module = ProviderModuleRef::load_from_file("libcreateos_provider.so".as_ref()).unwrap();
    let instance = (module.new_instance())().unwrap();
    (module.drop_instance())(instance);
    (module.drop_instance())(instance);
}
