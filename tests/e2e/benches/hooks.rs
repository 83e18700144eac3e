//! Hook round trips: the CreateOS provider's hooks called directly on the
//! provider type, through the loaded shared library, through the isolated
//! provider's worker process (postcard frames over a call socket of its own), and
//! through an out-of-process worker answering JSON lines over pipes
//! (`provider-worker`), in one run; the cost of loading a library; how long
//! an isolated provider takes from a detected worker crash to a new worker
//! answering its first call; and what the provider's log forwarding
//! costs a hook whose event is below the host's level, and one whose event is
//! forwarded.
//!
//! Targets: loaded ≤ 2 × direct + 50 ns; isolated `health` ≤ 20 µs and
//! crash → new worker answering < 50 ms.

use createos_provider::CreateosProvider;
use criterion::{criterion_group, criterion_main, Criterion};
use e2e::worker::Worker;
use provider_abi::{
    ByteSink, ByteSource, EnvironmentParams, ExecuteParams, LogLevel, LogRecord, LogSink, Provider,
    SetupParams,
};
use provider_host::isolation::{IsolatedProvider, IsolationOptions};
use provider_host::{loader::LoadedProvider, wait};
use serde_json::json;
use std::{
    hint::black_box,
    path::Path,
    sync::atomic::{AtomicU64, Ordering},
    time::{Duration, Instant},
};

/// The isolated provider's options: the benches' own worker binary.
fn isolation() -> IsolationOptions {
    IsolationOptions {
        program: Some(env!("CARGO_BIN_EXE_isolated-worker").into()),
        ..IsolationOptions::default()
    }
}

/// The same provider four ways.
fn providers() -> (CreateosProvider, LoadedProvider, IsolatedProvider, Worker) {
    let library = e2e::library("createos_provider");
    let loaded = LoadedProvider::load(&library).expect("load the CreateOS provider");
    let isolated = IsolatedProvider::start(&library, isolation()).expect("start the isolated provider");
    let worker = Worker::spawn(Path::new(env!("CARGO_BIN_EXE_provider-worker")), &library)
        .expect("start the provider worker");
    (CreateosProvider::default(), loaded, isolated, worker)
}

fn round_trips(c: &mut Criterion) {
    let (direct, loaded, isolated, mut worker) = providers();
    let mut health = c.benchmark_group("health");
    health.bench_function("direct", |b| b.iter(|| black_box(direct.health().unwrap())));
    health.bench_function("loaded", |b| b.iter(|| black_box(loaded.health().unwrap())));
    health.bench_function("isolated", |b| b.iter(|| black_box(isolated.health().unwrap())));
    health.bench_function("out_of_process", |b| b.iter(|| black_box(worker.health().unwrap())));
    health.finish();

    let config = json!({"apiKey": "bench-key", "shape": "s-1vcpu-1gb", "apiUrl": "http://127.0.0.1:9"});
    let params = EnvironmentParams {
        driver_key: "createos".into(),
        company_id: "company".into(),
        environment_id: "environment".into(),
        config_json: config.to_string().into(),
        extensions_json: Default::default(),
    };
    let mut validate = c.benchmark_group("validate_config");
    validate.bench_function("direct", |b| b.iter(|| black_box(direct.validate_config(&params).unwrap())));
    validate.bench_function("loaded", |b| b.iter(|| black_box(loaded.validate_config(&params).unwrap())));
    validate.bench_function("isolated", |b| b.iter(|| black_box(isolated.validate_config(&params).unwrap())));
    validate
        .bench_function("out_of_process", |b| b.iter(|| black_box(worker.validate_config(&config).unwrap())));
    validate.finish();
}

fn load(c: &mut Criterion) {
    // The library stays mapped after the first load (abi_stable never
    // unloads), so this measures what every later load costs: open, header
    // and layout checks, instance creation, manifest, first health.
    let path = e2e::library("createos_provider");
    c.bench_function("load_and_first_health", |b| {
        b.iter(|| {
            let provider = LoadedProvider::load(&path).unwrap();
            black_box(provider.health().unwrap())
        })
    });
}

/// `validate_config` through the loaded library (it logs one DEBUG event):
/// before any log sink was installed, with the host's level at WARN (the
/// event is disabled) and at DEBUG (the event crosses to a sink that counts
/// it). Target: a disabled level costs almost nothing.
fn provider_logs(c: &mut Criterion) {
    let loaded = LoadedProvider::load(e2e::library("createos_provider")).expect("load the provider");
    let params = EnvironmentParams {
        config_json: json!({"apiKey": "bench-key", "shape": "s-1vcpu-1gb"}).to_string().into(),
        ..Default::default()
    };
    // A setup at ERROR (this validation logs nothing there) starts the
    // provider's runtime: the three cases differ only in the log sink's level.
    static FORWARDED: AtomicU64 = AtomicU64::new(0);
    let sink = LogSink::new(|record: &LogRecord<'_>| {
        black_box(record.message.len());
        FORWARDED.fetch_add(1, Ordering::Relaxed);
    });
    loaded.setup(&SetupParams::default(), sink, LogLevel::Error).expect("setup");
    let mut group = c.benchmark_group("provider_logs");
    group.bench_function("validate_level_error", |b| {
        b.iter(|| black_box(loaded.validate_config(&params).unwrap()))
    });
    for (name, level) in
        [("validate_level_disabled", LogLevel::Warn), ("validate_level_enabled", LogLevel::Debug)]
    {
        loaded.setup(&SetupParams::default(), sink, level).expect("setup");
        group.bench_function(name, |b| b.iter(|| black_box(loaded.validate_config(&params).unwrap())));
    }
    group.finish();
    // The enabled level forwarded events (unless a filter skipped it).
    let forwarded = FORWARDED.load(Ordering::Relaxed);
    let enabled_ran = std::env::args()
        .skip(1)
        .all(|arg| arg.starts_with('-') || "provider_logs/validate_level_enabled".contains(&arg));
    assert!(forwarded > 0 || !enabled_ran, "the enabled level forwarded no event");
}

/// A worker crash (the fixture aborts in `execute`) detected, then the
/// time until a new worker answers its first `health`: spawn, load,
/// handshake, call. The crash itself is outside the measured time.
fn crash_recovery(c: &mut Criterion) {
    let provider =
        IsolatedProvider::start(e2e::library("fixture_provider"), isolation()).expect("start the fixture");
    let crash = ExecuteParams { command: "crash:abort".into(), ..Default::default() };
    let mut group = c.benchmark_group("isolated_crash");
    group.sample_size(20).measurement_time(Duration::from_secs(10));
    group.bench_function("detected_to_new_worker_answering", |b| {
        b.iter_custom(|iterations| {
            let mut total = Duration::ZERO;
            for _ in 0..iterations {
                let running = provider.execute(crash.clone(), ByteSource::empty(), ByteSink::discard());
                let error = wait(running).unwrap_err();
                black_box(error);
                let detected = Instant::now();
                black_box(provider.health().unwrap());
                total += detected.elapsed();
            }
            total
        })
    });
    group.finish();
}

criterion_group!(benches, round_trips, load, crash_recovery, provider_logs);
criterion_main!(benches);
