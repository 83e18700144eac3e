//! The write-ahead callback of the creating hooks (`acquire_lease`, `probe`):
//! the host hears that a creation request is about to leave, and then the
//! lease it created, and the provider goes on only once each is durable.

use crate::{
    error::ProviderError,
    export::{quietly, Place, RECORDER_PANICKED},
    future::{guarded, imported, ready, HookFuture},
    module::FfiHookFuture,
    types::Lease,
};
use abi_stable::StableAbi;
use std::ffi::c_void;

/// What the host does at each moment a creating hook reports.
pub trait RecordCreation: Send + 'static {
    /// A creation request is about to leave (pacing has admitted it): until
    /// now nothing can exist remotely.
    fn sending(&mut self) -> HookFuture<()>;

    /// The creation reply arrived and named `lease`.
    fn created(&mut self, lease: &Lease) -> HookFuture<()>;
}

/// An FFI-safe, owned callback a creating hook reports to, in order:
/// [`CreationRecorder::sending`] right before each creation request leaves,
/// and [`CreationRecorder::record`] with the lease as soon as the reply
/// names it (its id and metadata, as a host would later pass it to
/// `destroy_lease`).
///
/// The provider awaits each future before going on. `Ok` means the host made
/// the moment durable; on `Err` the provider sends nothing more (after
/// `sending`) or deletes what it created (after `record`) and fails the hook
/// with that error. A panic in the host's callback, while it makes the
/// future or while the future is polled, comes back as an `internal` error.
///
/// The provider polls the futures on its own runtime, where the host's tokio
/// (a library has its own copy of tokio's thread-locals) finds no reactor: a
/// record that needs the host's runtime is spawned there by the callback,
/// which hands back a future of its result (a oneshot receiver).
#[repr(C)]
#[derive(StableAbi)]
pub struct CreationRecorder {
    context: *mut c_void,
    sending: unsafe extern "C" fn(*mut c_void) -> FfiHookFuture<()>,
    record_lease: unsafe extern "C" fn(*mut c_void, &Lease) -> FfiHookFuture<()>,
    drop_context: unsafe extern "C" fn(*mut c_void),
}

// SAFETY: `new` only accepts `Send` callbacks, and both calls need
// `&mut self`, so the callback is never called from two threads at once.
unsafe impl Send for CreationRecorder {}

/// The callback of [`CreationRecorder::discard`].
struct Discard;

impl RecordCreation for Discard {
    fn sending(&mut self) -> HookFuture<()> {
        ready(Ok(()))
    }

    fn created(&mut self, _lease: &Lease) -> HookFuture<()> {
        ready(Ok(()))
    }
}

impl CreationRecorder {
    /// A recorder reporting to `callback`.
    pub fn new<R: RecordCreation>(callback: R) -> Self {
        unsafe extern "C" fn sending<R: RecordCreation>(context: *mut c_void) -> FfiHookFuture<()> {
            // SAFETY: `context` is the `Box<R>` leaked by `new`, freed only by
            // `drop_context`; both calls take `&mut self`, so no other
            // reference to it is live.
            let callback = unsafe { &mut *context.cast::<R>() };
            guarded(Place::Recorder, caught(|| callback.sending()))
        }
        unsafe extern "C" fn record_lease<R: RecordCreation>(
            context: *mut c_void,
            lease: &Lease,
        ) -> FfiHookFuture<()> {
            // SAFETY: as in `sending`.
            let callback = unsafe { &mut *context.cast::<R>() };
            guarded(Place::Recorder, caught(|| callback.created(lease)))
        }
        Self {
            context: Box::into_raw(Box::new(callback)).cast(),
            sending: sending::<R>,
            record_lease: record_lease::<R>,
            drop_context: crate::sink::drop_boxed::<R>,
        }
    }

    /// A recorder that accepts every moment without keeping it: for a caller
    /// that records nothing ahead (a test, a benchmark).
    pub fn discard() -> Self {
        Self::new(Discard)
    }

