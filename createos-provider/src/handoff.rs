//! Hands an async hook's result from the provider's task to the host's
//! future without ever losing it: a result the host walks away from, whether
//! before it was sent or after it arrived unread, goes to the hook's
//! clean-up (an acquired lease is deleted there), exactly once.

use futures_util::future::BoxFuture;
use std::{
    future::Future,
    pin::Pin,
    sync::{Arc, Mutex, PoisonError},
    task::{Context, Poll},
};
use tokio::{runtime::Handle, sync::oneshot};

/// What is done with a result nobody claims.
type CleanUpFn<T> = Box<dyn FnOnce(T) -> BoxFuture<'static, ()> + Send>;

/// The clean-up, shared by both ends and taken by the one that finds the
/// result unclaimed.
type CleanUp<T> = Arc<Mutex<Option<CleanUpFn<T>>>>;

/// A one-result channel whose unclaimed result goes to `clean_up`, run on
/// `runtime` when the receiving end is dropped holding it.
pub fn channel<T, U>(runtime: Handle, clean_up: impl FnOnce(T) -> U + Send + 'static) -> (Giver<T>, Claim<T>)
where
    T: Send + 'static,
    U: Future<Output = ()> + Send + 'static,
{
    let (sender, receiver) = oneshot::channel();
    let clean_up: CleanUpFn<T> = Box::new(move |value| Box::pin(clean_up(value)));
    let clean_up = Arc::new(Mutex::new(Some(clean_up)));
    (Giver { sender, clean_up: Arc::clone(&clean_up) }, Claim { receiver, clean_up, runtime })
}

/// Takes the clean-up out of its slot (at most one end ever gets it).
fn take<T>(clean_up: &CleanUp<T>) -> Option<CleanUpFn<T>> {
    clean_up.lock().unwrap_or_else(PoisonError::into_inner).take()
}

/// The provider task's end.
pub struct Giver<T> {
    sender: oneshot::Sender<T>,
    clean_up: CleanUp<T>,
}

impl<T> Giver<T> {
    /// Hands `value` to the claim, or cleans it up here when the claim was
    /// dropped first.
    pub async fn give(self, value: T) {
        if let Err(value) = self.sender.send(value) {
            if let Some(clean_up) = take(&self.clean_up) {
                clean_up(value).await;
            }
        }
    }
}

/// The host future's end: resolves to the value, or `None` when the giver
/// was dropped without one (its task panicked or was cancelled).
pub struct Claim<T> {
    receiver: oneshot::Receiver<T>,
    clean_up: CleanUp<T>,
    runtime: Handle,
}

impl<T> Future for Claim<T> {
    type Output = Option<T>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
        Pin::new(&mut self.receiver).poll(cx).map(Result::ok)
    }
}

impl<T> Drop for Claim<T> {
    /// Closing first settles the race with `give`: either the value is
    /// already here (and cleaned up from here) or its send fails (and the
    /// giver cleans it up).
    fn drop(&mut self) {
        self.receiver.close();
        if let Ok(value) = self.receiver.try_recv() {
            if let Some(clean_up) = take(&self.clean_up) {
                self.runtime.spawn(clean_up(value));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::mpsc;

    /// A runtime, and a channel whose clean-up reports each value it gets.
    fn setup() -> (tokio::runtime::Runtime, Giver<u32>, Claim<u32>, mpsc::UnboundedReceiver<u32>) {
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let (cleaned, seen) = mpsc::unbounded_channel();
        let (giver, claim) = channel(runtime.handle().clone(), move |value| async move {
            cleaned.send(value).unwrap();
        });
        (runtime, giver, claim, seen)
    }

    #[test]
    fn a_claimed_value_is_not_cleaned_up() {
        let (runtime, giver, claim, mut seen) = setup();
        runtime.block_on(giver.give(7));
        assert_eq!(runtime.block_on(claim), Some(7));
        assert!(seen.try_recv().is_err(), "the claim took it");
    }

    #[test]
    fn a_value_given_after_the_claim_was_dropped_is_cleaned_up_by_the_giver() {
        let (runtime, giver, claim, mut seen) = setup();
        drop(claim);
        runtime.block_on(giver.give(8));
        assert_eq!(seen.try_recv(), Ok(8));
    }

    #[test]
    fn a_value_that_arrived_unread_is_cleaned_up_once_the_claim_is_dropped() {
        let (runtime, giver, claim, mut seen) = setup();
        runtime.block_on(giver.give(9));
        drop(claim);
        // The clean-up was spawned on the runtime: it runs there.
        assert_eq!(runtime.block_on(seen.recv()), Some(9));
        assert!(seen.try_recv().is_err(), "cleaned up exactly once");
    }

    #[test]
    fn a_giver_dropped_without_a_value_resolves_the_claim_to_none() {
        let (runtime, giver, claim, mut seen) = setup();
        drop(giver);
        assert_eq!(runtime.block_on(claim), None);
        assert!(seen.try_recv().is_err());
    }
}
