//! A bound on the requests of one process awaiting a reply from one API
//! origin.
//!
//! The pacer spaces request *starts*; nothing else bounds how many requests
//! wait at once for a slow server. Without a bound, ten thousand leases in
//! flight against an overloaded server held ten thousand connections, each
//! with its buffers and socket, on both sides: memory and CPU per lease
//! grew with the crowd, and the server had to shed connections. With one,
//! a request past the bound waits here, in a queue place of a few words,
//! and the connections in use stay about [`MAX_AWAITING_REPLY`] (as Envoy's
//! default circuit breaker bounds requests per upstream to 1,024).
//!
//! A request holds its pass ([`RequestGate::enter`]) from just before its
//! start until its reply's head arrives (a reply body, a streamed command
//! output included, is read after it: a long output never holds a pass).
//!
//! New work (creating sandboxes or processes) may take at most
//! `MAX_AWAITING_REPLY - RESERVED_FOR_WORK_UNDER_WAY` passes: a server that
//! holds creations until it has room (as the simulator does with commands)
//! can never take every pass, so the polls, output
//! connections and cleanups of the work under way, which give that room
//! back, always get one. Within those rules waiters are served FIFO
//! (tokio's semaphore is fair); dropping a waiting future leaves the queue
//! at once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use tokio::sync::{Semaphore, SemaphorePermit};

use crate::pacer::Priority;

/// Requests of one process that may await a reply from one origin at once.
pub const MAX_AWAITING_REPLY: usize = 1024;
/// Passes that new work may never take (see the module documentation).
pub const RESERVED_FOR_WORK_UNDER_WAY: usize = 256;

/// The bound for one origin.
#[derive(Debug)]
pub struct RequestGate {
    any: Semaphore,
    new_work: Semaphore,
}

impl RequestGate {
    /// At most `max` requests awaiting a reply, at most `max - reserved` of
    /// them new work.
    pub fn new(max: usize, reserved: usize) -> Self {
        assert!(reserved < max, "new work needs at least one pass");
        RequestGate { any: Semaphore::new(max), new_work: Semaphore::new(max - reserved) }
    }

    /// The process-wide gate of `origin` (`scheme://host:port`), shared by
    /// every client of the process whatever its key, as the connections it
    /// bounds are.
    pub fn shared(origin: &str) -> Arc<RequestGate> {
        static GATES: OnceLock<Mutex<HashMap<String, Arc<RequestGate>>>> = OnceLock::new();
        crate::lock(GATES.get_or_init(Default::default))
            .entry(origin.to_owned())
            .or_insert_with(|| Arc::new(RequestGate::new(MAX_AWAITING_REPLY, RESERVED_FOR_WORK_UNDER_WAY)))
            .clone()
    }

    /// Waits for a pass for one request of `priority`: the right to have
    /// one request awaiting its reply (its permits); drop it once the reply's
    /// head has arrived. Cancel by dropping the future.
    pub async fn enter(&self, priority: Priority) -> (SemaphorePermit<'_>, Option<SemaphorePermit<'_>>) {
        // The gate owns its semaphores and never closes them.
        const OPEN: &str = "a request gate's semaphore is never closed";
        let new_work = match priority {
            Priority::NewWork => Some(self.new_work.acquire().await.expect(OPEN)),
            Priority::Cleanup | Priority::InFlight => None,
        };
        (self.any.acquire().await.expect(OPEN), new_work)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::FutureExt;

    #[tokio::test]
    async fn requests_past_the_bound_wait_until_a_reply_arrives() {
        let gate = RequestGate::new(2, 1);
        let first = gate.enter(Priority::InFlight).await;
        let _second = gate.enter(Priority::Cleanup).await;
        let mut third = Box::pin(gate.enter(Priority::InFlight));
        assert!((&mut third).now_or_never().is_none(), "a third request must wait");
        drop(first);
        assert!(third.now_or_never().is_some(), "a reply's arrival lets the next request go");
    }

    #[tokio::test]
    async fn new_work_never_takes_the_passes_reserved_for_work_under_way() {
        let gate = RequestGate::new(3, 1);
        let _a = gate.enter(Priority::NewWork).await;
        let _b = gate.enter(Priority::NewWork).await;
        let mut third_creation = Box::pin(gate.enter(Priority::NewWork));
        assert!((&mut third_creation).now_or_never().is_none(), "new work past its share waits");
        assert_eq!(gate.any.available_permits(), 1);
        let poll = gate.enter(Priority::InFlight).now_or_never();
        assert!(poll.is_some(), "work under way takes the reserved pass");
        drop(poll);
        let cleanup = gate.enter(Priority::Cleanup).now_or_never();
        assert!(cleanup.is_some(), "so does cleanup");
    }

    #[tokio::test]
    async fn a_waiter_dropped_gives_its_place_to_the_next() {
        let gate = RequestGate::new(1, 0);
        let held = gate.enter(Priority::InFlight).await;
        let mut dropped = Box::pin(gate.enter(Priority::InFlight));
        assert!((&mut dropped).now_or_never().is_none());
        let mut next = Box::pin(gate.enter(Priority::InFlight));
        assert!((&mut next).now_or_never().is_none());
        drop(dropped);
        drop(held);
        assert!(next.now_or_never().is_some(), "a cancelled waiter keeps nobody waiting");
    }

    #[test]
    fn one_gate_per_origin() {
        let a = RequestGate::shared("http://127.0.0.1:1");
        let b = RequestGate::shared("http://127.0.0.1:1");
        let c = RequestGate::shared("http://127.0.0.1:2");
        assert!(Arc::ptr_eq(&a, &b));
        assert!(!Arc::ptr_eq(&a, &c));
    }
}
