//! The futures the async hooks and the creation recorder hand across the
//! boundary, and [`blocking`], which runs a blocking body as a hook's future.
//!
//! A provider returns a [`HookFuture`]: `'static`, so it owns what it needs
//! (the provider runs the work on its own runtime and hands back a future of
//! the result). The export layer wraps it in [`export`], which turns a panic
//! while it is built, polled or dropped into an `internal` error, and hands
//! it over as an `async_ffi::FfiFuture`; the host side polls that through
//! [`imported`], which turns a panic reported by a foreign library into an
//! error too. Dropping the future before it is ready cancels the call, with
//! the guarantees the provider documents for each hook.

use crate::{
    error::{HookResult, ProviderError},
    export::{caught_panic, guard, quietly, Place, RECORDER_PANICKED},
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
        let result = quietly(body).unwrap_or_else(|| {
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

/// The provider side: builds the hook's future under [`guard`] and wraps it
/// so that no panic crosses the boundary.
pub(crate) fn export<T: Send + 'static>(
    hook: Hook,
    make: impl FnOnce() -> HookFuture<T>,
) -> FfiFuture<FfiResult<T>> {
    let future = guard(hook, || Ok(make())).into_result().unwrap_or_else(|error| ready(Err(error)));
    guarded(Place::Hook(hook), future)
}

/// Wraps `future` so that its poll and drop never unwind (a panic is an
/// `internal` error of `place`) and hands it over as an `FfiFuture`.
pub(crate) fn guarded<T: Send + 'static>(place: Place, future: HookFuture<T>) -> FfiFuture<FfiResult<T>> {
    Guarded { place, future: Some(future) }.into_ffi()
}

/// A future whose poll and drop never unwind.
struct Guarded<T> {
    place: Place,
    future: Option<HookFuture<T>>,
}

impl<T> Future for Guarded<T> {
    type Output = FfiResult<T>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let place = self.place;
        let Some(future) = self.future.as_mut() else {
            let again = format!("{place}'s future was polled after it completed");
            return Poll::Ready(Err(ProviderError::internal(again)).into());
        };
        let ready = match catch_unwind(AssertUnwindSafe(|| future.as_mut().poll(cx))) {
            Ok(Poll::Pending) => return Poll::Pending,
            Ok(Poll::Ready(result)) => result,
            Err(payload) => Err(caught_panic(place, payload)),
        };
        // Its drop, like the one below, must not abort inside `async_ffi`'s
        // drop function.
        quietly(|| drop(self.future.take()));
        Poll::Ready(ready.into())
    }
}

impl<T> Drop for Guarded<T> {
    fn drop(&mut self) {
        quietly(|| drop(self.future.take()));
    }
}

/// The receiving side: a future as the other side of the boundary handed
/// it over (a hook's future on the host, a record's on the provider), as
/// the future that side awaits.
pub(crate) fn imported<T: Send + 'static>(
    place: Place,
    mut future: FfiFuture<FfiResult<T>>,
) -> HookFuture<T> {
    // A library built by this crate never reports a panic (see `guarded`);
    // another one may, which `async_ffi` raises here as a panic.
    let panicked = move || match place {
        Place::Recorder => ProviderError::internal(RECORDER_PANICKED),
        place => ProviderError::internal(format!("The provider panicked in {place}'s future.")),
    };
    Box::pin(std::future::poll_fn(move |cx| match quietly(|| Pin::new(&mut future).poll(cx)) {
        Some(polled) => polled.map(Into::into),
        None => Poll::Ready(Err(panicked())),
    }))
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
        let origin = Place::Hook(Hook::Execute);
        // Dropped (cancelled) before it is ready.
        drop(guarded(origin, Box::pin(PanicsWhenDropped { ready: false })));
        // Dropped by the poll that found it ready.
        let mut crossed = guarded(origin, Box::pin(PanicsWhenDropped { ready: true }));
        let mut context = Context::from_waker(std::task::Waker::noop());
        let polled = Pin::new(&mut crossed).poll(&mut context);
        assert!(matches!(polled, Poll::Ready(abi_stable::std_types::RResult::ROk(()))));
    }
}
