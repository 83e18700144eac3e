//! The provider side of the boundary: turns a [`Provider`] into a root module.
//!
//! Every hook goes through [`guard`], which turns a panic into an `internal`
//! error: `extern "C"` functions abort the process when a panic escapes them.

use crate::{
    error::{HookResult, ProviderError},
    log::{LogLevel, LogSink},
    module::*,
    provider::Provider,
    recorder::{AsyncCreationRecorder, CreationRecorder},
    sink::{ByteSink, OutputSink, OwnedByteSink},
    source::OwnedByteSource,
    sync::{SyncParams, SyncResult},
    types::*,
    version::{
        AbiVersion, Hook, ABI_1_1, ABI_1_2, ABI_1_3, ABI_1_4, ABI_1_5, ABI_1_6, ABI_1_7, ABI_1_8, ABI_1_9,
    },
};
use abi_stable::{
    prefix_type::PrefixTypeTrait,
    std_types::{RNone, ROption, RSome},
};
use std::{
    any::Any,
    marker::PhantomData,
    panic::{catch_unwind, AssertUnwindSafe},
};

/// Exports a provider type as the library's root module.
///
/// `$provider` must implement [`Provider`] and `Default`. The crate must also
/// depend on `abi_stable` directly (its export attribute names it).
/// `abi = VERSION` builds a library for an older ABI minor version, which
/// leaves out the hooks that version did not have.
#[macro_export]
macro_rules! export_provider {
    ($provider:ty) => {
        $crate::export_provider!($provider, abi = $crate::ABI_VERSION);
    };
    ($provider:ty, abi = $abi:expr) => {
        /// The provider root module (see `provider_abi::export_provider!`).
        #[::abi_stable::export_root_module]
        pub fn provider_root_module() -> $crate::ProviderModuleRef {
            $crate::export::provider_module::<$provider>($abi)
        }
    };
}

/// Builds the root module of provider `P` for ABI level `abi`.
///
/// # Panics
/// If `abi` is not a 1.x version this crate knows.
pub fn provider_module<P: Provider + Default>(abi: AbiVersion) -> ProviderModuleRef {
    assert!(
        abi.major == 1 && abi <= crate::ABI_VERSION,
        "this provider-abi cannot build ABI {abi} libraries"
    );
    let extension = if abi >= ABI_1_9 {
        extensions_to_1_9::<P>
    } else if abi >= ABI_1_8 {
        extensions_to_1_8::<P>
    } else if abi >= ABI_1_7 {
        extensions_to_1_7::<P>
    } else if abi >= ABI_1_6 {
        extensions_to_1_6::<P>
    } else if abi >= ABI_1_5 {
        extensions_to_1_5::<P>
    } else if abi >= ABI_1_4 {
        extensions_to_1_4::<P>
    } else if abi >= ABI_1_3 {
        extensions_to_1_3::<P>
    } else if abi >= ABI_1_2 {
        extensions_to_1_2::<P>
    } else if abi >= ABI_1_1 {
        extensions_to_1_1::<P>
    } else {
        no_extensions
    };
    ProviderModule {
        abi_version: abi,
        new_instance: new_instance::<P>,
        drop_instance: drop_instance::<P>,
        hooks: Tables::<P>::V1_0,
        extension,
    }
    .leak_into_prefix()
}

/// Runs a hook, turning a panic into an `internal` error.
///
/// The panic's payload is dropped under [`drop_panic_payload`], so a payload
/// whose own `Drop` panics still comes back as an error, never an abort.
pub fn guard<T>(hook: Hook, call: impl FnOnce() -> HookResult<T>) -> FfiResult<T> {
    match catch_unwind(AssertUnwindSafe(call)) {
        Ok(result) => result.into(),
        Err(payload) => Err(caught_panic(hook, payload)).into(),
    }
}

