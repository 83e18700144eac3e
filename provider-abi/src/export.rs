//! The provider side of the boundary: turns a [`Provider`] into a root module.
//!
//! Every hook goes through [`guard`], which turns a panic into an `internal`
//! error naming where it happened: `extern "C"` functions abort the process
//! when a panic escapes them.

use crate::{
    error::{HookResult, ProviderError},
    file_sync::{SyncParams, SyncResult},
    log::{LogLevel, LogSink},
    memory::MemoryEntry,
    module::*,
    provider::Provider,
    recorder::CreationRecorder,
    sink::ByteSink,
    source::ByteSource,
    types::*,
    version::{Hook, ABI_VERSION},
};
use abi_stable::{
    prefix_type::PrefixTypeTrait,
    std_types::{RSlice, RVec},
};
use std::{
    any::Any,
    fmt,
    panic::{catch_unwind, AssertUnwindSafe},
};

/// Exports a provider type as the library's root module.
///
/// `$provider` must implement [`Provider`] and `Default`. The crate must also
/// depend on `abi_stable` directly (its export attribute names it). The
/// optional hooks the provider implements are named after `optional`
/// (`Hook` variants: `Probe`, `InspectLease`, `SyncFiles`,
/// `ImportUnconfirmed`, `GrantRequestShare`, `ExportMemory`,
/// `ImportMemory`); the others are left out of its
/// table, so a host reports them `unsupported` without calling.
///
/// ```text
/// provider_abi::export_provider!(MyProvider, optional = [Probe, InspectLease]);
/// ```
#[macro_export]
macro_rules! export_provider {
    ($provider:ty $(, optional = [$($hook:ident),* $(,)?])? $(,)?) => {
        /// The provider root module (see `provider_abi::export_provider!`).
        #[::abi_stable::export_root_module]
        pub fn provider_root_module() -> $crate::ProviderModuleRef {
            $crate::export::provider_module::<$provider>(&[$($($crate::Hook::$hook),*)?])
        }
    };
}

/// Builds the root module of provider `P`, whose table has the optional
/// hooks in `optional` (every other hook of `optional` is ignored: the
/// required ones are always there).
pub fn provider_module<P: Provider + Default>(optional: &[Hook]) -> ProviderModuleRef {
    let has = |hook: Hook| optional.contains(&hook);
    let hooks = HookTable {
        manifest: manifest::<P>,
        setup: setup::<P>,
        shutdown: shutdown::<P>,
        health: health::<P>,
        validate_config: validate_config::<P>,
        probe: has(Hook::Probe).then_some(probe::<P> as _),
        acquire_lease: acquire_lease::<P>,
        resume_lease: resume_lease::<P>,
        release_lease: release_lease::<P>,
        destroy_lease: destroy_lease::<P>,
        realize_workspace: realize_workspace::<P>,
        execute: execute::<P>,
        inspect_lease: has(Hook::InspectLease).then_some(inspect_lease::<P> as _),
        sync_files: has(Hook::SyncFiles).then_some(sync_files::<P> as _),
        import_unconfirmed: has(Hook::ImportUnconfirmed).then_some(import_unconfirmed::<P> as _),
        grant_request_share: has(Hook::GrantRequestShare).then_some(grant_request_share::<P> as _),
        export_memory: has(Hook::ExportMemory).then_some(export_memory::<P> as _),
        import_memory: has(Hook::ImportMemory).then_some(import_memory::<P> as _),
    };
    ProviderModule {
        abi_version: ABI_VERSION,
        new_instance: new_instance::<P>,
        drop_instance: drop_instance::<P>,
        hooks: hooks.leak_into_prefix(),
    }
    .leak_into_prefix()
}

/// Where a caught panic happened, for its error.
#[derive(Copy, Clone, Debug)]
pub(crate) enum Place {
    /// Inside a hook or its future.
    Hook(Hook),
    /// Inside the provider's constructor (`Default`) or its `Drop`.
    Constructor,
    /// Inside the host's write-ahead recorder or its future.
    Recorder,
}

