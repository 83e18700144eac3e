//! File sync through the loaded provider against the simulator, with real
//! files on both sides: the reference's `file-sync.test.ts` rebuilt on real
//! bytes, plus links planted in the sandbox, cancellation by release and
//! request counts.

use crate::support::{lease_id, Bed};
use createos_sim::{FaultKind, FaultRule, FaultTrigger};
use provider_abi::{
    ErrorKind, Lease, PostUploadCommand, Provider, ProviderError, SyncMapping, SyncOperation, SyncParams,
};
use provider_host::wait;
use serde_json::{json, Value};
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::Path;

const ESCAPES: &str = "CreateOS transfer path escapes the workspace.";
const NOT_CONFINED: &str = "CreateOS transfer requires a confined absolute sandbox path.";
const UNSAFE_ARCHIVE: &str = "CreateOS archive contains unsafe entries or exceeds the extraction limit.";

fn mapping(kind: &str, source: &str, target: &str) -> SyncMapping {
    SyncMapping {
        kind: kind.into(),
        source_path: source.into(),
        target_path: target.into(),
        ..Default::default()
    }
}

fn params(bed: &Bed, config: &Value, lease: &Lease, mappings: Vec<SyncMapping>) -> SyncParams {
    SyncParams {
        lease: bed.lease_params(config, lease),
        direction: Default::default(),
        operations: vec![SyncOperation {
            id: "op-1".into(),
            mappings: mappings.into(),
            ..Default::default()
        }]
        .into(),
    }
}

