//! What a soak costs the harness process: resident memory, threads and CPU
//! time, sampled from `/proc/self` while the lifecycles run.
//!
//! The provider runs inside this process, so the figures are the harness's
//! and the provider's together; the provider's own threads are told apart by
//! name ([`provider_thread_prefix`]). With the embedded simulator the simulator is
//! in the process too: run it with `host-harness sim` to keep it out.

use nix::sys::{
    resource::{getrusage, UsageWho},
    time::{TimeVal, TimeValLike},
};
use std::{
    sync::mpsc::{self, RecvTimeoutError},
    time::Duration,
};

/// How the threads of the runtime of the provider `provider_id` are named
/// (`ID-provider`), as far as Linux keeps a thread's name (15 bytes).
pub fn provider_thread_prefix(provider_id: &str) -> String {
    let name = format!("{provider_id}-provider");
    let end = (0..=name.len().min(15)).rev().find(|&end| name.is_char_boundary(end)).unwrap_or(0);
    name[..end].to_owned()
}
/// How often the monitor samples.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(50);

/// Peaks and totals over a monitored run.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ResourceFigures {
    /// Resident memory when monitoring began, in bytes.
    pub baseline_rss: u64,
    /// The highest resident memory seen, in bytes.
    pub peak_rss: u64,
    /// The most threads the process had at once.
    pub peak_threads: usize,
    /// The most threads the provider's runtime had at once.
    pub peak_provider_threads: usize,
    /// User plus system CPU time of the whole process during the run, less
    /// the monitor's own: its sampling costs a fixed amount per second, which
    /// would otherwise be charged to lifecycles more the slower the API is.
    pub cpu: Duration,
    /// The monitor thread's own CPU time, taken out of `cpu`.
    pub monitor_cpu: Duration,
}

/// Samples the process every [`SAMPLE_EVERY`] (on the calling thread, a
/// thread of its own) until `stop` is signalled or its sender dropped, and
/// returns the figures; the provider's threads are those whose names begin
/// with `provider_threads` (see [`provider_thread_prefix`]).
pub fn monitor(provider_threads: &str, stop: &mpsc::Receiver<()>) -> ResourceFigures {
    let cpu_at_start = cpu_time(UsageWho::RUSAGE_SELF);
    let baseline = resident_bytes().unwrap_or(0);
    let mut figures = ResourceFigures { baseline_rss: baseline, peak_rss: baseline, ..Default::default() };
    // Every SAMPLE_EVERY, and once more when stopped.
    sample(&mut figures, provider_threads);
    while stop.recv_timeout(SAMPLE_EVERY) == Err(RecvTimeoutError::Timeout) {
        sample(&mut figures, provider_threads);
    }
    sample(&mut figures, provider_threads);
    figures.monitor_cpu = cpu_time(UsageWho::RUSAGE_THREAD);
    figures.cpu =
        cpu_time(UsageWho::RUSAGE_SELF).saturating_sub(cpu_at_start).saturating_sub(figures.monitor_cpu);
    // The kernel's own high-water mark catches peaks between samples.
    figures.peak_rss = figures.peak_rss.max(status_kib("VmHWM:").map_or(0, |kib| kib * 1024));
    figures
}

fn sample(figures: &mut ResourceFigures, provider_prefix: &str) {
    let rss = resident_bytes().unwrap_or(0);
    let (threads, provider_threads) = threads(provider_prefix);
    figures.peak_rss = figures.peak_rss.max(rss);
    figures.peak_threads = figures.peak_threads.max(threads);
    figures.peak_provider_threads = figures.peak_provider_threads.max(provider_threads);
}

/// Resident memory now, in bytes.
pub fn resident_bytes() -> Option<u64> {
    status_kib("VmRSS:").map(|kib| kib * 1024)
}

/// A `kB` field of `/proc/self/status`.
fn status_kib(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|line| line.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// The process's threads, and how many of them belong to the provider (their
/// names begin with `provider_prefix`).
fn threads(provider_prefix: &str) -> (usize, usize) {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return (0, 0);
    };
    let names: Vec<String> =
        tasks.flatten().filter_map(|task| std::fs::read_to_string(task.path().join("comm")).ok()).collect();
    let provider = names.iter().filter(|name| name.starts_with(provider_prefix)).count();
    (names.len(), provider)
}

/// User plus system CPU time of `who` (`RUSAGE_SELF`: the process;
/// `RUSAGE_THREAD`: the calling thread) so far.
fn cpu_time(who: UsageWho) -> Duration {
    let Ok(usage) = getrusage(who) else { return Duration::ZERO };
    let micros = |time: TimeVal| Duration::from_micros(time.num_microseconds().max(0) as u64);
    micros(usage.user_time()) + micros(usage.system_time())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_monitored_run_sees_memory_threads_and_cpu() {
        let (stop, stopped) = mpsc::channel();
        let monitor = std::thread::spawn(move || monitor(&provider_thread_prefix("test"), &stopped));
        let busy: u64 = (0..2_000_000u64).fold(0, |sum, n| sum.wrapping_add(n * n));
        std::hint::black_box(busy);
        drop(stop);
        let figures = monitor.join().unwrap();
        assert!(figures.baseline_rss > 0 && figures.peak_rss >= figures.baseline_rss);
        assert!(figures.peak_threads >= 2, "the test thread and the monitor");
        assert!(figures.cpu > Duration::ZERO);
        assert!(figures.monitor_cpu > Duration::ZERO, "the monitor sampled at least once");
    }

    #[test]
    fn a_providers_threads_are_named_after_its_id_as_far_as_linux_keeps_a_name() {
        assert_eq!(provider_thread_prefix("hello"), "hello-provider");
        assert_eq!(provider_thread_prefix("createos"), "createos-provid");
        assert_eq!(provider_thread_prefix("éééééééé"), "ééééééé", "cut at a character boundary");
    }
}
