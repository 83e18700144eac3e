//! The ABI contract through the host's loader: growth by appending (a
//! library of the next minor version, and one built from the frozen 2.0
//! definitions without its optional hooks), refusals (another major version,
//! a forged module, files that are not providers), panics, errors as data
//! and concurrency, exercised through the fixture libraries. That a host of
//! the next minor version loads 2.0 and 2.1 libraries is proved with that
//! version's definitions in `tests/fixtures/fixture-next-minor/tests/next_minor_host.rs`.

use e2e::library;
use provider_abi::{
    AbiVersion, AcquireParams, ByteSink, ByteSource, CreationRecorder, EnvironmentParams, ErrorKind,
    ExecuteParams, Hook, LeaseParams, MemoryEntry, OutputStream, Provider, ABI_2_0,
};
use provider_host::{
    loader::{LoadError, LoadProblem, LoadedProvider},
    wait,
};
use std::{
    path::Path,
    sync::{Arc, Mutex},
};

fn load(name: &str) -> LoadedProvider {
    LoadedProvider::load(library(name)).unwrap_or_else(|error| panic!("{name} should load: {error}"))
}

fn load_error(path: &Path) -> LoadError {
    match LoadedProvider::load(path) {
        Ok(_) => panic!("{} should not load", path.display()),
        Err(error) => {
            let text = error.to_string();
            assert!(!text.contains('\n'), "load errors are one line: {text}");
            assert!(text.contains(&path.display().to_string()), "the error names the file: {text}");
            error
        }
    }
}

/// Runs `params` on `provider` without standard input: its result and the
/// chunks its sink saw, as text.
fn execute(
    provider: &LoadedProvider,
    params: ExecuteParams,
) -> (provider_abi::HookResult<provider_abi::ExecuteResult>, Vec<String>) {
    let chunks = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&chunks);
    let sink = ByteSink::new(move |_: OutputStream, chunk: &[u8]| {
        seen.lock().unwrap().push(String::from_utf8_lossy(chunk).into_owned())
    });
    let result = wait(provider.execute(params, ByteSource::empty(), sink));
    let chunks = std::mem::take(&mut *chunks.lock().unwrap());
    (result, chunks)
}

/// A library of the next minor version (its table has one hook more) loads
/// into this host, which reaches every hook it knows and never sees the
/// appended one.
#[test]
fn a_library_of_the_next_minor_version_loads_with_every_hook_this_host_knows() {
    let provider = load("fixture_next_minor");
    assert_eq!(provider.library_abi(), AbiVersion::new(2, 2));
    assert_eq!(provider.health().unwrap().message, "fixture 2.2.0");
    let listed: Vec<String> = provider.manifest().hooks.iter().map(|hook| hook.to_string()).collect();
    assert_eq!(listed, Hook::ALL.map(|hook| hook.name().to_owned()));
    let lease = wait(provider.acquire_lease(
        AcquireParams { run_id: "run".into(), ..Default::default() },
        CreationRecorder::discard(),
    ))
    .unwrap();
    assert_eq!(lease.provider_lease_id.as_ref().map(|id| id.as_str()).into_option(), Some("run-1"));
    provider.import_memory(&[MemoryEntry::new("leases", b"2".to_vec())]).unwrap();
    assert_eq!(provider.export_memory().unwrap(), [MemoryEntry::new("leases", b"3".to_vec())]);
}

/// A library built from the frozen 2.0 definitions, exporting no optional
/// hook, loads into the newest host: its required hooks answer, and every
/// optional one is `unsupported` without reaching the library.
#[test]
fn a_library_without_optional_hooks_loads_and_they_are_unsupported_without_a_call() {
    let provider = load("fixture_frozen");
    assert_eq!(provider.library_abi(), ABI_2_0);
    assert_eq!(provider.health().unwrap().message, "fixture 2.0.0-frozen");
    let listed: Vec<String> = provider.manifest().hooks.iter().map(|hook| hook.to_string()).collect();
    let required: Vec<String> =
        Hook::ALL.into_iter().filter(|hook| !hook.is_optional()).map(|hook| hook.name().to_owned()).collect();
    assert_eq!(listed, required);
    let lease = LeaseParams { provider_lease_id: Some("lease-1".into()).into(), ..Default::default() };
    let refusals = [
        (
            Hook::Probe,
            wait(provider.probe(EnvironmentParams::default(), CreationRecorder::discard())).map(|_| ()),
        ),
        (Hook::InspectLease, wait(provider.inspect_lease(lease.clone())).map(|_| ())),
        (Hook::SyncFiles, wait(provider.sync_files(Default::default())).map(|_| ())),
        (Hook::ImportUnconfirmed, provider.import_unconfirmed(&lease)),
        (Hook::GrantRequestShare, provider.grant_request_share(1)),
        (Hook::ExportMemory, provider.export_memory().map(|_| ())),
        (Hook::ImportMemory, provider.import_memory(&[MemoryEntry::new("leases", b"1".to_vec())])),
    ];
    for (hook, outcome) in refusals {
        assert!(!provider.supports(hook), "{hook}");
        let error = outcome.unwrap_err();
        assert_eq!(error.kind, ErrorKind::UNSUPPORTED, "{hook}: {error}");
        assert_eq!(error.message, format!("The provider does not implement the `{hook}` hook."));
    }
}