fn path(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// Runs a bash script in the lease; its exit code and stdout.
fn sh(bed: &Bed, config: &Value, lease: &Lease, script: &str) -> (Option<i32>, String) {
    let result = bed.execute(&bed.command(config, lease, "/bin/bash", &["-c", script])).0.unwrap();
    (result.exit_code.into_option(), result.stdout.to_string())
}

fn assert_error(error: &ProviderError, kind: ErrorKind, message: &str) {
    assert_eq!((error.kind, error.message.as_str()), (kind, message));
}

fn mode_of(path: &Path) -> u32 {
    std::fs::symlink_metadata(path).unwrap().permissions().mode() & 0o777
}

#[test]
fn binary_bytes_arrive_exact_with_the_requested_mode() {
    let bed = Bed::new();
    let config = bed.config(json!({}));
    let lease = bed.acquire(&config);
    let host = tempfile::tempdir().unwrap();
    let source = host.path().join("bytes.bin");
    let bytes: Vec<u8> = (0..=255u8).cycle().take(70_000).collect();
    std::fs::write(&source, &bytes).unwrap();
    let mut file = mapping("file", path(&source), "/paperclip-workspace/in/deep/bytes.bin");
    file.mode = Some(0o640).into();
    let puts = bed.ledger().count("PUT", "/v1/sandboxes/*/files");
    let result = bed.sync_in(params(&bed, &config, &lease, vec![file])).unwrap();
    assert_eq!(result.operations.len(), 1);
    assert_eq!(result.operations[0].id, "op-1");
    assert_eq!((result.operations[0].files_transferred, result.operations[0].bytes_transferred), (1, 70_000));
    let (code, out) = sh(
        &bed,
        &config,
        &lease,
        "cd /paperclip-workspace/in/deep && stat -c %a bytes.bin && sha256sum bytes.bin | cut -c1-64 && ls /tmp",
    );
    assert_eq!(code, Some(0));
    let mut lines = out.lines();
    assert_eq!(lines.next(), Some("640"));
    assert_eq!(lines.next(), Some(sha256_hex(&source).as_str()), "the bytes arrived exactly");
    assert!(!out.contains("paperclip-createos-transfer-"), "the scratch file is gone: {out}");
    let ledger = bed.ledger();
    assert_eq!(ledger.count("PUT", "/v1/sandboxes/*/files"), puts + 1, "one upload through /files");
}

#[test]
fn a_5_mib_download_is_byte_exact_through_files_with_its_mode() {
    let bed = Bed::new();
    let config = bed.config(json!({}));
    let lease = bed.acquire(&config);
    let (code, _) = sh(&bed, &config, &lease, "head -c 5242880 /dev/urandom > /paperclip-workspace/big.bin");
    assert_eq!(code, Some(0));
    let (_, remote_sum) = sh(&bed, &config, &lease, "sha256sum /paperclip-workspace/big.bin | cut -c1-64");
    let host = tempfile::tempdir().unwrap();
    let target = host.path().join("out/big.bin");
    let mut file = mapping("file", "/paperclip-workspace/big.bin", path(&target));
    file.mode = Some(0o640).into();
    let processes = bed.ledger().count("POST", "/v1/sandboxes/*/processes");
    let result = bed.sync_out(params(&bed, &config, &lease, vec![file])).unwrap();
    assert_eq!(result.operations[0].bytes_transferred, 5 << 20);
    let downloaded = std::fs::read(&target).unwrap();
    assert_eq!(downloaded.len(), 5 << 20);
    assert_eq!(sha256_hex(&target), remote_sum.trim());
    assert_eq!(mode_of(&target), 0o640);
    let ledger = bed.ledger();
    assert_eq!(ledger.count("GET", "/v1/sandboxes/*/files"), 1, "one download through /files");
    assert_eq!(ledger.count("POST", "/v1/sandboxes/*/processes"), processes, "never the process journal");
    let (_, tmp) = sh(&bed, &config, &lease, "ls /tmp");
    assert!(!tmp.contains("paperclip-createos-transfer-"), "the scratch file is gone: {tmp}");
}

/// The SHA-256 of a host file, by the system's `sha256sum`.
fn sha256_hex(path: &Path) -> String {
    let out = std::process::Command::new("sha256sum").arg(path).output().unwrap();
    String::from_utf8(out.stdout).unwrap()[..64].to_owned()
}

#[test]
fn a_download_cut_mid_stream_never_replaces_the_host_file_and_leaves_no_temporary() {
    let bed = Bed::new();
    let config = bed.config(json!({}));
    let lease = bed.acquire(&config);
    sh(&bed, &config, &lease, "head -c 2000000 /dev/zero > /paperclip-workspace/new.bin");
    let host = tempfile::tempdir().unwrap();
    let target = host.path().join("kept.txt");
    std::fs::write(&target, "the old contents").unwrap();
    bed.sim.add_fault(FaultRule::new(
        "GET /v1/sandboxes/*/files",
        FaultTrigger::Nth { nth: 1 },
        FaultKind::CutStream,
    ));
    let error = bed
        .sync_out(params(
            &bed,
            &config,
            &lease,
            vec![mapping("file", "/paperclip-workspace/new.bin", path(&target))],
        ))
        .unwrap_err();
    assert_eq!(error.kind, ErrorKind::CONNECTION, "{error}");
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "the old contents");
    let names: Vec<_> = std::fs::read_dir(host.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, ["kept.txt"], "no temporary file is left beside the target");
    let (_, tmp) = sh(&bed, &config, &lease, "ls /tmp");
    assert!(!tmp.contains("paperclip-createos-transfer-"), "the scratch file is gone: {tmp}");
}