/// The `internal` error for a panic caught in `hook`; drops the payload
/// under [`drop_panic_payload`].
pub(crate) fn caught_panic(hook: Hook, payload: Box<dyn Any + Send>) -> ProviderError {
    let error = panic_error(hook, payload.as_ref());
    drop_panic_payload(payload);
    error
}

/// Drops a caught panic payload without letting a second panic escape: a
/// payload whose `Drop` panics would otherwise unwind out of an `extern "C"`
/// function and abort the process. The second payload is leaked, not dropped.
pub fn drop_panic_payload(payload: Box<dyn Any + Send>) {
    if let Err(second) = catch_unwind(AssertUnwindSafe(move || drop(payload))) {
        std::mem::forget(second);
    }
}

fn panic_error(hook: Hook, payload: &(dyn Any + Send)) -> ProviderError {
    let detail = payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("non-string panic payload");
    let first_line: String = detail.lines().next().unwrap_or_default().chars().take(200).collect();
    ProviderError::internal(format!("The provider panicked in the `{hook}` hook: {first_line}"))
}

fn instance<'a, P>(this: InstancePtr) -> &'a P {
    // SAFETY: an `InstancePtr` cannot be built or reached outside this crate
    // (its field and the module's accessors are crate-private). The only one
    // a table of `P` is ever called with is the one `new_instance::<P>` made,
    // which `LoadedProvider` keeps alive until its `Drop`, after every call
    // through `&self` has returned.
    unsafe { &*this.0.cast::<P>() }
}

extern "C" fn new_instance<P: Provider + Default>() -> FfiResult<InstancePtr> {
    guard(Hook::Setup, || Ok(InstancePtr(Box::into_raw(Box::new(P::default())).cast_const().cast())))
}

extern "C" fn drop_instance<P: Provider>(this: InstancePtr) {
    // SAFETY: as in `instance`; `LoadedProvider::drop` is the only caller and
    // runs once per instance, so the box is reclaimed exactly once.
    let owned = unsafe { Box::from_raw(this.0.cast_mut().cast::<P>()) };
    if let Err(payload) = catch_unwind(AssertUnwindSafe(move || drop(owned))) {
        drop_panic_payload(payload);
    }
}

extern "C" fn no_extensions(_minor: u16) -> ROption<Extension> {
    RNone
}

/// The extension tables of a library built for ABI 1.1.
extern "C" fn extensions_to_1_1<P: Provider>(minor: u16) -> ROption<Extension> {
    match minor {
        1 => RSome(Extension::of(Tables::<P>::V1_1)),
        _ => RNone,
    }
}

/// The extension tables of a library built for ABI 1.2.
extern "C" fn extensions_to_1_2<P: Provider>(minor: u16) -> ROption<Extension> {
    match minor {
        2 => RSome(Extension::of(Tables::<P>::V1_2)),
        _ => extensions_to_1_1::<P>(minor),
    }
}

/// The extension tables of a library built for ABI 1.9.
extern "C" fn extensions_to_1_9<P: Provider>(minor: u16) -> ROption<Extension> {
    match minor {
        9 => RSome(Extension::of(Tables::<P>::V1_9)),
        _ => extensions_to_1_8::<P>(minor),
    }
}

/// The extension tables of a library built for ABI 1.8.
extern "C" fn extensions_to_1_8<P: Provider>(minor: u16) -> ROption<Extension> {
    match minor {
        8 => RSome(Extension::of(Tables::<P>::V1_8)),
        _ => extensions_to_1_7::<P>(minor),
    }
}

/// The extension tables of a library built for ABI 1.7.
extern "C" fn extensions_to_1_7<P: Provider>(minor: u16) -> ROption<Extension> {
    match minor {
        7 => RSome(Extension::of(Tables::<P>::V1_7)),
        _ => extensions_to_1_6::<P>(minor),
    }
}

/// The extension tables of a library built for ABI 1.6.
extern "C" fn extensions_to_1_6<P: Provider>(minor: u16) -> ROption<Extension> {
    match minor {
        6 => RSome(Extension::of(Tables::<P>::V1_6)),
        _ => extensions_to_1_5::<P>(minor),
    }
}