impl fmt::Display for Place {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Place::Hook(hook) => write!(f, "the `{hook}` hook"),
            Place::Constructor => f.write_str("its constructor"),
            Place::Recorder => f.write_str("the recorder"),
        }
    }
}

/// What a panic in the host's recorder becomes: the host's panic text stays
/// on the host side.
pub(crate) const RECORDER_PANICKED: &str = "The host panicked while recording a created lease.";

/// Runs a hook, turning a panic into an `internal` error.
///
/// The panic's payload is dropped under [`drop_panic_payload`], so a payload
/// whose own `Drop` panics still comes back as an error, never an abort.
pub fn guard<T>(hook: Hook, call: impl FnOnce() -> HookResult<T>) -> FfiResult<T> {
    guard_at(Place::Hook(hook), call)
}

fn guard_at<T>(place: Place, call: impl FnOnce() -> HookResult<T>) -> FfiResult<T> {
    match catch_unwind(AssertUnwindSafe(call)) {
        Ok(result) => result.into(),
        Err(payload) => Err(caught_panic(place, payload)).into(),
    }
}

/// The `internal` error for a panic caught at `place` (naming the panic's
/// first line, except the host's); drops the payload under
/// [`drop_panic_payload`].
pub(crate) fn caught_panic(place: Place, payload: Box<dyn Any + Send>) -> ProviderError {
    let detail = payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("non-string panic payload");
    let first_line: String = detail.lines().next().unwrap_or_default().chars().take(200).collect();
    drop_panic_payload(payload);
    match place {
        Place::Recorder => ProviderError::internal(RECORDER_PANICKED),
        place => ProviderError::internal(format!("The provider panicked in {place}: {first_line}")),
    }
}

/// Drops a caught panic payload without letting a second panic escape: a
/// payload whose `Drop` panics would otherwise unwind out of an `extern "C"`
/// function and abort the process. The second payload is leaked, not dropped.
pub fn drop_panic_payload(payload: Box<dyn Any + Send>) {
    if let Err(second) = catch_unwind(AssertUnwindSafe(move || drop(payload))) {
        std::mem::forget(second);
    }
}

/// Runs `call`, catching a panic: `None` then, its payload dropped under
/// [`drop_panic_payload`]. What every callback and drop that crosses the
/// boundary runs under.
pub(crate) fn quietly<T>(call: impl FnOnce() -> T) -> Option<T> {
    catch_unwind(AssertUnwindSafe(call)).map_err(drop_panic_payload).ok()
}

fn instance<'a, P>(this: InstancePtr) -> &'a P {
    // SAFETY: an `InstancePtr` cannot be built or reached outside this crate
    // (its field and the module's accessors are crate-private). The only one
    // a table of `P` is ever called with is the one `new_instance::<P>` made,
    // which `Instance` keeps alive until its `Drop`, after every call
    // through `&self` has returned.
    unsafe { &*this.0.cast::<P>() }
}

extern "C" fn new_instance<P: Provider + Default>() -> FfiResult<InstancePtr> {
    guard_at(Place::Constructor, || {
        Ok(InstancePtr(Box::into_raw(Box::new(P::default())).cast_const().cast()))
    })
}

extern "C" fn drop_instance<P: Provider>(this: InstancePtr) {
    // SAFETY: as in `instance`; `Instance::drop` is the only caller and runs
    // once per instance, so the box is reclaimed exactly once.
    let owned = unsafe { Box::from_raw(this.0.cast_mut().cast::<P>()) };
    quietly(move || drop(owned));
}

/// Generates one `extern "C"` shim per synchronous hook, each forwarding to
/// the trait method of the same name inside [`guard`]. Arguments and the
/// result cross by `Into` (most as they are; `import_memory`'s entries from
/// an `RSlice`, `export_memory`'s into an `RVec`).
macro_rules! hook_shims {
    ($($name:ident: $hook:ident ($($arg:ident: $ty:ty),*) -> $ret:ty;)*) => {
        $(
            extern "C" fn $name<P: Provider>(this: InstancePtr $(, $arg: $ty)*) -> FfiResult<$ret> {
                guard(Hook::$hook, || instance::<P>(this).$name($($arg.into()),*).map(Into::into))
            }
        )*
    };
}