#[test]
fn a_directory_with_modes_an_internal_link_and_excluded_node_modules_round_trips() {
    let bed = Bed::new();
    let config = bed.config(json!({}));
    let lease = bed.acquire(&config);
    let host = tempfile::tempdir().unwrap();
    let source = host.path().join("project");
    std::fs::create_dir_all(source.join("bin")).unwrap();
    std::fs::create_dir_all(source.join("private")).unwrap();
    std::fs::create_dir_all(source.join("node_modules/dep")).unwrap();
    std::fs::create_dir_all(source.join("web/node_modules")).unwrap();
    std::fs::write(source.join("README.md"), "read me\n").unwrap();
    std::fs::write(source.join("bin/run.sh"), "#!/bin/sh\necho run\n").unwrap();
    std::fs::write(source.join("private/key"), "k").unwrap();
    std::fs::write(source.join("node_modules/dep/index.js"), "x").unwrap();
    std::fs::write(source.join("web/node_modules/y.js"), "y").unwrap();
    std::fs::set_permissions(source.join("bin/run.sh"), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(source.join("private/key"), std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::set_permissions(source.join("private"), std::fs::Permissions::from_mode(0o700)).unwrap();
    symlink("../README.md", source.join("bin/readme")).unwrap();
    let mut inbound = mapping("directory", path(&source), "/paperclip-workspace/project");
    inbound.exclude = vec!["node_modules".into()].into();
    let before = bed.ledger().requests.len();
    let result = bed.sync_in(params(&bed, &config, &lease, vec![inbound])).unwrap();
    assert_eq!(
        (result.operations[0].files_transferred, result.operations[0].bytes_transferred),
        (3, 8 + 19 + 1)
    );
    assert_eq!(
        bed.ledger().requests.len() - before,
        2,
        "one upload and one command, whatever the file count"
    );
    let (_, listing) = sh(&bed, &config, &lease, "cd /paperclip-workspace/project && find . | sort && stat -c '%n %a' . bin/run.sh private private/key && readlink bin/readme && ./bin/run.sh");
    assert!(!listing.contains("node_modules"), "{listing}");
    for expected in [". 755", "bin/run.sh 755", "private 700", "private/key 600", "../README.md", "run"] {
        assert!(listing.lines().any(|line| line == expected), "{expected:?} in {listing}");
    }

    let back = host.path().join("back");
    let outbound = mapping("directory", "/paperclip-workspace/project", path(&back));
    let before = bed.ledger().requests.len();
    let result = bed.sync_out(params(&bed, &config, &lease, vec![outbound])).unwrap();
    assert_eq!(result.operations[0].files_transferred, 3);
    assert_eq!(bed.ledger().requests.len() - before, 3, "one command, one download, one removal");
    assert_eq!(std::fs::read_to_string(back.join("README.md")).unwrap(), "read me\n");
    assert_eq!(std::fs::read_link(back.join("bin/readme")).unwrap(), Path::new("../README.md"));
    assert_eq!(mode_of(&back.join("bin/run.sh")), 0o755);
    assert_eq!(mode_of(&back.join("private")), 0o700);
    assert_eq!(mode_of(&back.join("private/key")), 0o600);
    assert!(!back.join("node_modules").exists() && !back.join("web/node_modules").exists());
}

#[test]
fn a_host_link_leaving_the_source_is_refused_before_any_request_even_after_a_valid_mapping() {
    let bed = Bed::new();
    let config = bed.config(json!({}));
    let lease = bed.acquire(&config);
    let host = tempfile::tempdir().unwrap();
    std::fs::write(host.path().join("fine.txt"), "fine").unwrap();
    let source = host.path().join("dir");
    std::fs::create_dir(&source).unwrap();
    symlink("/etc/passwd", source.join("absolute")).unwrap();
    let relative = host.path().join("dir2");
    std::fs::create_dir(&relative).unwrap();
    symlink("../fine.txt", relative.join("up")).unwrap();
    for dir in [&source, &relative] {
        let before = bed.ledger().requests.len();
        let mappings = vec![
            mapping("file", path(&host.path().join("fine.txt")), "/paperclip-workspace/fine.txt"),
            mapping("directory", path(dir), "/paperclip-workspace/dir"),
        ];
        let error = bed.sync_in(params(&bed, &config, &lease, mappings)).unwrap_err();
        assert_error(&error, ErrorKind::INVALID_INPUT, ESCAPES);
        assert_eq!(bed.ledger().requests.len(), before, "no request at all");
    }
}

#[test]
fn reference_paths_are_refused_before_any_request() {
    let bed = Bed::new();
    let config = bed.config(json!({}));
    let lease = bed.acquire(&config);
    let host = tempfile::tempdir().unwrap();
    let file = host.path().join("f");
    std::fs::write(&file, "f").unwrap();
    let before = bed.ledger().requests.len();
    for (sandbox, message) in [
        ("/etc/passwd", ESCAPES),
        ("/paperclip-workspace/../secret", NOT_CONFINED),
        ("relative", NOT_CONFINED),
        ("/paperclip-workspace-other/file", ESCAPES),
    ] {
        let inbound = mapping("file", path(&file), sandbox);
        let error = bed.sync_in(params(&bed, &config, &lease, vec![inbound])).unwrap_err();
        assert_error(&error, ErrorKind::INVALID_INPUT, message);
        let outbound = mapping("file", sandbox, path(&host.path().join("out")));
        let error = bed.sync_out(params(&bed, &config, &lease, vec![outbound])).unwrap_err();
        assert_error(&error, ErrorKind::INVALID_INPUT, message);
    }
    let mut bad_mode = mapping("file", path(&file), "/paperclip-workspace/f");
    bad_mode.mode = Some(0o1000).into();
    let mut follow = mapping("directory", path(host.path()), "/paperclip-workspace/d");
    follow.follow_symlinks = true;
    let relative_host = mapping("file", "relative/f", "/paperclip-workspace/f");
    for wrong in [bad_mode, follow, relative_host] {
        let error = bed.sync_in(params(&bed, &config, &lease, vec![wrong])).unwrap_err();
        assert_eq!(error.kind, ErrorKind::INVALID_INPUT, "{error}");
    }
    let mut with_commands = params(&bed, &config, &lease, vec![]);
    with_commands.operations[0].post_upload_commands =
        vec![PostUploadCommand { command: "true".into(), ..Default::default() }].into();
    let error = bed.sync_out(with_commands.clone()).unwrap_err();
    assert_eq!(error.kind, ErrorKind::INVALID_INPUT, "{error}");
    with_commands.operations[0].post_upload_commands[0].timeout_ms = Some(0).into();
    let error = bed.sync_in(with_commands.clone()).unwrap_err();
    assert_eq!(error.kind, ErrorKind::INVALID_INPUT, "{error}");
    assert_eq!(bed.ledger().requests.len(), before, "no request at all");
    assert!(!host.path().join("out").exists());
}

#[test]
fn a_link_planted_in_the_workspace_cannot_redirect_a_write_or_a_read() {
    let bed = Bed::new();
    let config = bed.config(json!({}));
    let lease = bed.acquire(&config);
    let (code, _) = sh(
        &bed,
        &config,
        &lease,
        "echo secret > /tmp/secret && ln -s /tmp /paperclip-workspace/planted && ln -s /tmp/secret /paperclip-workspace/file-link",
    );
    assert_eq!(code, Some(0));
    let host = tempfile::tempdir().unwrap();
    let file = host.path().join("f");
    std::fs::write(&file, "overwrite").unwrap();
    for target in ["/paperclip-workspace/planted/secret", "/paperclip-workspace/file-link"] {
        let error = bed
            .sync_in(params(&bed, &config, &lease, vec![mapping("file", path(&file), target)]))
            .unwrap_err();
        assert_error(&error, ErrorKind::INVALID_INPUT, ESCAPES);
        let out = host.path().join("read");
        let error = bed
            .sync_out(params(&bed, &config, &lease, vec![mapping("file", target, path(&out))]))
            .unwrap_err();
        assert_error(&error, ErrorKind::INVALID_INPUT, ESCAPES);
        assert!(!out.exists());
    }
    let dir = host.path().join("d");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("secret"), "overwrite").unwrap();
    let error = bed
        .sync_in(params(
            &bed,
            &config,
            &lease,
            vec![mapping("directory", path(&dir), "/paperclip-workspace/planted")],
        ))
        .unwrap_err();
    assert_error(&error, ErrorKind::INVALID_INPUT, ESCAPES);
    let (_, secret) = sh(&bed, &config, &lease, "cat /tmp/secret; ls /tmp");
    assert!(secret.starts_with("secret\n"), "{secret}");
    assert!(!secret.contains("paperclip-createos-transfer-"), "the scratch file is gone: {secret}");
}

#[test]
fn an_archive_carrying_an_escaping_link_is_rejected_before_anything_is_extracted() {
    let bed = Bed::new();
    let config = bed.config(json!({}));
    let lease = bed.acquire(&config);
    let (code, _) = sh(
        &bed,
        &config,
        &lease,
        "mkdir -p /paperclip-workspace/out/a && echo first > /paperclip-workspace/out/a/first && ln -s ../../../etc /paperclip-workspace/out/z-escape",
    );
    assert_eq!(code, Some(0));
    let host = tempfile::tempdir().unwrap();
    let target = host.path().join("landed");
    let error = bed
        .sync_out(params(
            &bed,
            &config,
            &lease,
            vec![mapping("directory", "/paperclip-workspace/out", path(&target))],
        ))
        .unwrap_err();
    assert_error(&error, ErrorKind::PROTOCOL, UNSAFE_ARCHIVE);
    assert!(!target.exists(), "nothing was extracted");
    let names: Vec<_> = std::fs::read_dir(host.path()).unwrap().collect();
    assert!(names.is_empty(), "no temporary archive is left: {names:?}");
    let mut target_link = target.clone();
    target_link.set_file_name("link-target");
    symlink(host.path(), &target_link).unwrap();
    let error = bed
        .sync_out(params(
            &bed,
            &config,
            &lease,
            vec![mapping("directory", "/paperclip-workspace/out/a", path(&target_link))],
        ))
        .unwrap_err();
    assert_eq!(error.kind, ErrorKind::INVALID_INPUT, "a destination that is a link: {error}");
}

/// A tar archive: the directory `a/`, a file `a/ok` and a hard link `a/h`
/// to `link_target`.
fn archive_with_a_hard_link(link_target: &str) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(tar::EntryType::Directory);
    header.set_mode(0o755);
    header.set_size(0);
    builder.append_data(&mut header, "a/", std::io::empty()).unwrap();
    let mut header = tar::Header::new_gnu();
    header.set_mode(0o644);
    header.set_size(4);
    builder.append_data(&mut header, "a/ok", &b"fine"[..]).unwrap();
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(tar::EntryType::Link);
    header.set_mode(0o644);
    header.set_size(0);
    builder.append_link(&mut header, "a/h", link_target).unwrap();
    builder.into_inner().unwrap()
}