/// The extension tables of a library built for ABI 1.5.
extern "C" fn extensions_to_1_5<P: Provider>(minor: u16) -> ROption<Extension> {
    match minor {
        5 => RSome(Extension::of(Tables::<P>::V1_5)),
        _ => extensions_to_1_4::<P>(minor),
    }
}

/// The extension tables of a library built for ABI 1.4.
extern "C" fn extensions_to_1_4<P: Provider>(minor: u16) -> ROption<Extension> {
    match minor {
        4 => RSome(Extension::of(Tables::<P>::V1_4)),
        _ => extensions_to_1_3::<P>(minor),
    }
}

/// The extension tables of a library built for ABI 1.3.
extern "C" fn extensions_to_1_3<P: Provider>(minor: u16) -> ROption<Extension> {
    match minor {
        3 => RSome(Extension::of(Tables::<P>::V1_3)),
        _ => extensions_to_1_2::<P>(minor),
    }
}

/// Generates one `extern "C"` shim per hook, each forwarding to the trait
/// method of the same name inside [`guard`].
macro_rules! hook_shims {
    ($($name:ident: $hook:ident ($($arg:ident: $ty:ty),*) -> $ret:ty;)*) => {
        $(
            extern "C" fn $name<P: Provider>(this: InstancePtr $(, $arg: $ty)*) -> FfiResult<$ret> {
                guard(Hook::$hook, || instance::<P>(this).$name($($arg),*))
            }
        )*
    };
}

