// Calling a hook of the raw table on an instance that was dropped.
#![forbid(unsafe_code)]
use provider_abi::{AcquireParams, CreationRecorder, ProviderModuleRef};

fn call_after_drop(module: ProviderModuleRef) {
    let instance = (module.new_instance())().unwrap();
    (module.drop_instance())(instance);
    let _ = (module.hooks().acquire_lease())(instance, &AcquireParams::default(), CreationRecorder::discard());
}

fn main() {}