/// The sandbox's own `tar` never archives a hard link to a file outside the
/// directory, so a hostile sandbox is modelled by swapping the scratch
/// archive (by rename) while the download is held in the simulator.
#[test]
fn an_outbound_archive_with_a_hard_link_leaving_it_lands_nothing() {
    let bed = Bed::new();
    let config = bed.config(json!({}));
    let lease = bed.acquire(&config);
    let hostile = tempfile::tempdir().unwrap();
    for (n, link_target) in ["../../../etc/passwd", "/etc/passwd"].into_iter().enumerate() {
        let archive = hostile.path().join(format!("hostile-{n}.tar"));
        std::fs::write(&archive, archive_with_a_hard_link(link_target)).unwrap();
        let remote = format!("/paperclip-workspace/hostile-{n}.tar");
        let upload = mapping("file", path(&archive), &remote);
        bed.sync_in(params(&bed, &config, &lease, vec![upload])).unwrap();
        let (code, _) = sh(
            &bed,
            &config,
            &lease,
            "mkdir -p /paperclip-workspace/out && echo x > /paperclip-workspace/out/x",
        );
        assert_eq!(code, Some(0));
        let execs = bed.ledger().count("POST", "/v1/sandboxes/*/exec");
        bed.sim.add_fault(FaultRule::new(
            "GET /v1/sandboxes/*/files",
            FaultTrigger::Nth { nth: 1 },
            FaultKind::Delay(std::time::Duration::from_secs(5)),
        ));
        let host = tempfile::tempdir().unwrap();
        let target = host.path().join("landed");
        let call = params(
            &bed,
            &config,
            &lease,
            vec![mapping("directory", "/paperclip-workspace/out", path(&target))],
        );
        std::thread::scope(|scope| {
            let syncing = scope.spawn(|| bed.sync_out(call.clone()));
            bed.wait_for_ledger("the archiving command", |ledger| {
                ledger.count("POST", "/v1/sandboxes/*/exec") > execs
            });
            let swap = format!(
                "set -e; scratch=$(ls /tmp/paperclip-createos-transfer-*); cp {remote} \"$scratch.new\"; mv -f \"$scratch.new\" \"$scratch\""
            );
            assert_eq!(sh(&bed, &config, &lease, &swap).0, Some(0));
            let error = syncing.join().unwrap().unwrap_err();
            assert_error(&error, ErrorKind::PROTOCOL, UNSAFE_ARCHIVE);
        });
        assert!(!target.exists(), "{link_target}: nothing was extracted");
        assert_eq!(std::fs::read_dir(host.path()).unwrap().count(), 0, "{link_target}: no temporary archive");
    }
}