#[test]
fn another_major_version_is_refused_in_one_line_naming_both_and_what_to_do() {
    for (name, version) in [("fixture_v1", "1.9"), ("fixture_v3", "3.0")] {
        let path = library(name);
        let error = load_error(&path);
        let text = error.to_string();
        assert!(matches!(error.problem, LoadProblem::IncompatibleAbi { .. }), "{text}");
        assert!(text.contains(&format!("built against provider ABI {version}")), "{text}");
        assert!(text.contains("this host loads 2.x: rebuild the provider against provider-abi 2"), "{text}");
    }
}

/// A module whose table hands over a function outside the library (its
/// `health` is the C library's `abort`) is refused before any call.
#[test]
fn a_forged_module_is_refused_naming_the_hook_that_points_outside_the_library() {
    let error = load_error(&library("fixture_forged"));
    assert!(matches!(&error.problem, LoadProblem::ForeignPointer(what) if what == "health hook"), "{error}");
}

#[test]
fn files_that_are_not_providers_are_refused_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let real = std::fs::read(library("fixture_provider")).unwrap();
    let cases: [(&str, Vec<u8>); 4] = [
        ("empty.so", Vec::new()),
        ("garbage.so", (0..4096u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect()),
        ("text.so", b"#!/bin/sh\necho not a library\n".to_vec()),
        ("truncated.so", real[..real.len() / 3].to_vec()),
    ];
    for (name, bytes) in cases {
        let path = dir.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        let error = load_error(&path);
        assert!(matches!(error.problem, LoadProblem::NotALibrary(_)), "{name}: {error}");
    }
    let missing = load_error(&dir.path().join("missing.so"));
    assert!(matches!(missing.problem, LoadProblem::Unreadable(_)), "{missing}");
    let plain = load_error(&library("not_a_provider"));
    assert!(matches!(plain.problem, LoadProblem::NotAProvider), "{plain}");
}

#[test]
fn two_versions_load_side_by_side() {
    let old = load("fixture_provider");
    let new = load("fixture_next_minor");
    // A copy of the same library at another path is a separate library.
    let dir = tempfile::tempdir().unwrap();
    let copy_path = dir.path().join("fixture-copy.so");
    std::fs::copy(library("fixture_provider"), &copy_path).unwrap();
    let copy = LoadedProvider::load(&copy_path).unwrap();
    assert_eq!(old.health().unwrap().message, "fixture 2.0.0");
    assert_eq!(new.health().unwrap().message, "fixture 2.2.0");
    assert_eq!(copy.health().unwrap().message, "fixture 2.0.0");
    assert_eq!((old.manifest().version, new.manifest().version), ("2.0.0".into(), "2.2.0".into()));
    // Each library keeps its own state.
    let acquire = AcquireParams { run_id: "run".into(), ..Default::default() };
    for _ in 0..3 {
        wait(old.acquire_lease(acquire.clone(), CreationRecorder::discard())).unwrap();
    }
    let first_new = wait(new.acquire_lease(acquire, CreationRecorder::discard())).unwrap();
    assert_eq!(first_new.provider_lease_id.as_ref().map(|id| id.as_str()).into_option(), Some("run-1"));
}

#[test]
fn errors_cross_as_data() {
    let provider = load("fixture_provider");
    let params = EnvironmentParams { config_json: "reject".into(), ..Default::default() };
    let error = provider.validate_config(&params).unwrap_err();
    assert_eq!(error.kind, ErrorKind::INVALID_CONFIG);
    assert_eq!(error.message, "fixture rejects this config.");
}

