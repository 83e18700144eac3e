//! Hands an async hook's result from the provider's task to the host's
//! future without ever losing it: a result the host walks away from, whether
//! before it was sent or after it arrived unread, goes to the hook's
//! clean-up (an acquired lease is deleted there), exactly once.

use std::future::Future;
use tokio::{runtime::Handle, sync::oneshot};

/// A future of the value `receiver` brings, `None` when its sender was
/// dropped without one (its task panicked or was cancelled). Dropped before
/// it resolved, whether the value was sent yet or not, it hands the value,
/// once it comes, to `clean_up` on `runtime`.
pub fn claim<T, U>(
    receiver: oneshot::Receiver<T>,
    runtime: Handle,
    clean_up: impl FnOnce(T) -> U + Send + 'static,
) -> impl Future<Output = Option<T>>
where
    T: Send + 'static,
    U: Future<Output = ()> + Send + 'static,
{
    let mut receiver = scopeguard::guard(receiver, move |receiver| {
        runtime.spawn(async move {
            if let Ok(value) = receiver.await {
                clean_up(value).await;
            }
        });
    });
    async move {
        let value = (&mut *receiver).await.ok();
        scopeguard::ScopeGuard::into_inner(receiver);
        value
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::mpsc;

    /// A runtime, and a channel whose claim's clean-up reports each value it
    /// gets.
    fn setup() -> (
        tokio::runtime::Runtime,
        oneshot::Sender<u32>,
        impl Future<Output = Option<u32>>,
        mpsc::UnboundedReceiver<u32>,
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let (cleaned, seen) = mpsc::unbounded_channel();
        let (giver, receiver) = oneshot::channel();
        let claim = claim(receiver, runtime.handle().clone(), move |value| async move {
            cleaned.send(value).unwrap();
        });
        (runtime, giver, claim, seen)
    }

    #[test]
    fn a_claimed_value_is_not_cleaned_up() {
        let (runtime, giver, claim, mut seen) = setup();
        giver.send(7).unwrap();
        assert_eq!(runtime.block_on(claim), Some(7));
        runtime.block_on(tokio::task::yield_now());
        assert!(seen.try_recv().is_err(), "the claim took it");
    }

    #[test]
    fn a_value_given_after_the_claim_was_dropped_is_cleaned_up() {
        let (runtime, giver, claim, mut seen) = setup();
        drop(claim);
        giver.send(8).unwrap();
        assert_eq!(runtime.block_on(seen.recv()), Some(8));
        assert!(seen.try_recv().is_err(), "cleaned up exactly once");
    }

    #[test]
    fn a_value_that_arrived_unread_is_cleaned_up_once_the_claim_is_dropped() {
        let (runtime, giver, claim, mut seen) = setup();
        giver.send(9).unwrap();
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
