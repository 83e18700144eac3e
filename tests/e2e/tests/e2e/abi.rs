//! The ABI contract: version matrix, refusals, panics and concurrency,
//! exercised through the fixture libraries.

use provider_host::wait;
use e2e::library;
use provider_abi::{
    AbiVersion, AcquireParams, AsyncCreationRecorder, ByteSink, CreationRecorder, EnvironmentParams,
    ErrorKind, ExecuteParams, Hook, LeaseParams, LoadError, LoadedProvider, LogLevel, LogRecord, LogSink,
    OutputSink, OutputStream, OwnedByteSink, OwnedByteSource, Provider, SetupParams, SyncMapping,
    SyncOperation, SyncParams, ABI_1_0, ABI_1_1, ABI_1_2, ABI_1_3, ABI_1_4, ABI_1_5, ABI_1_6, ABI_1_7,
    ABI_1_8, ABI_1_9,
};
use std::{path::Path, sync::Arc};

fn load(name: &str, host: AbiVersion) -> LoadedProvider {
    LoadedProvider::load_as(library(name), host)
        .unwrap_or_else(|error| panic!("{name} should load as ABI {host}: {error}"))
}

fn lease_params() -> LeaseParams {
    LeaseParams { provider_lease_id: Some("lease-1".into()).into(), ..Default::default() }
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

/// The hooks each minor version added, in order.
const ADDED_HOOKS: [(AbiVersion, &[Hook]); 9] = [
    (ABI_1_1, &[Hook::InspectLease]),
    (ABI_1_2, &[Hook::AcquireLeaseRecording, Hook::ProbeRecording, Hook::ReleaseLeaseReporting]),
    (ABI_1_3, &[Hook::ExecuteBytes, Hook::SetupWithLogs]),
    (ABI_1_4, &[Hook::SyncIn, Hook::SyncOut]),
    (ABI_1_5, &[Hook::ImportUnconfirmed]),
    (ABI_1_6, &[Hook::GrantRequestShare]),
    (
        ABI_1_7,
        &[
            Hook::HealthAsync,
            Hook::ProbeAsync,
            Hook::AcquireLeaseAsync,
            Hook::ResumeLeaseAsync,
            Hook::ReleaseLeaseAsync,
            Hook::DestroyLeaseAsync,
            Hook::ExecuteAsync,
        ],
    ),
    (
        ABI_1_8,
        &[Hook::SyncInAsync, Hook::SyncOutAsync, Hook::AcquireLeaseRecordingAsync, Hook::ProbeRecordingAsync],
    ),
    (ABI_1_9, &[Hook::ExecuteStdinAsync]),
];

/// Every host version of major 1 this crate can act as.
const HOSTS: [AbiVersion; 10] =
    [ABI_1_0, ABI_1_1, ABI_1_2, ABI_1_3, ABI_1_4, ABI_1_5, ABI_1_6, ABI_1_7, ABI_1_8, ABI_1_9];

/// Runs a hook's future on a runtime of the host's own (the provider's work
/// runs on the provider's runtime).
fn block_on<T>(future: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread().build().expect("a host runtime").block_on(future)
}

#[test]
fn version_matrix_within_major_1() {
    // Every fixture library into every host: a hook is callable exactly when
    // both the library and the host have its minor version.
    let libraries = [
        ("fixture_v1_0", ABI_1_0),
        ("fixture_v1_1", ABI_1_1),
        ("fixture_v1_2", ABI_1_2),
        ("fixture_v1_3", ABI_1_3),
        ("fixture_v1_4", ABI_1_4),
        ("fixture_v1_5", ABI_1_5),
        ("fixture_v1_6", ABI_1_6),
        ("fixture_v1_7", ABI_1_7),
        ("fixture_v1_8", ABI_1_8),
        ("fixture_v1_9", ABI_1_9),
    ];
    for (name, library_abi) in libraries {
        for host in HOSTS {
            let provider = load(name, host);
            assert_eq!(provider.library_abi(), library_abi, "{name} as {host}");
            let manifest = provider.manifest();
            assert_eq!(manifest.abi_version, library_abi);
            assert_eq!(provider.health().unwrap().status, "ok");
            for (since, hooks) in ADDED_HOOKS {
                let available = since <= library_abi && since <= host;
                for &hook in hooks {
                    assert_eq!(provider.supports(hook), available, "{name} as {host}: {hook}");
                    assert_eq!(
                        manifest.hooks.iter().any(|listed| listed == hook.name()),
                        available,
                        "{hook}"
                    );
                    let outcome = call_added_hook(&provider, hook);
                    match outcome {
                        Ok(()) => assert!(available, "{name} as {host} must not reach {hook}"),
                        Err(error) => {
                            assert!(!available, "{name} as {host}: {hook}: {error}");
                            assert_eq!(error.kind, ErrorKind::UNSUPPORTED);
                        }
                    }
                }
            }
        }
    }
}

/// Calls one of the hooks a minor version added, checking what it returns.
fn call_added_hook(provider: &LoadedProvider, hook: Hook) -> Result<(), provider_abi::ProviderError> {
    let recorded = Arc::new(std::sync::Mutex::new(Vec::new()));
    let id_of =
        |lease: &provider_abi::Lease| lease.provider_lease_id.clone().into_option().map(|id| id.to_string());
    let mut record = |lease: &provider_abi::Lease| {
        recorded.lock().unwrap().push(id_of(lease));
        Ok(())
    };
    let mut recorder = CreationRecorder::new(&mut record);
    let kept = Arc::clone(&recorded);
    let async_recorder = AsyncCreationRecorder::new(move |lease: &provider_abi::Lease| {
        kept.lock().unwrap().push(id_of(lease));
        provider_abi::ready(Ok(()))
    });
    let recorded_first = |lease: provider_abi::Lease| {
        let id = id_of(&lease);
        assert!(id.is_some());
        assert_eq!(*recorded.lock().unwrap(), [id], "the lease was recorded before the hook returned it");
    };
    let acquire = AcquireParams { run_id: "matrix".into(), ..Default::default() };
    let result = match hook {
        Hook::InspectLease => wait(provider.inspect_lease(lease_params())).map(|status| assert!(status.exists)),
        Hook::AcquireLeaseRecording => {
            provider.acquire_lease_recording(&acquire, &mut recorder).map(recorded_first)
        }
        Hook::AcquireLeaseRecordingAsync => {
            block_on(provider.acquire_lease(acquire.clone(), async_recorder))
                .map(recorded_first)
        }
        Hook::ProbeRecording => provider
            .probe_recording(&EnvironmentParams::default(), &mut recorder)
            .map(|report| assert!(report.ok)),
        Hook::ProbeRecordingAsync => block_on(
            provider.probe(EnvironmentParams::default(), async_recorder),
        )
        .map(|report| {
            assert!(report.ok);
            assert_eq!(recorded.lock().unwrap().len(), 1, "the probe's lease was recorded");
        }),
        Hook::ReleaseLeaseReporting => {
            wait(provider.release_lease(lease_params())).map(|report| assert!(!report.kept))
        }
        Hook::ExecuteBytes => {
            let mut bytes = Vec::new();
            let mut collect = |_: OutputStream, chunk: &[u8]| bytes.extend_from_slice(chunk);
            let params = ExecuteParams {
                command: "echo".into(),
                args: vec!["a".into(), "b".into()].into(),
                ..Default::default()
            };
            let result = provider.execute_bytes(&params, &mut ByteSink::new(&mut collect));
            result.map(|result| {
                assert_eq!(bytes, b"ab");
                assert_eq!(result.stdout, "ab", "the text tail stays in the result");
            })
        }
        Hook::SetupWithLogs => {
            let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
            let kept = Arc::clone(&seen);
            let sink = LogSink::new(move |record: &LogRecord<'_>| {
                kept.lock().unwrap().push(format!("{} {}", record.level.name(), record.message));
            });
            let params = SetupParams { host_name: "matrix".into(), ..Default::default() };
            provider.setup_with_logs(&params, sink, LogLevel::Info).map(|()| {
                assert_eq!(*seen.lock().unwrap(), ["INFO fixture set up"]);
            })
        }
        Hook::SyncIn | Hook::SyncInAsync => {
            let params = sync_params("in", "/matrix/in.txt");
            let result = match hook {
                Hook::SyncIn => provider.sync_in(&params),
                _ => block_on(provider.sync_files(params)),
            };
            result.map(|result| {
                assert_eq!(result.operations.len(), 1);
                assert_eq!(result.operations[0].files_transferred, 1);
            })
        }
        Hook::SyncOut | Hook::SyncOutAsync => {
            // What comes out is what the matrix's `sync_in` put in.
            let _ = provider.sync_in(&sync_params("in", "/matrix/in.txt"));
            let out = tempfile::tempdir().unwrap();
            let target = out.path().join("out.txt");
            let mut params = sync_params("out", target.to_str().unwrap());
            params.operations[0].mappings[0].source_path = "/matrix/in.txt".into();
            let result = match hook {
                Hook::SyncOut => provider.sync_out(&params),
                _ => block_on(provider.sync_files(params)),
            };
            result.map(|result| {
                assert_eq!(result.operations[0].bytes_transferred, 6);
                assert_eq!(std::fs::read(&target).unwrap(), b"matrix");
            })
        }
        Hook::ImportUnconfirmed => {
            let lease =
                LeaseParams { provider_lease_id: Some("imported".into()).into(), ..Default::default() };
            provider.import_unconfirmed(&lease).map(|()| {
                // The fixture's 1.1 `inspect_lease` reports what it was told
                // (every library with the 1.5 table has the 1.1 one).
                assert!(wait(provider.inspect_lease(lease.clone())).unwrap().unconfirmed);
            })
        }
        Hook::GrantRequestShare => provider.grant_request_share(250_000).map(|()| {
            let health = provider.health().unwrap();
            assert!(health.message.ends_with(", request share 250000 ppm"), "{}", health.message);
        }),
        Hook::HealthAsync => block_on(provider.health()).map(|report| assert_eq!(report.status, "ok")),
        Hook::ProbeAsync => {
            block_on(provider.probe(EnvironmentParams::default())).map(|report| assert!(report.ok))
        }
        Hook::AcquireLeaseAsync => block_on(provider.acquire_lease(acquire.clone()))
            .map(|lease| assert!(lease.provider_lease_id.is_some())),
        Hook::ResumeLeaseAsync => block_on(provider.resume_lease(lease_params()))
            .map(|lease| assert_eq!(lease.provider_lease_id, lease_params().provider_lease_id)),
        Hook::ReleaseLeaseAsync => {
            block_on(provider.release_lease(lease_params())).map(|report| assert!(!report.kept))
        }
        Hook::DestroyLeaseAsync => block_on(provider.destroy_lease(lease_params())),
        Hook::ExecuteAsync => {
            let bytes = Arc::new(std::sync::Mutex::new(Vec::new()));
            let kept = Arc::clone(&bytes);
            let sink =
                OwnedByteSink::new(move |_, chunk: &[u8]| kept.lock().unwrap().extend_from_slice(chunk));
            let params = ExecuteParams {
                command: "echo".into(),
                args: vec!["a".into(), "b".into()].into(),
                ..Default::default()
            };
            block_on(provider.execute_async(params, sink)).map(|result| {
                assert_eq!(*bytes.lock().unwrap(), b"ab");
                assert_eq!(result.stdout, "ab");
            })
        }
        Hook::ExecuteStdinAsync => {
            let bytes = Arc::new(std::sync::Mutex::new(Vec::new()));
            let kept = Arc::clone(&bytes);
            let sink =
                OwnedByteSink::new(move |_, chunk: &[u8]| kept.lock().unwrap().extend_from_slice(chunk));
            let input: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
            let stdin = OwnedByteSource::from_reader(std::io::Cursor::new(input.clone()));
            block_on(provider.execute_stdin_async(ExecuteParams::default(), stdin, sink)).map(|result| {
                assert_eq!(result.exit_code.into_option(), Some(0));
                assert_eq!(*bytes.lock().unwrap(), input, "the input came through the source");
            })
        }
        other => panic!("{other} was not added by a minor version"),
    };
    result
}

