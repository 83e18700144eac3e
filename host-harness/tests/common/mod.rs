//! Helpers the harness's integration tests share (each test file that
//! needs them declares `mod common;`).

use std::{
    process::Child,
    time::{Duration, Instant},
};

/// Polls `condition` until it holds; panics after `limit` (a guard against
/// a hang, not a measurement).
pub fn wait_until(what: &str, limit: Duration, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Sends `signal` to `child`.
#[allow(dead_code)] // not every test file signals its children
pub fn signal(child: &Child, signal: i32) {
    // SAFETY: `kill` only sends a signal to our own child process.
    assert_eq!(unsafe { libc::kill(child.id() as i32, signal) }, 0);
}
