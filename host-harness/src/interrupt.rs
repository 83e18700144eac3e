//! Graceful interruption. The first SIGINT or SIGTERM (and SIGHUP, in the
//! commands that do not swap the provider on it) stops new work: the
//! provider is shut down (its running commands are cancelled and their
//! process trees terminated, as a release does), each lifecycle in flight
//! fails its next step and destroys its lease by the normal clean-up path,
//! `soak` admits no new lifecycle, and the command exits 130 (SIGINT), 143
//! (SIGTERM) or 129 (SIGHUP) once everything is cleaned up. A second signal
//! exits at once and leaves the rest to `sweep`. Messages go to stderr
//! without failing when it is gone (a closed terminal after a hang-up).

use provider_abi::{ErrorKind, ProviderError};
use signal_hook::{
    consts::{SIGHUP, SIGINT, SIGTERM},
    iterator::Signals,
};
use std::{
    io::Write,
    sync::atomic::{AtomicI32, Ordering},
};

/// The first signal received, 0 while none.
static RECEIVED: AtomicI32 = AtomicI32::new(0);

/// The signal that asked this process to stop, if one did.
pub fn requested() -> Option<i32> {
    Some(RECEIVED.load(Ordering::SeqCst)).filter(|&signal| signal != 0)
}

/// The error a step gets when an interruption stopped it before it began.
pub fn stopped() -> ProviderError {
    ProviderError::new(ErrorKind::CANCELLED, format!("Interrupted by {}: not started.", name(requested())))
}

/// The conventional exit code after `signal`: 128 + its number.
pub fn exit_code(signal: i32) -> u8 {
    u8::try_from(128 + signal).unwrap_or(128)
}

/// The signal's name (`SIGINT`, `SIGTERM`...), or `a signal`.
pub fn name(signal: Option<i32>) -> &'static str {
    signal.and_then(signal_hook::low_level::signal_name).unwrap_or("a signal")
}

/// Writes `message` as a line to stderr, ignoring a stderr that is gone
/// (`eprintln!` would panic).
pub fn say(message: std::fmt::Arguments<'_>) {
    let _ = writeln!(std::io::stderr(), "{message}");
}

/// Runs `work` while watching for SIGINT and SIGTERM, and SIGHUP too when
/// `hangup` (the commands that do not swap the provider on it): the first
/// calls `on_first` (from the watcher thread, while `work` goes on) and is
/// remembered for [`requested`]; a second exits the process at once.
pub fn watch<T>(hangup: bool, on_first: impl Fn() + Sync, work: impl FnOnce() -> T) -> std::io::Result<T> {
    let signals: &[i32] = if hangup { &[SIGINT, SIGTERM, SIGHUP] } else { &[SIGINT, SIGTERM] };
    let on_signal = |signal| {
        if RECEIVED.compare_exchange(0, signal, Ordering::SeqCst, Ordering::SeqCst).is_ok() {
            say(format_args!(
                "{}: stopping: cancelling commands and cleaning up leases in flight (again to exit at once)",
                name(Some(signal))
            ));
            on_first();
        } else {
            say(format_args!(
                "{}: exiting at once; run `host-harness sweep` to clean up",
                name(Some(signal))
            ));
            // The embedded simulator's sandboxes die with us: so do their files.
            crate::embedded::remove_temp_dirs();
            std::process::exit(i32::from(exit_code(signal)));
        }
    };
    while_watching(signals, on_signal, work)
}

/// Runs `work` while a thread of its own calls `on_signal` with each of
/// `signals` received. The handlers are installed before `work` starts, so
/// none of these signals ends the process meanwhile.
pub fn while_watching<T>(
    signals: &[i32],
    on_signal: impl Fn(i32) + Sync,
    work: impl FnOnce() -> T,
) -> std::io::Result<T> {
    let mut signals = Signals::new(signals)?;
    let handle = signals.handle();
    Ok(std::thread::scope(|scope| {
        scope.spawn(|| signals.forever().for_each(&on_signal));
        let result = work();
        handle.close();
        result
    }))
}