/// Sync parameters of one file mapping: a host file holding `matrix` into
/// `target` (for `sync_out` the caller swaps the source in).
fn sync_params(id: &str, target: &str) -> SyncParams {
    let source = std::env::temp_dir().join(format!("abi-matrix-{}.txt", std::process::id()));
    std::fs::write(&source, b"matrix").unwrap();
    SyncParams {
        lease: lease_params(),
        operations: vec![SyncOperation {
            id: id.into(),
            mappings: vec![SyncMapping {
                kind: "file".into(),
                source_path: source.to_str().unwrap().into(),
                target_path: target.into(),
                ..Default::default()
            }]
            .into(),
            post_upload_commands: Default::default(),
        }]
        .into(),
    }
}

#[test]
fn another_major_version_is_refused_in_one_line_naming_both_versions() {
    for host in HOSTS {
        let path = library("fixture_v2");
        let error = LoadedProvider::load_as(&path, host).err().expect("ABI 2 must be refused");
        let text = error.to_string();
        assert!(matches!(error, LoadError::IncompatibleAbi { .. }), "{text}");
        assert!(text.contains("ABI 2.0") && text.contains(&format!("ABI {host}")), "{text}");
        assert!(!text.contains('\n'), "{text}");
    }
}

#[test]
fn files_that_are_not_providers_are_refused_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let real = std::fs::read(library("fixture_v1_1")).unwrap();
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
        assert!(matches!(error, LoadError::NotALibrary { .. }), "{name}: {error}");
    }
    let missing = load_error(&dir.path().join("missing.so"));
    assert!(matches!(missing, LoadError::Unreadable { .. }), "{missing}");
    let plain = load_error(&library("not_a_provider"));
    assert!(matches!(plain, LoadError::NotAProvider { .. }), "{plain}");
}

