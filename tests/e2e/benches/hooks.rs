//! Hook round trips: the CreateOS provider's hooks called directly on the
//! provider type and through the loaded shared library, in one run.
//!
//! Target (issue 2): loaded ≤ 2 × direct + 50 ns.

use createos_provider::CreateosProvider;
use criterion::{criterion_group, criterion_main, Criterion};
use provider_abi::{EnvironmentParams, LoadedProvider, Provider};
use std::hint::black_box;

fn providers() -> (CreateosProvider, LoadedProvider) {
    let loaded = LoadedProvider::load(e2e::library("createos_provider")).expect("load the CreateOS provider");
    (CreateosProvider::default(), loaded)
}

fn round_trips(c: &mut Criterion) {
    let (direct, loaded) = providers();
    let mut health = c.benchmark_group("health");
    health.bench_function("direct", |b| b.iter(|| black_box(direct.health().unwrap())));
    health.bench_function("loaded", |b| b.iter(|| black_box(loaded.health().unwrap())));
    health.finish();

    let params = EnvironmentParams {
        driver_key: "createos".into(),
        company_id: "company".into(),
        environment_id: "environment".into(),
        config_json: r#"{"apiKey":"bench-key","shape":"s-1vcpu-1gb","apiUrl":"http://127.0.0.1:9"}"#.into(),
    };
    let mut validate = c.benchmark_group("validate_config");
    validate.bench_function("direct", |b| b.iter(|| black_box(direct.validate_config(&params).unwrap())));
    validate.bench_function("loaded", |b| b.iter(|| black_box(loaded.validate_config(&params).unwrap())));
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

criterion_group!(benches, round_trips, load);
criterion_main!(benches);