#[test]
fn post_upload_commands_run_verbatim_and_stop_at_the_first_failure() {
    let bed = Bed::new();
    let config = bed.config(json!({}));
    let lease = bed.acquire(&config);
    let host = tempfile::tempdir().unwrap();
    let file = host.path().join("f");
    std::fs::write(&file, "f").unwrap();
    let mut call =
        params(&bed, &config, &lease, vec![mapping("file", path(&file), "/paperclip-workspace/sub/f")]);
    let command = |command: &str, cwd: Option<&str>| PostUploadCommand {
        command: command.into(),
        cwd: cwd.map(Into::into).into(),
        timeout_ms: Some(10_000).into(),
    };
    call.operations[0].post_upload_commands = vec![
        command("printf '%s|%s' \"$PWD\" 'it'\"'\"'s $(x)' > out1", Some("/paperclip-workspace/sub")),
        command("exit 3", None),
        command("touch /paperclip-workspace/never", None),
    ]
    .into();
    let error = bed.sync_in(call.clone()).unwrap_err();
    assert_error(&error, ErrorKind::API, "CreateOS post-upload command failed with exit code 3.");
    let (_, out) =
        sh(&bed, &config, &lease, "cat /paperclip-workspace/sub/out1; echo; ls /paperclip-workspace");
    assert!(out.starts_with("/paperclip-workspace/sub|it's $(x)\n"), "{out}");
    assert!(!out.contains("never"), "{out}");
}

