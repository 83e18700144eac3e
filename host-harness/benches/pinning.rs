//! What pinning costs at load: hashing a provider library (SHA-256 of the
//! whole file), the `--locked` check (the library copied into a private
//! directory and the copy hashed, as `--locked` does before loading it, and
//! its pin found) beside loading a copy of it (checks, mapping, first
//! manifest), in one run.

use criterion::{criterion_group, criterion_main, Criterion};
use host_harness::plugin::default_plugin_path;
use provider_host::{loader::LoadedProvider, pin_file::LockFile, providers::sha256_hex, staging::Staging};
use std::hint::black_box;

fn pinning(c: &mut Criterion) {
    let library = default_plugin_path();
    let bytes = std::fs::read(&library)
        .expect("build the provider first: cargo build --locked --release -p createos-provider");
    println!("provider library: {} ({:.1} MB)", library.display(), bytes.len() as f64 / 1e6);
    let dir = tempfile::tempdir().unwrap();
    let mut lock = LockFile::open(&dir.path().join("providers.lock")).unwrap();
    lock.add(&library).unwrap();
    c.bench_function("sha256 of the provider library", |b| b.iter(|| sha256_hex(black_box(&bytes))));
    c.bench_function("lock verify: read and hash the file, find its pin", |b| {
        b.iter(|| lock.verify(black_box(&library)).unwrap().sha256.len())
    });
    let staging = Staging::new().unwrap();
    c.bench_function("--locked check: copy the file privately, hash the copy, find its pin", |b| {
        b.iter(|| {
            let staged = staging.stage(black_box(&library)).unwrap();
            lock.pin_of(&library, staged.sha256()).unwrap().sha256.len()
        })
    });
    // A library loads once per path (never unloaded): load a fresh copy each time.
    let mut copies = 0u32;
    c.bench_function("load a copy of the provider library", |b| {
        b.iter_batched(
            || {
                copies += 1;
                let copy = dir.path().join(format!("copy-{copies}.so"));
                std::fs::write(&copy, &bytes).unwrap();
                copy
            },
            |copy| drop(LoadedProvider::load(&copy).unwrap()),
            criterion::BatchSize::PerIteration,
        )
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20);
    targets = pinning
}
criterion_main!(benches);
