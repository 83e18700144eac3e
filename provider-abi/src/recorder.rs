//! The write-ahead callback of ABI 1.2: a provider hands the host each lease
//! the moment its remote resource exists, and goes on only once the host has
//! made the record durable. ABI 1.8 adds [`AsyncCreationRecorder`], the same
//! callback answering with a future, which the provider awaits without
//! blocking a thread.

use crate::{
    error::{HookResult, ProviderError},
    future::{guarded, ready, HookFuture, Imported, Origin, RECORDER_PANICKED},
    module::FfiHookFuture,
    types::Lease,
};
use abi_stable::{std_types::RResult, StableAbi};
use std::{
    ffi::c_void,
    marker::PhantomData,
    panic::{catch_unwind, AssertUnwindSafe},
};

/// An FFI-safe callback receiving each lease a hook creates, before the hook
/// does anything else with it (`acquire_lease_recording`, `probe_recording`).
///
/// The provider calls [`CreationRecorder::record`] with the lease as a host
/// would later pass it to `destroy_lease` (its id and metadata), right after
/// the creation reply arrives. `Ok` means the host committed the record; on
/// `Err` the provider must delete what it created and fail the hook with
/// that error. A panic in the host's closure is caught at the boundary and
/// comes back as an `internal` error.
#[repr(C)]
#[derive(StableAbi)]
pub struct CreationRecorder<'a> {
    context: *mut c_void,
    record_lease: unsafe extern "C" fn(*mut c_void, &Lease) -> RResult<(), ProviderError>,
    _borrow: PhantomData<&'a mut ()>,
}

// SAFETY: `new` only accepts `Send` closures, and `record` needs `&mut self`,
// so the closure is never called from two threads at once.
unsafe impl Send for CreationRecorder<'_> {}

impl<'a> CreationRecorder<'a> {
    /// A recorder calling `callback(lease)` for every lease created.
    pub fn new<F>(callback: &'a mut F) -> Self
    where
        F: FnMut(&Lease) -> HookResult<()> + Send,
    {
        unsafe extern "C" fn trampoline<F>(context: *mut c_void, lease: &Lease) -> RResult<(), ProviderError>
        where
            F: FnMut(&Lease) -> HookResult<()> + Send,
        {
            // SAFETY: `context` is the `&'a mut F` given to `new`, alive for 'a;
            // `record` takes `&mut self`, so no other reference to it is live.
            let callback = unsafe { &mut *context.cast::<F>() };
            match catch_unwind(AssertUnwindSafe(|| callback(lease))) {
                Ok(result) => result.into(),
                Err(payload) => {
                    crate::export::drop_panic_payload(payload);
                    Err(ProviderError::internal("The host panicked while recording a created lease.")).into()
                }
            }
        }
        Self { context: (callback as *mut F).cast(), record_lease: trampoline::<F>, _borrow: PhantomData }
    }

    /// A recorder that accepts every lease without keeping it: for callers of
    /// the plain hooks, which record nothing ahead.
    pub fn discard() -> CreationRecorder<'static> {
        unsafe extern "C" fn accept(_: *mut c_void, _: &Lease) -> RResult<(), ProviderError> {
            RResult::ROk(())
        }
        CreationRecorder { context: std::ptr::null_mut(), record_lease: accept, _borrow: PhantomData }
    }

    /// Hands `lease` to the host and waits until it is recorded.
    pub fn record(&mut self, lease: &Lease) -> HookResult<()> {
        // SAFETY: `context` and `record_lease` were paired by `new` or
        // `discard` (the fields are private), and `lease` outlives the call.
        unsafe { (self.record_lease)(self.context, lease) }.into()
    }
}

/// An FFI-safe, owned callback receiving each lease an async recording hook
/// creates (`acquire_lease_recording_async`, `probe_recording_async`, ABI
/// 1.8): [`CreationRecorder`] whose answer is a future.
///
/// The provider calls [`AsyncCreationRecorder::record`] right after the
/// creation reply arrives and awaits the future before going on. `Ok` means
/// the host committed the record; on `Err` the provider must delete what it
/// created and fail the hook with that error. A panic in the host's closure,
/// while it makes the future or while the future is polled, comes back as an
/// `internal` error. The provider owns the recorder for as long as the call
/// runs and polls the record's future on its own runtime, where the host's
/// tokio (a library has its own copy of tokio's thread-locals) finds no
/// reactor: a record that needs the host's runtime (an async database
/// client) is spawned there by the closure, which hands back a future of its
/// result (the task's `JoinHandle`, a oneshot receiver).
#[repr(C)]
#[derive(StableAbi)]
pub struct AsyncCreationRecorder {
    context: *mut c_void,
    record_lease: unsafe extern "C" fn(*mut c_void, &Lease) -> FfiHookFuture<()>,
    drop_context: unsafe extern "C" fn(*mut c_void),
}

// SAFETY: `new` only accepts `Send` closures, and `record` needs `&mut self`,
// so the closure is never called from two threads at once.
unsafe impl Send for AsyncCreationRecorder {}