#[test]
fn sync_during_release_is_cancelled_and_the_scratch_file_removed() {
    let bed = Bed::new();
    let config = bed.config(json!({"reuseLease": true}));
    let lease = bed.acquire(&config);
    sh(&bed, &config, &lease, "head -c 100000 /dev/zero > /paperclip-workspace/held.bin");
    let execs = bed.ledger().count("POST", "/v1/sandboxes/*/exec");
    // The download is held in the simulator; release comes meanwhile.
    bed.sim.add_fault(FaultRule::new(
        "GET /v1/sandboxes/*/files",
        FaultTrigger::Nth { nth: 1 },
        FaultKind::Delay(std::time::Duration::from_secs(5)),
    ));
    let host = tempfile::tempdir().unwrap();
    let target = host.path().join("held.bin");
    let call =
        params(&bed, &config, &lease, vec![mapping("file", "/paperclip-workspace/held.bin", path(&target))]);
    std::thread::scope(|scope| {
        let syncing = scope.spawn(|| bed.sync_out(call.clone()));
        bed.wait_for_ledger("the staging command", |ledger| {
            ledger.count("POST", "/v1/sandboxes/*/exec") > execs
        });
        wait(bed.provider.release_lease(bed.lease_params(&config, &lease))).unwrap();
        let error = syncing.join().unwrap().unwrap_err();
        assert_error(&error, ErrorKind::CANCELLED, "CreateOS command was cancelled.");
    });
    assert!(!target.exists());
    assert_eq!(std::fs::read_dir(host.path()).unwrap().count(), 0, "no temporary file");
    assert_eq!(bed.status(&lease_id(&lease)), "paused");
    let resumed = wait(bed.provider.resume_lease(bed.lease_params(&config, &lease))).unwrap();
    let (_, tmp) = sh(&bed, &config, &resumed, "ls /tmp");
    assert!(!tmp.contains("paperclip-createos-transfer-"), "the scratch file was removed: {tmp}");
}

/// A sync in each direction on `lease`, each answering one error: the
/// kind, the message and the requests it sent.
fn sync_both_ways(bed: &Bed, config: &Value, lease: &Lease) -> Vec<(ErrorKind, String, usize)> {
    let host = tempfile::tempdir().unwrap();
    let file = host.path().join("f");
    std::fs::write(&file, "f").unwrap();
    let back = host.path().join("back");
    let inbound = params(bed, config, lease, vec![mapping("file", path(&file), "/paperclip-workspace/f")]);
    let outbound = params(bed, config, lease, vec![mapping("file", "/paperclip-workspace/f", path(&back))]);
    let calls: [&dyn Fn() -> Result<_, ProviderError>; 2] =
        [&|| bed.sync_in(inbound.clone()), &|| bed.sync_out(outbound.clone())];
    let answers = calls
        .iter()
        .map(|call| {
            let before = bed.ledger().requests.len();
            let error = call().unwrap_err();
            (error.kind, error.message.to_string(), bed.ledger().requests.len() - before)
        })
        .collect();
    assert!(!back.exists(), "nothing landed");
    answers
}