hook_shims! {
    setup: Setup(params: &SetupParams, logs: LogSink, max_level: LogLevel) -> ();
    shutdown: Shutdown() -> ();
    health: Health() -> HealthReport;
    validate_config: ValidateConfig(params: &EnvironmentParams) -> ValidationReport;
    realize_workspace: RealizeWorkspace(params: &LeaseParams) -> Workspace;
    import_unconfirmed: ImportUnconfirmed(params: &LeaseParams) -> ();
    grant_request_share: GrantRequestShare(parts_per_million: u32) -> ();
    export_memory: ExportMemory() -> RVec<MemoryEntry>;
    import_memory: ImportMemory(entries: RSlice<'_, MemoryEntry>) -> ();
}

/// Generates one `extern "C"` shim per async hook: clones the parameters
/// (the future owns them), passes an owned callback (after `;`) as it is, and
/// hands the trait method's future over through [`crate::future::export`].
macro_rules! async_hook_shims {
    ($($name:ident: $hook:ident ($($arg:ident: &$ty:ty),* $(; $($owned:ident: $oty:ty),+)?) -> $ret:ty;)*) => {
        $(
            extern "C" fn $name<P: Provider>(
                this: InstancePtr $(, $arg: &$ty)* $($(, $owned: $oty)+)?
            ) -> FfiHookFuture<$ret> {
                crate::future::export(Hook::$hook, || instance::<P>(this).$name($($arg.clone()),* $($(, $owned)+)?))
            }
        )*
    };
}

async_hook_shims! {
    probe: Probe(params: &EnvironmentParams; recorder: CreationRecorder) -> ProbeReport;
    acquire_lease: AcquireLease(params: &AcquireParams; recorder: CreationRecorder) -> Lease;
    resume_lease: ResumeLease(params: &LeaseParams) -> Lease;
    release_lease: ReleaseLease(params: &LeaseParams) -> ReleaseReport;
    destroy_lease: DestroyLease(params: &LeaseParams) -> ();
    execute: Execute(params: &ExecuteParams; stdin: ByteSource, output: ByteSink) -> ExecuteResult;
    inspect_lease: InspectLease(params: &LeaseParams) -> LeaseStatus;
    sync_files: SyncFiles(params: &SyncParams) -> SyncResult;
}

extern "C" fn manifest<P: Provider>(this: InstancePtr) -> FfiResult<Manifest> {
    guard(Hook::Manifest, || Ok(instance::<P>(this).manifest()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    /// A panic payload whose own `Drop` panics.
    struct PanicsWhenDropped;

    impl Drop for PanicsWhenDropped {
        fn drop(&mut self) {
            panic!("the payload's drop panicked too");
        }
    }

    #[test]
    fn a_hook_panicking_with_a_payload_that_panics_on_drop_returns_an_error() {
        let result: HookResult<()> =
            guard(Hook::Health, || std::panic::panic_any(PanicsWhenDropped)).into_result();
        let error = result.expect_err("a panic is an error");
        assert_eq!(error.kind, ErrorKind::INTERNAL);
        assert_eq!(
            error.message.as_str(),
            "The provider panicked in the `health` hook: non-string panic payload"
        );
    }

    #[test]
    fn a_panic_in_the_constructor_is_named_as_such() {
        let result: HookResult<()> = guard_at(Place::Constructor, || panic!("no config")).into_result();
        assert_eq!(
            result.unwrap_err().message.as_str(),
            "The provider panicked in its constructor: no config"
        );
    }

    #[test]
    fn a_panic_message_is_cut_to_its_first_line() {
        let result: HookResult<()> = guard(Hook::Probe, || panic!("first line\nsecond line")).into_result();
        assert_eq!(
            result.unwrap_err().message.as_str(),
            "The provider panicked in the `probe` hook: first line"
        );
    }
}