#[test]
fn two_versions_load_side_by_side() {
    let old = load("fixture_v1_0", ABI_1_1);
    let new = load("fixture_v1_1", ABI_1_1);
    // A copy of the same library at another path is a separate library.
    let dir = tempfile::tempdir().unwrap();
    let copy_path = dir.path().join("fixture-copy.so");
    std::fs::copy(library("fixture_v1_0"), &copy_path).unwrap();
    let copy = LoadedProvider::load(&copy_path).unwrap();
    assert_eq!(old.health().unwrap().message, "fixture 1.0.0");
    assert_eq!(new.health().unwrap().message, "fixture 1.1.0");
    assert_eq!(copy.health().unwrap().message, "fixture 1.0.0");
    assert_eq!(old.manifest().version, "1.0.0");
    assert_eq!(new.manifest().version, "1.1.0");
    // Each library keeps its own state.
    let acquire = AcquireParams { run_id: "run".into(), ..Default::default() };
    for _ in 0..3 {
        wait(old.acquire_lease(acquire.clone(), CreationRecorder::discard())).unwrap();
    }
    let first_new = wait(new.acquire_lease(acquire.clone(), CreationRecorder::discard())).unwrap();
    assert_eq!(first_new.provider_lease_id.as_ref().map(|id| id.as_str()).into_option(), Some("run-1"));
}

