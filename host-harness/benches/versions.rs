//! What a retained provider version costs: resident memory after loading a
//! copy of the CreateOS provider library as a new version (mapped for good:
//! abi_stable never unloads), after its `setup` (its runtime and client), and
//! what a drained version gives back when its instance is dropped. One run,
//! eight versions; prints a table. Also the time a hook call waits on a swap.

use host_harness::{plugin::default_plugin_path, resources::resident_bytes};
use provider_abi::{LogLevel, LogSink, Provider, SetupParams};
use provider_host::{loader::LoadedProvider, provider_set::ProviderSet};
use std::time::{Duration, Instant};

const VERSIONS: usize = 8;

fn kib(bytes: u64) -> f64 {
    bytes as f64 / 1024.0
}

fn main() {
    let library = default_plugin_path();
    let bytes = std::fs::read(&library)
        .expect("build the provider first: cargo build --locked --release -p createos-provider");
    let dir = tempfile::tempdir().unwrap();
    let copy = |index: usize| {
        let path = dir.path().join(format!("version-{index}.so"));
        std::fs::write(&path, &bytes).unwrap();
        path
    };
    let setup = SetupParams { host_name: "bench".into(), host_version: "0".into() };
    let load = |index: usize| {
        let provider = LoadedProvider::load(copy(index)).unwrap();
        provider.setup(&setup, LogSink::new(|_| {}), LogLevel::Warn).unwrap();
        provider
    };
    let set = ProviderSet::with_limit(load(0), VERSIONS + 1);
    let mut loaded = Vec::new();
    let mut drained = Vec::new();
    for index in 1..=VERSIONS {
        let before = resident_bytes().unwrap_or(0);
        let next = load(index);
        let after_load = resident_bytes().unwrap_or(0);
        set.swap_to(next).unwrap();
        let after_drain = resident_bytes().unwrap_or(0);
        loaded.push(after_load.saturating_sub(before));
        drained.push(after_load.saturating_sub(after_drain));
    }
    let mean = |values: &[u64]| values.iter().sum::<u64>() as f64 / values.len() as f64;
    println!("provider library: {} ({:.1} MB)", library.display(), bytes.len() as f64 / 1e6);
    println!("per retained version, mean of {VERSIONS}:");
    println!("  RSS added by loading a new version and its setup: {:.0} KiB", kib(mean(&loaded) as u64));
    println!("  RSS given back when the old version drained:      {:.0} KiB", kib(mean(&drained) as u64));

    // How long a hook call waits on a swap: health calls on 2 threads while
    // the main thread swaps back and forth between two loaded versions.
    let (a, b) = (copy(100), copy(101));
    let stop = std::sync::atomic::AtomicBool::new(false);
    let latencies = std::thread::scope(|scope| {
        let callers: Vec<_> = (0..2)
            .map(|_| {
                scope.spawn(|| {
                    let mut latencies = Vec::new();
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        let started = Instant::now();
                        set.health().unwrap();
                        latencies.push(started.elapsed());
                    }
                    latencies
                })
            })
            .collect();
        for round in 0..20 {
            let path = if round % 2 == 0 { &a } else { &b };
            set.swap_to(LoadedProvider::load(path).unwrap()).unwrap();
            std::thread::sleep(Duration::from_millis(5)); // calls run between swaps: not a synchronisation
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        callers.into_iter().flat_map(|caller| caller.join().unwrap()).collect::<Vec<_>>()
    });
    let mut sorted = latencies;
    sorted.sort();
    let at = |q: f64| sorted[((sorted.len() - 1) as f64 * q) as usize];
    println!(
        "health during 20 swaps ({} calls): p50 {:?}, p99 {:?}, max {:?}",
        sorted.len(),
        at(0.50),
        at(0.99),
        sorted.last().unwrap()
    );
}