impl AsyncCreationRecorder {
    /// A recorder calling `callback(lease)` for every lease created and
    /// handing its future to the provider.
    pub fn new<F>(callback: F) -> Self
    where
        F: FnMut(&Lease) -> HookFuture<()> + Send + 'static,
    {
        unsafe extern "C" fn trampoline<F>(context: *mut c_void, lease: &Lease) -> FfiHookFuture<()>
        where
            F: FnMut(&Lease) -> HookFuture<()> + Send,
        {
            // SAFETY: `context` is the `Box<F>` leaked by `new`, freed only by
            // `drop_context`; `record` takes `&mut self`, so no other
            // reference to it is live.
            let callback = unsafe { &mut *context.cast::<F>() };
            let future = match catch_unwind(AssertUnwindSafe(|| callback(lease))) {
                Ok(future) => future,
                Err(payload) => {
                    crate::export::drop_panic_payload(payload);
                    ready(Err(ProviderError::internal(RECORDER_PANICKED)))
                }
            };
            guarded(Origin::Recorder, future)
        }
        Self {
            context: Box::into_raw(Box::new(callback)).cast(),
            record_lease: trampoline::<F>,
            drop_context: crate::sink::drop_boxed::<F>,
        }
    }

    /// Hands `lease` to the host; the future is ready once the host recorded
    /// it (`Ok`) or refused (`Err`: delete what was created and fail with it).
    pub fn record(&mut self, lease: &Lease) -> HookFuture<()> {
        // SAFETY: `context` and `record_lease` were paired by `new` (private
        // fields), and `lease` outlives the call (the host's closure clones
        // what its future keeps).
        let future = unsafe { (self.record_lease)(self.context, lease) };
        Box::pin(Imported::recorded(future))
    }
}

impl Drop for AsyncCreationRecorder {
    fn drop(&mut self) {
        // SAFETY: paired by `new`; `drop` runs once.
        unsafe { (self.drop_context)(self.context) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    fn lease(id: &str) -> Lease {
        Lease { provider_lease_id: Some(id.into()).into(), ..Default::default() }
    }

    #[test]
    fn leases_reach_the_host_and_its_answer_comes_back() {
        let mut seen = Vec::new();
        let mut callback = |lease: &Lease| {
            let id = lease.provider_lease_id.as_ref().map(|id| id.to_string()).unwrap_or_default();
            if id == "refused" {
                return Err(ProviderError::internal("ledger is full"));
            }
            seen.push(id);
            Ok(())
        };
        let mut recorder = CreationRecorder::new(&mut callback);
        assert!(recorder.record(&lease("a")).is_ok());
        assert_eq!(recorder.record(&lease("refused")).unwrap_err().message.as_str(), "ledger is full");
        assert_eq!(seen, ["a"]);
    }

    #[test]
    fn a_panicking_host_closure_is_an_internal_error() {
        let mut callback = |_: &Lease| -> HookResult<()> { panic!("host ledger exploded") };
        let error = CreationRecorder::new(&mut callback).record(&lease("a")).unwrap_err();
        assert_eq!(error.kind, ErrorKind::INTERNAL);
        assert!(!error.message.contains("exploded"), "the host's panic text stays on the host side");
    }

    #[test]
    fn the_discarding_recorder_accepts_everything() {
        assert!(CreationRecorder::discard().record(&lease("a")).is_ok());
    }

    /// Polls a future that never waits once.
    fn now<T>(mut future: HookFuture<T>) -> HookResult<T> {
        let mut context = std::task::Context::from_waker(std::task::Waker::noop());
        match future.as_mut().poll(&mut context) {
            std::task::Poll::Ready(result) => result,
            std::task::Poll::Pending => panic!("the record's future waited"),
        }
    }

    fn id_of(lease: &Lease) -> String {
        lease.provider_lease_id.as_ref().map(|id| id.to_string()).unwrap_or_default()
    }

    #[test]
    fn async_records_reach_the_host_and_its_answer_comes_back() {
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let kept = std::sync::Arc::clone(&seen);
        let mut recorder = AsyncCreationRecorder::new(move |lease: &Lease| -> HookFuture<()> {
            let (id, kept) = (id_of(lease), std::sync::Arc::clone(&kept));
            Box::pin(async move {
                if id == "refused" {
                    return Err(ProviderError::internal("ledger is full"));
                }
                kept.lock().unwrap().push(id);
                Ok(())
            })
        });
        assert!(now(recorder.record(&lease("a"))).is_ok());
        assert_eq!(now(recorder.record(&lease("refused"))).unwrap_err().message.as_str(), "ledger is full");
        drop(recorder);
        assert_eq!(std::sync::Arc::strong_count(&seen), 1, "dropping the recorder drops the closure");
        assert_eq!(*seen.lock().unwrap(), ["a"]);
    }

    #[test]
    fn a_host_panic_making_or_polling_the_record_is_an_internal_error() {
        let mut recorder = AsyncCreationRecorder::new(|lease: &Lease| -> HookFuture<()> {
            if id_of(lease) == "now" {
                panic!("host ledger exploded");
            }
            Box::pin(async { panic!("host ledger exploded later") })
        });
        for id in ["now", "later"] {
            let error = now(recorder.record(&lease(id))).unwrap_err();
            assert_eq!(error.kind, ErrorKind::INTERNAL, "{id}");
            assert_eq!(error.message.as_str(), RECORDER_PANICKED, "{id}: the host's text stays on its side");
        }
    }
}