#[test]
fn errors_cross_as_data() {
    let provider = load("fixture_v1_1", ABI_1_1);
    let params = EnvironmentParams { config_json: "reject".into(), ..Default::default() };
    let error = provider.validate_config(&params).unwrap_err();
    assert_eq!(error.kind, ErrorKind::INVALID_CONFIG);
    assert_eq!(error.message, "fixture rejects this config.");
}

#[test]
fn a_panicking_hook_returns_an_internal_error_and_the_host_carries_on() {
    let provider = load("fixture_v1_1", ABI_1_1);
    let params = EnvironmentParams { config_json: "panic".into(), ..Default::default() };
    for _ in 0..3 {
        let error = provider.validate_config(&params).unwrap_err();
        assert_eq!(error.kind, ErrorKind::INTERNAL);
        assert!(error.message.contains("panicked in the `validate_config` hook"), "{error}");
    }
    let mut chunks = Vec::new();
    let mut collect = |_: OutputStream, chunk: &str| chunks.push(chunk.to_owned());
    let execute =
        ExecuteParams { command: "panic".into(), args: vec!["before".into()].into(), ..Default::default() };
    let error = provider.execute(&execute, &mut OutputSink::new(&mut collect)).unwrap_err();
    assert_eq!(error.kind, ErrorKind::INTERNAL);
    assert_eq!(chunks, ["before"], "output sent before the panic still arrived");
    assert_eq!(provider.health().unwrap().status, "ok", "the provider still answers");
}

