//! `SIGHUP` in the daemon-like commands (`soak`, `lifecycle`): each one asks
//! for a swap of the provider to the library at the plugin path.

use signal_hook::{consts::SIGHUP, iterator::Signals};

/// Runs `work` while watching for SIGHUP: each calls `on_hangup` (from the
/// watcher thread, while `work` goes on). The handler is installed before
/// `work` starts, so a SIGHUP never ends the process meanwhile.
pub fn watch<T>(on_hangup: impl Fn() + Sync, work: impl FnOnce() -> T) -> std::io::Result<T> {
    let mut signals = Signals::new([SIGHUP])?;
    let handle = signals.handle();
    Ok(std::thread::scope(|scope| {
        scope.spawn(|| {
            for _ in signals.forever() {
                on_hangup();
            }
        });
        let result = work();
        handle.close();
        result
    }))
}