hook_shims! {
    setup: Setup(params: &SetupParams) -> ();
    shutdown: Shutdown() -> ();
    health: Health() -> HealthReport;
    validate_config: ValidateConfig(params: &EnvironmentParams) -> ValidationReport;
    probe: Probe(params: &EnvironmentParams) -> ProbeReport;
    acquire_lease: AcquireLease(params: &AcquireParams) -> Lease;
    resume_lease: ResumeLease(params: &LeaseParams) -> Lease;
    release_lease: ReleaseLease(params: &LeaseParams) -> ();
    destroy_lease: DestroyLease(params: &LeaseParams) -> ();
    realize_workspace: RealizeWorkspace(params: &LeaseParams) -> Workspace;
    execute: Execute(params: &ExecuteParams, output: &mut OutputSink<'_>) -> ExecuteResult;
    inspect_lease: InspectLease(params: &LeaseParams) -> LeaseStatus;
    acquire_lease_recording: AcquireLeaseRecording(params: &AcquireParams, recorder: &mut CreationRecorder<'_>) -> Lease;
    probe_recording: ProbeRecording(params: &EnvironmentParams, recorder: &mut CreationRecorder<'_>) -> ProbeReport;
    release_lease_reporting: ReleaseLeaseReporting(params: &LeaseParams) -> ReleaseReport;
    execute_bytes: ExecuteBytes(params: &ExecuteParams, output: &mut ByteSink<'_>) -> ExecuteResult;
    setup_with_logs: SetupWithLogs(params: &SetupParams, logs: LogSink, max_level: LogLevel) -> ();
    sync_in: SyncIn(params: &SyncParams) -> SyncResult;
    sync_out: SyncOut(params: &SyncParams) -> SyncResult;
    import_unconfirmed: ImportUnconfirmed(params: &LeaseParams) -> ();
    grant_request_share: GrantRequestShare(parts_per_million: u32) -> ();
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
    health_async: HealthAsync() -> HealthReport;
    probe_async: ProbeAsync(params: &EnvironmentParams) -> ProbeReport;
    acquire_lease_async: AcquireLeaseAsync(params: &AcquireParams) -> Lease;
    resume_lease_async: ResumeLeaseAsync(params: &LeaseParams) -> Lease;
    release_lease_async: ReleaseLeaseAsync(params: &LeaseParams) -> ReleaseReport;
    destroy_lease_async: DestroyLeaseAsync(params: &LeaseParams) -> ();
    execute_async: ExecuteAsync(params: &ExecuteParams; output: OwnedByteSink) -> ExecuteResult;
    sync_in_async: SyncInAsync(params: &SyncParams) -> SyncResult;
    sync_out_async: SyncOutAsync(params: &SyncParams) -> SyncResult;
    acquire_lease_recording_async:
        AcquireLeaseRecordingAsync(params: &AcquireParams; recorder: AsyncCreationRecorder) -> Lease;
    probe_recording_async:
        ProbeRecordingAsync(params: &EnvironmentParams; recorder: AsyncCreationRecorder) -> ProbeReport;
    execute_stdin_async:
        ExecuteStdinAsync(params: &ExecuteParams; stdin: OwnedByteSource, output: OwnedByteSink) -> ExecuteResult;
}

extern "C" fn manifest<P: Provider>(this: InstancePtr) -> FfiResult<Manifest> {
    guard(Hook::Setup, || Ok(instance::<P>(this).manifest()))
}

/// The hook tables of `P`, as constants so they live in static memory.
struct Tables<P>(PhantomData<P>);

impl<P: Provider> Tables<P> {
    const V1_0: HookTableV1_0 = HookTableV1_0 {
        manifest: manifest::<P>,
        setup: setup::<P>,
        shutdown: shutdown::<P>,
        health: health::<P>,
        validate_config: validate_config::<P>,
        probe: probe::<P>,
        acquire_lease: acquire_lease::<P>,
        resume_lease: resume_lease::<P>,
        release_lease: release_lease::<P>,
        destroy_lease: destroy_lease::<P>,
        realize_workspace: realize_workspace::<P>,
        execute: execute::<P>,
    };
    const V1_1: &'static HookTableV1_1 = &HookTableV1_1 { inspect_lease: inspect_lease::<P> };
    const V1_2: &'static HookTableV1_2 = &HookTableV1_2 {
        acquire_lease_recording: acquire_lease_recording::<P>,
        probe_recording: probe_recording::<P>,
        release_lease_reporting: release_lease_reporting::<P>,
    };
    const V1_3: &'static HookTableV1_3 =
        &HookTableV1_3 { execute_bytes: execute_bytes::<P>, setup_with_logs: setup_with_logs::<P> };
    const V1_4: &'static HookTableV1_4 = &HookTableV1_4 { sync_in: sync_in::<P>, sync_out: sync_out::<P> };
    const V1_5: &'static HookTableV1_5 = &HookTableV1_5 { import_unconfirmed: import_unconfirmed::<P> };
    const V1_6: &'static HookTableV1_6 = &HookTableV1_6 { grant_request_share: grant_request_share::<P> };
    const V1_7: &'static HookTableV1_7 = &HookTableV1_7 {
        health_async: health_async::<P>,
        probe_async: probe_async::<P>,
        acquire_lease_async: acquire_lease_async::<P>,
        resume_lease_async: resume_lease_async::<P>,
        release_lease_async: release_lease_async::<P>,
        destroy_lease_async: destroy_lease_async::<P>,
        execute_async: execute_async::<P>,
    };
    const V1_8: &'static HookTableV1_8 = &HookTableV1_8 {
        sync_in_async: sync_in_async::<P>,
        sync_out_async: sync_out_async::<P>,
        acquire_lease_recording_async: acquire_lease_recording_async::<P>,
        probe_recording_async: probe_recording_async::<P>,
    };
    const V1_9: &'static HookTableV1_9 = &HookTableV1_9 { execute_stdin_async: execute_stdin_async::<P> };
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
    fn a_panic_message_is_cut_to_its_first_line() {
        let result: HookResult<()> = guard(Hook::Probe, || panic!("first line\nsecond line")).into_result();
        assert_eq!(
            result.unwrap_err().message.as_str(),
            "The provider panicked in the `probe` hook: first line"
        );
    }
}