#[test]
fn sixteen_threads_call_hooks_at_once() {
    let provider = Arc::new(load("fixture_v1_1", ABI_1_1));
    let threads: Vec<_> = (0..16)
        .map(|thread| {
            let provider = Arc::clone(&provider);
            std::thread::spawn(move || {
                let mut leases = Vec::new();
                for round in 0..200 {
                    let run_id = format!("t{thread}");
                    let lease = provider
                        .acquire_lease(&AcquireParams {
                            run_id: run_id.as_str().into(),
                            ..Default::default()
                        })
                        .unwrap();
                    leases.push(lease.provider_lease_id.unwrap().to_string());
                    let args =
                        vec![format!("{thread}:{round}:a").into(), format!("{thread}:{round}:b").into()];
                    let mut seen = String::new();
                    let mut collect = |_: OutputStream, chunk: &str| seen.push_str(chunk);
                    let params = ExecuteParams { args: args.into(), ..Default::default() };
                    let result = provider.execute(&params, &mut OutputSink::new(&mut collect)).unwrap();
                    assert_eq!(seen, format!("{thread}:{round}:a{thread}:{round}:b"));
                    assert_eq!(result.stdout, seen);
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
    std::fs::copy(library("fixture_v1_0"), &path).unwrap();
    let old = LoadedProvider::load(&path).unwrap();
    assert_eq!(old.manifest().version, "1.0.0");
    let staged = dir.path().join("provider.so.new");
    std::fs::copy(library("fixture_v1_1"), &staged).unwrap();
    std::fs::rename(&staged, &path).unwrap();
    let error = load_error(&path);
    assert!(matches!(error, LoadError::NotTheCheckedFile { .. }), "{error}");
    assert!(error.to_string().contains("load the new version from a path of its own"), "{error}");
    // At a path of its own, the new version loads beside the old one.
    let fresh = dir.path().join("provider-1.1.so");
    std::fs::copy(library("fixture_v1_1"), &fresh).unwrap();
    assert_eq!(LoadedProvider::load(&fresh).unwrap().manifest().version, "1.1.0");
    assert_eq!(old.health().unwrap().message, "fixture 1.0.0");
}

/// The loader loads a path made absolute and canonical (no `..`, no symbolic
/// link), which is what `path()` reports; the harness's test of a bare name
/// against `LD_LIBRARY_PATH` is in `host-harness/tests/inputs.rs`.
#[test]
fn the_loaded_path_is_absolute_and_canonical() {
    let dir = tempfile::tempdir().unwrap();
    let real = dir.path().join("real.so");
    std::fs::copy(library("fixture_v1_1"), &real).unwrap();
    std::os::unix::fs::symlink(&real, dir.path().join("link.so")).unwrap();
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    let provider = LoadedProvider::load(dir.path().join("sub/../link.so")).unwrap();
    assert_eq!(provider.path(), real.canonicalize().unwrap());
}
