//! The write-ahead callback of ABI 1.2: a provider hands the host each lease
//! the moment its remote resource exists, and goes on only once the host has
//! made the record durable.

use crate::{
    error::{HookResult, ProviderError},
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
}
