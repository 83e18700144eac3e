// Reaching the raw functions through the prefix struct behind the module ref.
#![forbid(unsafe_code)]
use provider_abi::ProviderModuleRef;

fn drop_twice(module: ProviderModuleRef) {
    let instance = (module.0.prefix().new_instance)().unwrap();
    (module.0.prefix().drop_instance)(instance);
    (module.0.prefix().drop_instance)(instance);
}

fn main() {}
