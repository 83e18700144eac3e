//! Helpers the harness's integration tests share, and the test bed most of
//! them start from: a directory holding a configuration file for a
//! simulator.

use createos_sim::Simulator;
use serde_json::{json, Value};
use std::{
    path::{Path, PathBuf},
    process::Child,
    time::{Duration, Instant},
};

/// The provider configuration `sim` serves, with a request budget no test
/// reaches.
pub fn provider_config(sim: &Simulator) -> Value {
    let mut provider = sim.provider_config(true);
    provider["requestsPerMinute"] = json!(100_000);
    provider
}

/// Writes a harness configuration file holding `provider` (company `acme`,
/// environment `dev`) to `path`.
pub fn write_config(path: &Path, provider: Value) {
    let file = json!({"companyId": "acme", "environmentId": "dev", "config": provider});
    std::fs::write(path, file.to_string()).unwrap();
}

/// A temporary directory holding `config.json`: the harness configuration
/// for `sim` ([`provider_config`]).
pub struct ConfigDir {
    /// The directory (ledgers, lease files and other configurations go here too).
    pub dir: tempfile::TempDir,
    /// Its `config.json`.
    pub config: PathBuf,
}

impl ConfigDir {
    /// The directory for `sim`, its provider configuration edited by `change` first.
    pub fn new(sim: &Simulator, change: impl FnOnce(&mut Value)) -> ConfigDir {
        let dir = tempfile::tempdir().unwrap();
        let mut provider = provider_config(sim);
        change(&mut provider);
        let config = dir.path().join("config.json");
        write_config(&config, provider);
        ConfigDir { dir, config }
    }
}

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
pub fn signal(child: &Child, signal: i32) {
    // SAFETY: `kill` only sends a signal to our own child process.
    assert_eq!(unsafe { libc::kill(child.id() as i32, signal) }, 0);
}

/// The peak resident memory in KiB of process `pid` since its exec: the
/// kernel's high-water mark (`VmHWM`), read while it lives; `None` once it
/// is gone.
///
/// Not `wait4`'s `ru_maxrss`: a process keeps across exec the peak of the
/// memory it was spawned sharing, so that reports at least this test
/// binary's own peak, which the tests running beside push past any bound
/// a harness test sets.
pub fn peak_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|line| line.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// [`peak_kib`] of `pid` and of its children (a provider worker): the
/// largest.
pub fn tree_peak_kib(pid: u32) -> Option<u64> {
    Some(children(pid).into_iter().filter_map(peak_kib).fold(peak_kib(pid)?, u64::max))
}

/// The child processes of `pid` (every thread's).
pub fn children(pid: u32) -> Vec<u32> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).into_iter().flatten().flatten();
    tasks
        .filter_map(|task| std::fs::read_to_string(task.path().join("children")).ok())
        .flat_map(|text| text.split_whitespace().filter_map(|pid| pid.parse().ok()).collect::<Vec<_>>())
        .collect()
}