    /// Tells the host a creation request is about to leave; the future is
    /// ready once that is durable (`Ok`) or the host refused (`Err`: send
    /// nothing and fail with it).
    pub fn sending(&mut self) -> HookFuture<()> {
        // SAFETY: `context` and `sending` were paired by `new` (private fields).
        imported(Place::Recorder, unsafe { (self.sending)(self.context) })
    }

    /// Hands `lease` to the host; the future is ready once the host recorded
    /// it (`Ok`) or refused (`Err`: delete what was created and fail with it).
    pub fn record(&mut self, lease: &Lease) -> HookFuture<()> {
        // SAFETY: `context` and `record_lease` were paired by `new` (private
        // fields), and `lease` outlives the call (the host's callback clones
        // what its future keeps).
        imported(Place::Recorder, unsafe { (self.record_lease)(self.context, lease) })
    }
}

/// Makes the host's future, turning a panic while making it into an error.
fn caught(make: impl FnOnce() -> HookFuture<()>) -> HookFuture<()> {
    quietly(make).unwrap_or_else(|| ready(Err(ProviderError::internal(RECORDER_PANICKED))))
}

impl Drop for CreationRecorder {
    fn drop(&mut self) {
        // SAFETY: paired by `new`; `drop` runs once.
        unsafe { (self.drop_context)(self.context) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ErrorKind, HookResult};
    use std::sync::{Arc, Mutex};

    fn lease(id: &str) -> Lease {
        Lease { provider_lease_id: Some(id.into()).into(), ..Default::default() }
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

    /// Keeps every moment it hears, refusing a lease named `refused`.
    struct Journal(Arc<Mutex<Vec<String>>>);

    impl RecordCreation for Journal {
        fn sending(&mut self) -> HookFuture<()> {
            self.0.lock().unwrap().push("sending".into());
            ready(Ok(()))
        }

        fn created(&mut self, lease: &Lease) -> HookFuture<()> {
            let (id, kept) = (id_of(lease), Arc::clone(&self.0));
            Box::pin(async move {
                if id == "refused" {
                    return Err(ProviderError::internal("ledger is full"));
                }
                kept.lock().unwrap().push(id);
                Ok(())
            })
        }
    }

    #[test]
    fn both_moments_reach_the_host_and_its_answer_comes_back() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let mut recorder = CreationRecorder::new(Journal(Arc::clone(&seen)));
        assert!(now(recorder.sending()).is_ok());
        assert!(now(recorder.record(&lease("a"))).is_ok());
        assert_eq!(now(recorder.record(&lease("refused"))).unwrap_err().message.as_str(), "ledger is full");
        drop(recorder);
        assert_eq!(Arc::strong_count(&seen), 1, "dropping the recorder drops the callback");
        assert_eq!(*seen.lock().unwrap(), ["sending", "a"]);
    }

    /// Panics making the future for `now`, and inside the future otherwise.
    struct Panics;

    impl RecordCreation for Panics {
        fn sending(&mut self) -> HookFuture<()> {
            panic!("host ledger exploded")
        }

        fn created(&mut self, _lease: &Lease) -> HookFuture<()> {
            Box::pin(async { panic!("host ledger exploded later") })
        }
    }

    #[test]
    fn a_host_panic_making_or_polling_a_record_is_an_internal_error() {
        let mut recorder = CreationRecorder::new(Panics);
        for result in [now(recorder.sending()), now(recorder.record(&lease("a")))] {
            let error = result.unwrap_err();
            assert_eq!(error.kind, ErrorKind::INTERNAL);
            assert_eq!(error.message.as_str(), RECORDER_PANICKED, "the host's text stays on its side");
        }
    }

    #[test]
    fn the_discarding_recorder_accepts_everything() {
        let mut recorder = CreationRecorder::discard();
        assert!(now(recorder.sending()).is_ok());
        assert!(now(recorder.record(&lease("a"))).is_ok());
    }
}
