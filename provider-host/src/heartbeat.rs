//! A host's heartbeat: a background thread that renews it every third of
//! its expiry until dropped, so a host stays alive through two failed
//! renewals in a row.

use std::{
    sync::mpsc::{self, RecvTimeoutError},
    thread::JoinHandle,
    time::Duration,
};

/// The renewing thread; dropping it stops the renewals (and waits for the
/// thread).
pub struct Heartbeat {
    running: Option<(mpsc::Sender<()>, JoinHandle<()>)>,
}

impl Heartbeat {
    /// Calls `renew` every `expiry / 3` on a thread of its own; a failed
    /// renewal is logged and retried at the next beat.
    pub fn start<E: std::fmt::Display>(
        expiry: Duration,
        mut renew: impl FnMut() -> Result<(), E> + Send + 'static,
    ) -> std::io::Result<Heartbeat> {
        let (stop, stopped) = mpsc::channel::<()>();
        let every = expiry / 3;
        let thread = std::thread::Builder::new().name("ledger-heartbeat".into()).spawn(move || loop {
            match stopped.recv_timeout(every) {
                Err(RecvTimeoutError::Timeout) => {
                    if let Err(error) = renew() {
                        tracing::warn!(%error, "cannot renew this host's heartbeat");
                    }
                }
                Ok(()) | Err(RecvTimeoutError::Disconnected) => return,
            }
        })?;
        Ok(Heartbeat { running: Some((stop, thread)) })
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        if let Some((stop, thread)) = self.running.take() {
            drop(stop);
            let _ = thread.join();
        }
    }
}
