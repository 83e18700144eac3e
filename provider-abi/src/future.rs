//! The futures the async hooks (ABI 1.7) hand across the boundary.
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
    export::{caught_panic, drop_panic_payload, guard},
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
    Guarded { hook, future: Some(future) }.into_ffi()
}

/// A hook's future whose poll and drop never unwind.
struct Guarded<T> {
    hook: Hook,
    future: Option<HookFuture<T>>,
}

impl<T> Future for Guarded<T> {
    type Output = FfiResult<T>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let hook = self.hook;
        let Some(future) = self.future.as_mut() else {
            return Poll::Ready(
                Err(ProviderError::internal(format!(
                    "the `{hook}` hook's future was polled after it completed"
                )))
                .into(),
            );
        };
        let polled = catch_unwind(AssertUnwindSafe(|| future.as_mut().poll(cx)));
        let ready = match polled {
            Ok(Poll::Pending) => return Poll::Pending,
            Ok(Poll::Ready(result)) => result,
            Err(payload) => Err(caught_panic(hook, payload)),
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

/// Drops a hook's future, swallowing a panic of its `Drop` (which would
/// otherwise abort inside `async_ffi`'s drop function).
fn drop_quietly<T>(future: Option<HookFuture<T>>) {
    if let Err(payload) = catch_unwind(AssertUnwindSafe(move || drop(future))) {
        drop_panic_payload(payload);
    }
}

/// The host side: a hook's future as the library handed it over.
pub(crate) struct Imported<T> {
    hook: Hook,
    future: FfiFuture<FfiResult<T>>,
}

impl<T> Imported<T> {
    pub(crate) fn new(hook: Hook, future: FfiFuture<FfiResult<T>>) -> Self {
        Self { hook, future }
    }
}

impl<T> Future for Imported<T> {
    type Output = HookResult<T>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let hook = self.hook;
        // A library built by this crate never reports a panic (see `export`);
        // another one may, which `async_ffi` raises here as a panic.
        match catch_unwind(AssertUnwindSafe(|| Pin::new(&mut self.future).poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(result)) => Poll::Ready(result.into()),
            Err(payload) => {
                drop_panic_payload(payload);
                Poll::Ready(Err(ProviderError::internal(format!(
                    "The provider panicked in the `{hook}` hook's future."
                ))))
            }
        }
    }
}