/// A panic in a synchronous hook, in an async hook before its future
/// exists, and while its future streams output, is an `internal` error
/// naming the hook; output sent before it still arrives, and the provider
/// goes on answering.
#[test]
fn a_panicking_hook_returns_an_internal_error_and_the_host_carries_on() {
    let provider = load("fixture_provider");
    let params = EnvironmentParams { config_json: "panic".into(), ..Default::default() };
    for _ in 0..3 {
        let error = provider.validate_config(&params).unwrap_err();
        assert_eq!(error.kind, ErrorKind::INTERNAL);
        assert!(error.message.contains("panicked in the `validate_config` hook"), "{error}");
    }
    let error = wait(provider.probe(params, CreationRecorder::discard())).unwrap_err();
    assert_eq!(error.kind, ErrorKind::INTERNAL);
    assert!(error.message.contains("panicked in the `probe` hook"), "{error}");
    let panics =
        ExecuteParams { command: "panic".into(), args: vec!["before".into()].into(), ..Default::default() };
    let (result, chunks) = execute(&provider, panics);
    let error = result.unwrap_err();
    assert_eq!(error.kind, ErrorKind::INTERNAL);
    assert!(error.message.contains("panicked in the `execute` hook"), "{error}");
    assert_eq!(chunks, ["before"], "output sent before the panic still arrived");
    assert_eq!(provider.health().unwrap().status, "ok", "the provider still answers");
}

#[test]
fn sixteen_threads_call_hooks_at_once() {
    let provider = Arc::new(load("fixture_provider"));
    let threads: Vec<_> = (0..16)
        .map(|thread| {
            let provider = Arc::clone(&provider);
            std::thread::spawn(move || {
                let mut leases = Vec::new();
                for round in 0..200 {
                    let run_id = format!("t{thread}");
                    let params = AcquireParams { run_id: run_id.as_str().into(), ..Default::default() };
                    let lease = wait(provider.acquire_lease(params, CreationRecorder::discard())).unwrap();
                    leases.push(lease.provider_lease_id.unwrap().to_string());
                    let args =
                        vec![format!("{thread}:{round}:a").into(), format!("{thread}:{round}:b").into()];
                    let params = ExecuteParams { args: args.into(), ..Default::default() };
                    let (result, chunks) = execute(&provider, params);
                    let result = result.unwrap();
                    assert_eq!(chunks.concat(), format!("{thread}:{round}:a{thread}:{round}:b"));
                    assert_eq!(result.stdout, chunks.concat());
                    assert_eq!(result.exit_code.into_option(), Some(2));
                }
                leases
            })
        })
        .collect();
    let mut all: Vec<String> = threads.into_iter().flat_map(|t| t.join().unwrap()).collect();
    let count = all.len();
    all.sort();
    all.dedup();
    assert_eq!(all.len(), count, "every acquire got its own lease");
    assert_eq!(count, 16 * 200);
}

/// The dynamic loader hands back the object it mapped for a path, whatever the
/// file at that path has become: a library replaced on disk (an upgrade by
/// rename) must be refused at that path, never served as the old one.
#[test]
fn a_path_whose_file_was_replaced_after_loading_is_refused_not_served_stale() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("provider.so");
    std::fs::copy(library("fixture_provider"), &path).unwrap();
    let old = LoadedProvider::load(&path).unwrap();
    assert_eq!(old.manifest().version, "2.0.0");
    let staged = dir.path().join("provider.so.new");
    std::fs::copy(library("fixture_next_minor"), &staged).unwrap();
    std::fs::rename(&staged, &path).unwrap();
    let error = load_error(&path);
    assert!(matches!(error.problem, LoadProblem::NotTheCheckedFile(_)), "{error}");
    assert!(error.to_string().contains("load the new version from a path of its own"), "{error}");
    // At a path of its own, the new version loads beside the old one.
    let fresh = dir.path().join("provider-2.2.so");
    std::fs::copy(library("fixture_next_minor"), &fresh).unwrap();
    assert_eq!(LoadedProvider::load(&fresh).unwrap().manifest().version, "2.2.0");
    assert_eq!(old.health().unwrap().message, "fixture 2.0.0");
}

/// The loader loads a path made absolute and canonical (no `..`, no symbolic
/// link), which is what `path()` reports; the harness's test of a bare name
/// against `LD_LIBRARY_PATH` is in `host-harness/tests/harness/inputs.rs`.
#[test]
fn the_loaded_path_is_absolute_and_canonical() {
    let dir = tempfile::tempdir().unwrap();
    let real = dir.path().join("real.so");
    std::fs::copy(library("fixture_provider"), &real).unwrap();
    std::os::unix::fs::symlink(&real, dir.path().join("link.so")).unwrap();
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    let provider = LoadedProvider::load(dir.path().join("sub/../link.so")).unwrap();
    assert_eq!(provider.path(), real.canonicalize().unwrap());
}
