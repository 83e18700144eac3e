//! The futures the async hooks and the creation recorder hand across the
//! boundary, and [`blocking`], which runs a blocking body as a hook's future.
//!
//! A provider returns a [`HookFuture`]: `'static`, so it owns what it needs
//! (the provider runs the work on its own runtime and hands back a future of
//! the result). The export layer wraps it in [`export`], which turns a panic
//! while it is built, polled or dropped into an `internal` error, and hands
//! it over as an `async_ffi::FfiFuture`; the host side polls that through
//! [`Imported`], which turns a panic reported by a foreign library into an
//! error too. Dropping the future before it is ready cancels the call, with
//! the guarantees the provider documents for each hook.

use crate::{
    error::{HookResult, ProviderError},
    export::{caught_panic, drop_panic_payload, guard, Place},
    module::FfiResult,
    version::Hook,
};
use async_ffi::{FfiFuture, FutureExt as _};
use std::{
    future::Future,
    panic::{catch_unwind, AssertUnwindSafe},
    pin::Pin,
    task::{Context, Poll},
};

/// What an async hook returns: a `'static` future of the hook's result,
/// which the host may poll from any executor and drop to cancel the call.
pub type HookFuture<T> = Pin<Box<dyn Future<Output = HookResult<T>> + Send + 'static>>;

/// A ready future: what a hook the provider lacks returns.
pub fn ready<T: Send + 'static>(result: HookResult<T>) -> HookFuture<T> {
    Box::pin(std::future::ready(result))
}

/// Runs a blocking body on a thread of its own and answers with its result:
/// how a provider without an async runtime writes an async hook. Dropping
/// the future does not stop the body (it runs to its end on its thread);
/// a panic in the body is an `internal` error.
pub fn blocking<T, F>(body: F) -> HookFuture<T>
where
    T: Send + 'static,
    F: FnOnce() -> HookResult<T> + Send + 'static,
{
    let (sender, receiver) = futures_channel::oneshot::channel();
    let spawned = std::thread::Builder::new().name("provider-blocking".into()).spawn(move || {
        let result = catch_unwind(AssertUnwindSafe(body)).unwrap_or_else(|payload| {
            drop_panic_payload(payload);
            Err(ProviderError::internal("The provider panicked in a blocking hook body."))
        });
        // The host may have dropped the future (cancelled the call).
        let _ = sender.send(result);
    });
    if let Err(error) = spawned {
        return ready(Err(ProviderError::internal(format!("cannot start a thread for a hook: {error}"))));
    }
    Box::pin(async move {
        receiver
            .await
            .unwrap_or_else(|_| Err(ProviderError::internal("a blocking hook body ended without an answer")))
    })
}

/// Whose future crosses the boundary, for the error a panic in it becomes.
#[derive(Copy, Clone, Debug)]
pub(crate) enum Origin {
    /// An async hook's future, made by the provider.
    Hook(Hook),
    /// A write-ahead record's future, made by the host.
    Recorder,
}

/// What a panic in the host's recorder becomes: the host's panic text stays
/// on the host side.
pub(crate) const RECORDER_PANICKED: &str = "The host panicked while recording a created lease.";

impl Origin {
    /// The `internal` error for a panic caught here; drops the payload.
    fn panicked(self, payload: Box<dyn std::any::Any + Send>) -> ProviderError {
        match self {
            Origin::Hook(hook) => caught_panic(Place::Hook(hook), payload),
            Origin::Recorder => {
                drop_panic_payload(payload);
                ProviderError::internal(RECORDER_PANICKED)
            }
        }
    }

    /// The error for a panic a foreign library reported through `async_ffi`.
    fn foreign_panic(self) -> ProviderError {
        match self {
            Origin::Hook(hook) => {
                ProviderError::internal(format!("The provider panicked in the `{hook}` hook's future."))
            }
            Origin::Recorder => ProviderError::internal(RECORDER_PANICKED),
        }
    }

    /// The error for a future polled again after it completed.
    fn polled_again(self) -> ProviderError {
        match self {
            Origin::Hook(hook) => {
                ProviderError::internal(format!("the `{hook}` hook's future was polled after it completed"))
            }
            Origin::Recorder => {
                ProviderError::internal("the recorder's future was polled after it completed")
            }
        }
    }
}

