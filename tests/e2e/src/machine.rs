//! Keeps the test that saturates the machine apart from the tests whose
//! scaled-down deadlines it would eat into.
//!
//! A test scaled ten times faster than the scenario it stands for (a
//! `timeoutMs` of 2 s for 20 s) leaves a tenth of the room for the
//! simulator's response time, which is not scaled. Beside a thousand
//! processes on two cores that response time grows enough to spend the whole
//! deadline: the slowest resume of the overload test took 1.68 to 1.99 s of
//! its 2 s there (six runs), 1.24 to 1.90 s alone (sixteen runs, 1.65 s or
//! less in fifteen).

use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

static MACHINE: RwLock<()> = RwLock::new(());

/// `timeoutMs` for a test whose deadline is not what it checks: its
/// commands or requests must outlast whatever the simulator's unscaled
/// response time costs on a loaded two-core machine (a thousand processes,
/// forty acquisitions or sixteen process creations at once outlived the
/// default 10 s there).
pub const UNHURRIED_TIMEOUT_MS: u64 = 300_000;

/// Held for the whole of a test that saturates the cores.
pub fn saturated() -> RwLockWriteGuard<'static, ()> {
    MACHINE.write().unwrap_or_else(|e| e.into_inner())
}

/// Held for the whole of a test whose deadlines are scaled down: it never
/// runs while a [`saturated`] test does.
pub fn scaled_deadlines() -> RwLockReadGuard<'static, ()> {
    MACHINE.read().unwrap_or_else(|e| e.into_inner())
}
