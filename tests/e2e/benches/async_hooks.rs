//! A host awaiting the hooks' futures beside a host blocking a thread per
//! call on them, in one run, through the loaded CreateOS library: commands
//! in flight: `IN_FLIGHT` (default 1,000; first argument) `sleep` commands at
//! once over 10 leases against the simulator (embedded, rate limit off),
//! awaited on one host thread vs a host thread per call waiting on its
//! future; the peak threads of the process and the peak RSS added per
//! command in flight, sampled while they run.
//!
//! The simulator runs in the same process (its threads and memory are in
//! both columns alike), so compare the two columns, not absolute figures.
//! Run: `cargo bench -p e2e --bench async_hooks [-- IN_FLIGHT]`.

use e2e::bed::Bed;
use provider_abi::{ByteSink, ByteSource, Provider};
use provider_host::loader::LoadedProvider;
use provider_host::wait;
use serde_json::json;
use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

/// A field of `/proc/self/status` (`Threads`, `VmRSS` in KiB).
fn status(field: &str) -> u64 {
    let text = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    text.lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|value| value.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Samples threads and RSS every 20 ms until `done`; returns the peaks.
fn sample_peaks(done: Arc<AtomicBool>) -> std::thread::JoinHandle<(u64, u64)> {
    std::thread::spawn(move || {
        let (mut threads, mut rss) = (0, 0);
        while !done.load(Ordering::SeqCst) {
            threads = threads.max(status("Threads"));
            rss = rss.max(status("VmRSS"));
            std::thread::sleep(Duration::from_millis(20));
        }
        (threads, rss)
    })
}

fn main() {
    let in_flight: usize = std::env::args().skip(1).find_map(|arg| arg.parse().ok()).unwrap_or(1_000);
    let bed = Bed::new();

    let config = bed.config(json!({"timeoutMs": 600_000}));
    let leases: Vec<_> = (0..10).map(|_| bed.acquire(&config)).collect();
    let command = |index: usize| bed.command(&config, &leases[index % leases.len()], "/bin/sleep", &["3"]);

    // Async: one host thread awaiting every call's future.
    let provider = LoadedProvider::load(e2e::library("createos_provider")).unwrap();
    let (base_threads, base_rss) = (status("Threads"), status("VmRSS"));
    let done = Arc::new(AtomicBool::new(false));
    let sampler = sample_peaks(Arc::clone(&done));
    let start = Instant::now();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let failed = runtime.block_on(async {
        let executions: Vec<_> = (0..in_flight)
            .map(|index| provider.execute(command(index), ByteSource::empty(), ByteSink::discard()))
            .collect();
        let mut failed = 0;
        for execution in executions {
            failed += usize::from(execution.await.map_or(true, |result| result.exit_code.is_none()));
        }
        failed
    });
    let async_time = start.elapsed();
    done.store(true, Ordering::SeqCst);
    let (async_threads, async_rss) = sampler.join().unwrap();
    println!(
        "async: {in_flight} commands in flight: {:.1} s, {failed} failed, peak threads {async_threads} (before {base_threads}), {:.1} KiB RSS per command in flight",
        async_time.as_secs_f64(),
        (async_rss.saturating_sub(base_rss)) as f64 / in_flight as f64
    );

    // Blocking: a host thread per call, waiting on its future.
    let (base_threads, base_rss) = (status("Threads"), status("VmRSS"));
    let done = Arc::new(AtomicBool::new(false));
    let sampler = sample_peaks(Arc::clone(&done));
    let start = Instant::now();
    let failed: usize = std::thread::scope(|scope| {
        let calls: Vec<_> = (0..in_flight)
            .map(|index| {
                let params = command(index);
                let provider = &bed.provider;
                scope.spawn(move || {
                    let result = wait(provider.execute(params, ByteSource::empty(), ByteSink::discard()));
                    usize::from(result.map_or(true, |result| result.exit_code.is_none()))
                })
            })
            .collect();
        calls.into_iter().map(|call| call.join().unwrap()).sum()
    });
    let blocking_time = start.elapsed();
    done.store(true, Ordering::SeqCst);
    let (blocking_threads, blocking_rss) = sampler.join().unwrap();
    println!(
        "blocking: {in_flight} commands in flight: {:.1} s, {failed} failed, peak threads {blocking_threads} (before {base_threads}), {:.1} KiB RSS per command in flight",
        blocking_time.as_secs_f64(),
        (blocking_rss.saturating_sub(base_rss)) as f64 / in_flight as f64
    );
    for lease in &leases {
        wait(bed.provider.destroy_lease(bed.lease_params(&config, lease))).unwrap();
    }
}