/// The provider side: builds the hook's future under [`guard`] and wraps it
/// so that no panic crosses the boundary.
pub(crate) fn export<T: Send + 'static>(
    hook: Hook,
    make: impl FnOnce() -> HookFuture<T>,
) -> FfiFuture<FfiResult<T>> {
    let future = match guard(hook, || Ok(make())).into_result() {
        Ok(future) => future,
        Err(error) => ready(Err(error)),
    };
    guarded(Origin::Hook(hook), future)
}

/// Wraps `future` so that its poll and drop never unwind (a panic is an
/// `internal` error of `origin`) and hands it over as an `FfiFuture`.
pub(crate) fn guarded<T: Send + 'static>(origin: Origin, future: HookFuture<T>) -> FfiFuture<FfiResult<T>> {
    Guarded { origin, future: Some(future) }.into_ffi()
}

/// A future whose poll and drop never unwind.
struct Guarded<T> {
    origin: Origin,
    future: Option<HookFuture<T>>,
}

impl<T> Future for Guarded<T> {
    type Output = FfiResult<T>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let origin = self.origin;
        let Some(future) = self.future.as_mut() else {
            return Poll::Ready(Err(origin.polled_again()).into());
        };
        let polled = catch_unwind(AssertUnwindSafe(|| future.as_mut().poll(cx)));
        let ready = match polled {
            Ok(Poll::Pending) => return Poll::Pending,
            Ok(Poll::Ready(result)) => result,
            Err(payload) => Err(origin.panicked(payload)),
        };
        drop_quietly(self.future.take());
        Poll::Ready(ready.into())
    }
}

impl<T> Drop for Guarded<T> {
    fn drop(&mut self) {
        drop_quietly(self.future.take());
    }
}

/// Drops a future, swallowing a panic of its `Drop` (which would otherwise
/// abort inside `async_ffi`'s drop function).
fn drop_quietly<T>(future: Option<HookFuture<T>>) {
    if let Err(payload) = catch_unwind(AssertUnwindSafe(move || drop(future))) {
        drop_panic_payload(payload);
    }
}

/// The receiving side: a future as the other side of the boundary handed
/// it over (a hook's future on the host, a record's on the provider).
pub(crate) struct Imported<T> {
    origin: Origin,
    future: FfiFuture<FfiResult<T>>,
}

impl<T> Imported<T> {
    /// A hook's future, on the host side.
    pub(crate) fn new(hook: Hook, future: FfiFuture<FfiResult<T>>) -> Self {
        Self { origin: Origin::Hook(hook), future }
    }

    /// A write-ahead record's future, on the provider side.
    pub(crate) fn recorded(future: FfiFuture<FfiResult<T>>) -> Self {
        Self { origin: Origin::Recorder, future }
    }
}

impl<T> Future for Imported<T> {
    type Output = HookResult<T>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let origin = self.origin;
        // A library built by this crate never reports a panic (see
        // `guarded`); another one may, which `async_ffi` raises here as a
        // panic.
        match catch_unwind(AssertUnwindSafe(|| Pin::new(&mut self.future).poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(result)) => Poll::Ready(result.into()),
            Err(payload) => {
                drop_panic_payload(payload);
                Poll::Ready(Err(origin.foreign_panic()))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hook's future whose drop panics, ready at once or never.
    struct PanicsWhenDropped {
        ready: bool,
    }

    impl Future for PanicsWhenDropped {
        type Output = HookResult<()>;

        fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Self::Output> {
            if self.ready {
                Poll::Ready(Ok(()))
            } else {
                Poll::Pending
            }
        }
    }

    impl Drop for PanicsWhenDropped {
        fn drop(&mut self) {
            panic!("a provider's future panicked while dropped");
        }
    }

    /// Unguarded, the panic would unwind out of `async_ffi`'s `extern "C"`
    /// drop function and abort the process (the test binary with it).
    #[test]
    fn a_future_that_panics_when_dropped_crosses_without_aborting() {
        let origin = Origin::Hook(Hook::Execute);
        // Dropped (cancelled) before it is ready.
        drop(guarded(origin, Box::pin(PanicsWhenDropped { ready: false })));
        // Dropped by the poll that found it ready.
        let mut crossed = guarded(origin, Box::pin(PanicsWhenDropped { ready: true }));
        let mut context = Context::from_waker(std::task::Waker::noop());
        let polled = Pin::new(&mut crossed).poll(&mut context);
        assert!(matches!(polled, Poll::Ready(abi_stable::std_types::RResult::ROk(()))));
    }
}