#[test]
fn sync_while_a_release_is_in_progress_is_refused_before_any_request() {
    let bed = Bed::new();
    let config = bed.config(json!({"reuseLease": true}));
    let lease = bed.acquire(&config);
    sh(&bed, &config, &lease, "echo f > /paperclip-workspace/f");
    // The release holds the lease closing while its pause is delayed.
    bed.sim.add_fault(FaultRule::new(
        "POST /v1/sandboxes/*/pause",
        FaultTrigger::Nth { nth: 1 },
        FaultKind::Delay(std::time::Duration::from_secs(5)),
    ));
    let reads_before = bed.ledger().count("GET", "/v1/sandboxes/*");
    std::thread::scope(|scope| {
        let release = scope.spawn(|| wait(bed.provider.release_lease(bed.lease_params(&config, &lease))));
        bed.wait_for_ledger("the release's state read", |ledger| {
            ledger.count("GET", "/v1/sandboxes/*") > reads_before
        });
        let refused =
            (ErrorKind::CLEANUP_IN_PROGRESS, "CreateOS lease cleanup is already in progress.".into(), 0);
        assert_eq!(sync_both_ways(&bed, &config, &lease), [refused.clone(), refused]);
        assert!(!release.is_finished(), "the syncs were refused while the release ran");
        release.join().unwrap().expect("the release pauses");
    });
    assert_eq!(bed.status(&lease_id(&lease)), "paused");
}

#[test]
fn sync_on_an_unconfirmed_lease_is_refused_before_any_request() {
    let bed = Bed::new();
    let config = bed.config(json!({}));
    let lease = bed.acquire(&config);
    bed.sim.add_fault(FaultRule::new(
        "POST /v1/sandboxes/*/processes",
        FaultTrigger::Nth { nth: 1 },
        FaultKind::Status(503),
    ));
    let error = bed.execute(&bed.command(&config, &lease, "/bin/true", &[])).0.unwrap_err();
    assert_eq!(error.kind, ErrorKind::CREATION_UNCONFIRMED, "{error}");
    let refused = (
        ErrorKind::CLEANUP_UNCONFIRMED,
        "CreateOS process cleanup is unconfirmed; destroy this lease before reusing it.".into(),
        0,
    );
    assert_eq!(sync_both_ways(&bed, &config, &lease), [refused.clone(), refused]);
}

#[test]
fn a_failed_transfer_command_is_one_line_and_lands_nothing() {
    let bed = Bed::new();
    let config = bed.config(json!({}));
    let lease = bed.acquire(&config);
    let host = tempfile::tempdir().unwrap();
    let target = host.path().join("missing.txt");
    let missing = mapping("file", "/paperclip-workspace/no-such-file", path(&target));
    let error = bed.sync_out(params(&bed, &config, &lease, vec![missing])).unwrap_err();
    assert_error(&error, ErrorKind::API, "CreateOS transfer command failed.");
    assert_eq!(std::fs::read_dir(host.path()).unwrap().count(), 0, "nothing landed");
    sh(&bed, &config, &lease, "mkdir -p /paperclip-workspace/a-directory/inside");
    let file = host.path().join("f");
    std::fs::write(&file, "f").unwrap();
    let onto_directory = mapping("file", path(&file), "/paperclip-workspace/a-directory");
    let error = bed.sync_in(params(&bed, &config, &lease, vec![onto_directory])).unwrap_err();
    assert_error(&error, ErrorKind::API, "CreateOS transfer command failed.");
    let (_, state) = sh(&bed, &config, &lease, "ls /paperclip-workspace/a-directory; ls /tmp");
    assert_eq!(state.lines().next(), Some("inside"), "{state}");
    assert!(!state.contains("paperclip-createos-transfer-"), "the scratch file is gone: {state}");
}
