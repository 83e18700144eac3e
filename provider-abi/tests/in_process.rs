//! The module and instance contract without a shared library: a provider
//! exported in this process through `provider_module`, as `export_provider!`
//! does, and driven through `Instance` as a host drives a loaded one. Which
//! hooks a table has, what the manifest derives from it, which addresses a
//! host checks, and that an instance is dropped exactly once.

use provider_abi::{
    export::provider_module, ready, AcquireParams, ByteSink, ByteSource, CreationRecorder, EnvironmentParams,
    ExecuteParams, ExecuteResult, HealthReport, Hook, HookFuture, HookResult, Instance, Lease, LeaseParams,
    Manifest, Provider, ProviderError, ProviderModuleRef, ReleaseReport, ValidationReport, Workspace,
    ABI_VERSION,
};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Instances of `Minimal<true>` dropped so far (only the drop test makes
/// them, so tests running at once do not disturb its count).
static DROPPED: AtomicUsize = AtomicUsize::new(0);

/// A provider with the required hooks only, each answering an error;
/// `COUNTED` ones count their drops.
#[derive(Default)]
struct Minimal<const COUNTED: bool = false>;

impl<const COUNTED: bool> Drop for Minimal<COUNTED> {
    fn drop(&mut self) {
        if COUNTED {
            DROPPED.fetch_add(1, Ordering::SeqCst);
        }
    }
}

fn refused() -> ProviderError {
    ProviderError::internal("not in this test")
}

impl<const COUNTED: bool> Provider for Minimal<COUNTED> {
    fn manifest(&self) -> Manifest {
        Manifest {
            id: "minimal".into(),
            version: "0.1.0".into(),
            display_name: "Minimal".into(),
            driver_key: "minimal".into(),
            // The provider's word on these two is replaced by the table's.
            abi_version: provider_abi::AbiVersion::new(9, 9),
            hooks: vec!["everything".into()].into(),
            config_schema_json: "{}".into(),
        }
    }
    fn health(&self) -> HookResult<HealthReport> {
        Err(refused())
    }
    fn validate_config(&self, _: &EnvironmentParams) -> HookResult<ValidationReport> {
        Err(refused())
    }
    fn acquire_lease(&self, _: AcquireParams, _: CreationRecorder) -> HookFuture<Lease> {
        ready(Err(refused()))
    }
    fn resume_lease(&self, _: LeaseParams) -> HookFuture<Lease> {
        ready(Err(refused()))
    }
    fn release_lease(&self, _: LeaseParams) -> HookFuture<ReleaseReport> {
        ready(Err(refused()))
    }
    fn destroy_lease(&self, _: LeaseParams) -> HookFuture<()> {
        ready(Err(refused()))
    }
    fn realize_workspace(&self, _: &LeaseParams) -> HookResult<Workspace> {
        Err(refused())
    }
    fn execute(&self, _: ExecuteParams, _: ByteSource, _: ByteSink) -> HookFuture<ExecuteResult> {
        ready(Err(refused()))
    }
}

/// The two shapes of table: every optional hook named, and none.
fn modules() -> [(ProviderModuleRef, bool); 2] {
    [(provider_module::<Minimal>(&Hook::OPTIONAL), true), (provider_module::<Minimal>(&[]), false)]
}

fn instance(module: ProviderModuleRef) -> Instance {
    // SAFETY: the module was built in this process, whose code stays loaded;
    // its addresses are this binary's own functions.
    unsafe { Instance::new(module) }.unwrap_or_else(|error| panic!("{error}"))
}

#[test]
fn a_table_has_every_required_hook_and_the_optional_ones_the_export_named() {
    for (module, with_optional) in modules() {
        let instance = instance(module);
        for hook in Hook::ALL {
            let expected = !hook.is_optional() || with_optional;
            assert_eq!(instance.supports(hook), expected, "{hook} (optional named: {with_optional})");
        }
    }
}

#[test]
fn the_manifest_takes_its_hooks_and_abi_version_from_the_table() {
    for (module, with_optional) in modules() {
        let manifest = instance(module).manifest();
        let expected: Vec<&str> = Hook::ALL
            .into_iter()
            .filter(|hook| !hook.is_optional() || with_optional)
            .map(|hook| hook.name())
            .collect();
        let hooks: Vec<&str> = manifest.hooks.iter().map(|hook| hook.as_str()).collect();
        assert_eq!(hooks, expected, "optional named: {with_optional}");
        assert_eq!(manifest.abi_version, ABI_VERSION);
        assert_eq!(module.library_abi(), ABI_VERSION);
        assert_eq!(manifest.id, "minimal", "the rest is the provider's");
    }
}

#[test]
fn code_addresses_name_the_constructor_the_destructor_and_every_hook_present() {
    for (module, with_optional) in modules() {
        let addresses = module.code_addresses();
        let names: Vec<&str> = addresses.iter().map(|(what, _)| *what).collect();
        let mut expected = vec!["root module constructor".to_string(), "root module destructor".to_string()];
        // The required hooks in table order, then the optional ones present.
        let (required, optional): (Vec<Hook>, Vec<Hook>) =
            Hook::ALL.into_iter().partition(|hook| !hook.is_optional());
        expected.extend(required.iter().map(|hook| format!("{hook} hook")));
        if with_optional {
            expected.extend(optional.iter().map(|hook| format!("{hook} hook")));
        }
        assert_eq!(names, expected, "optional named: {with_optional}");
        let mut distinct: Vec<usize> = addresses.iter().map(|(_, address)| *address as usize).collect();
        assert!(distinct.iter().all(|&address| address != 0), "{addresses:?}");
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), addresses.len(), "every function is its own: {addresses:?}");
    }
}

#[test]
fn an_instance_is_dropped_exactly_once_when_the_host_drops_it() {
    let instance = instance(provider_module::<Minimal<true>>(&[]));
    // `Instance::new` built one provider and kept it.
    assert_eq!(DROPPED.load(Ordering::SeqCst), 0);
    drop(instance);
    assert_eq!(DROPPED.load(Ordering::SeqCst), 1);
}
