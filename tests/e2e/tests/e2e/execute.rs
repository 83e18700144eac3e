//! The execute hook through the loaded provider against the simulator, with
//! real processes: exact arguments, live output, protocol faults, timeouts,
//! cancellation by release, and the release rule end to end.

use crate::support::{lease_id, Bed};
use createos_sim::{FaultKind, FaultRule, FaultTrigger};
use provider_abi::{ByteSource, EnvVar, ErrorKind, OutputStream, Provider};
use provider_host::wait;
use serde_json::{json, Value};

const SEED_MESSAGE: &str = "CreateOS process cleanup is unconfirmed; destroy this lease before reusing it.";

fn stdout_of(chunks: &[(OutputStream, String)]) -> String {
    chunks
        .iter()
        .filter(|(stream, _)| *stream == OutputStream::Stdout)
        .map(|(_, chunk)| chunk.as_str())
        .collect()
}

fn hostile_values() -> Vec<String> {
    vec![
        "plain".into(),
        "it's 'quoted' \"twice\"".into(),
        "$(touch /tmp/pwned) `id` ${HOME}".into(),
        "new\nline\r\ttab".into(),
        "ÿþ \u{fffd} ü € 🦀".into(),
        "-n".into(),
        "*".into(),
        "x".repeat(20_000),
        String::new(),
    ]
}

#[test]
fn hostile_arguments_variables_and_cwd_arrive_exactly() {
    let bed = Bed::new();
    let config = bed.config(json!({}));
    let lease = bed.acquire(&config);
    let values = hostile_values();
    let mut args: Vec<&str> = vec![
        "-c",
        "printf '%s\\0' \"$PWD\" \"$@\"; printf 'ENV\\0'; printf '%s\\0' \"$HOSTILE_A\" \"$HOSTILE_B\"",
        "argv0",
    ];
    args.extend(values.iter().map(String::as_str));
    let hostile_dir = "/paperclip-workspace/dir with 'quote' and $(x)";
    let mkdir = bed.command(&config, &lease, "/bin/mkdir", &["-p", hostile_dir]);
    assert_eq!(bed.execute(&mkdir).0.unwrap().exit_code.into_option(), Some(0));
    let mut params = bed.command(&config, &lease, "/bin/bash", &args);
    params.cwd = Some(hostile_dir.into()).into();
    params.env = vec![
        EnvVar { name: "HOSTILE_A".into(), value: values[2].as_str().into() },
        EnvVar { name: "HOSTILE_B".into(), value: values[3].as_str().into() },
    ]
    .into();
    let (result, chunks) = bed.execute(&params);
    let result = result.unwrap();
    assert_eq!(result.exit_code.into_option(), Some(0), "{}", result.stderr);
    let mut expected: Vec<&str> = vec![hostile_dir];
    expected.extend(values.iter().map(String::as_str));
    expected.extend(["ENV", values[2].as_str(), values[3].as_str()]);
    let echoed: Vec<&str> = result.stdout.split_terminator('\0').collect();
    assert_eq!(echoed, expected);
    assert_eq!(stdout_of(&chunks), result.stdout.as_str(), "the sink saw every byte exactly once");
    assert!(!std::path::Path::new("/tmp/pwned").exists());
}

#[test]
fn invalid_variable_names_are_refused_before_any_request() {
    let bed = Bed::new();
    let config = bed.config(json!({}));
    let lease = bed.acquire(&config);
    let before = bed.ledger().requests.len();
    for name in ["1X", "A-B", "A B", "", "X=Y", "$(id)"] {
        let mut params = bed.command(&config, &lease, "/bin/true", &[]);
        params.env = vec![EnvVar { name: name.into(), value: "v".into() }].into();
        let error = bed.execute(&params).0.unwrap_err();
        assert_eq!(error.kind, ErrorKind::INVALID_INPUT, "{name:?}");
    }
    assert_eq!(bed.ledger().requests.len(), before);
}

#[test]
fn stdin_is_staged_as_a_file_and_never_sent_in_the_process_request() {
    let bed = Bed::new();
    let config = bed.config(json!({}));
    let lease = bed.acquire(&config);
    let secret_input = "stdin-only-content-7f3a9 'with quotes'\nand a second line\n";
    let params = bed.command(&config, &lease, "/bin/cat", &[]);
    let (result, _) = bed.execute_bytes(&params, ByteSource::from_bytes(secret_input.as_bytes().to_vec()));
    assert_eq!(result.unwrap().stdout, secret_input);
    let ledger = bed.ledger();
    assert!(!ledger.processes.is_empty());
    for process in &ledger.processes {
        assert!(!process.request_body.contains("stdin-only-content"), "{}", process.request_body);
        let body: Value = serde_json::from_str(&process.request_body).unwrap();
        assert!(body.get("env").is_none(), "env is never sent");
    }
    assert_eq!(ledger.count("PUT", "/v1/sandboxes/*/files"), 1, "the staged stdin");
    // The staged file was removed afterwards.
    let check = bed.command(&config, &lease, "/bin/sh", &["-c", "ls -A /tmp | wc -l"]);
    assert_eq!(bed.execute(&check).0.unwrap().stdout.trim(), "0");
}

#[test]
fn output_streams_live_and_utf8_split_across_frames_decodes() {
    let bed = Bed::new();
    let config = bed.config(json!({}));
    let lease = bed.acquire(&config);
    let script = "printf 'a\\342'; sleep 0.2; printf '\\202\\254b'; sleep 0.2; printf 'err' >&2";
    let params = bed.command(&config, &lease, "/bin/sh", &["-c", script]);
    let (result, chunks) = bed.execute_bytes(&params, ByteSource::empty());
    let result = result.unwrap();
    assert_eq!(result.stdout, "a€b");
    assert_eq!(result.stderr, "err");
    assert!(chunks.len() >= 3, "chunks arrived as the command produced them: {chunks:?}");
    let stdout: Vec<u8> = chunks
        .iter()
        .filter(|(stream, _)| *stream == OutputStream::Stdout)
        .flat_map(|(_, bytes)| bytes.clone())
        .collect();
    assert_eq!(stdout, "a€b".as_bytes(), "the raw bytes, a character split across chunks");
}

#[test]
fn a_cut_stream_reconnects_from_its_cursor_without_duplicates() {
    let bed = Bed::new();
    let config = bed.config(json!({}));
    let lease = bed.acquire(&config);
    bed.sim.add_fault(FaultRule::new(
        "GET /v1/sandboxes/*/processes/*/connect",
        FaultTrigger::nth(1),
        FaultKind::CutStream,
    ));
    let script = "for i in 1 2 3 4 5; do echo line-$i; sleep 0.05; done";
    let (result, chunks) = bed.execute(&bed.command(&config, &lease, "/bin/sh", &["-c", script]));
    let result = result.unwrap();
    let expected: String = (1..=5).map(|i| format!("line-{i}\n")).collect();
    assert_eq!(result.stdout, expected);
    assert_eq!(stdout_of(&chunks), expected);
    assert_eq!(bed.ledger().count("GET", "/v1/sandboxes/*/processes/*/connect"), 2);
}

#[test]
fn protocol_faults_fail_the_command_and_terminate_its_tree() {
    let cases = [
        ("evicted output", FaultKind::Status(410), FaultTrigger::nth(1)),
        ("connect keeps failing", FaultKind::Status(502), FaultTrigger::from_nth(1)),
    ];
    for (case, kind, trigger) in cases {
        let bed = Bed::new();
        let config = bed.config(json!({}));
        let lease = bed.acquire(&config);
        bed.sim.add_fault(FaultRule::new("GET /v1/sandboxes/*/processes/*/connect", trigger, kind));
        let (result, _) = bed.execute(&bed.command(&config, &lease, "/bin/sleep", &["30"]));
        let error = result.unwrap_err();
        assert!(error.message.starts_with("CreateOS"), "{case}: {error}");
        let ledger = bed.ledger();
        assert_eq!(
            ledger.count("DELETE", "/v1/sandboxes/*/processes/*"),
            1,
            "{case}: the tree was terminated"
        );
        assert!(
            ledger.count("GET", "/v1/sandboxes/*/processes/*/connect") <= 4,
            "{case}: at most 3 reconnects"
        );
    }
}

#[test]
fn a_timeout_returns_partial_output_and_kills_the_tree() {
    let bed = Bed::new();
    let config = bed.config(json!({}));
    let lease = bed.acquire(&config);
    let mut params = bed.command(&config, &lease, "/bin/sh", &["-c", "echo partial; sleep 30 & sleep 30"]);
    params.timeout_ms = Some(1_500).into();
    let (result, chunks) = bed.execute(&params);
    let result = result.unwrap();
    assert!(result.timed_out);
    assert_eq!(result.exit_code.into_option(), None);
    assert_eq!(result.stdout, "partial\n");
    assert_eq!(stdout_of(&chunks), "partial\n");
    assert_eq!(bed.ledger().count("DELETE", "/v1/sandboxes/*/processes/*"), 1);
    // The lease is still usable: its tree was confirmed gone.
    let (again, _) = bed.execute(&bed.command(&config, &lease, "/bin/echo", &["ok"]));
    assert_eq!(again.unwrap().stdout, "ok\n");
}

#[test]
fn release_during_a_command_cancels_it_and_kills_the_tree_before_pausing() {
    let bed = Bed::new();
    let config = bed.config(json!({"reuseLease": true}));
    let lease = bed.acquire(&config);
    std::thread::scope(|scope| {
        let running = scope.spawn(|| bed.execute(&bed.command(&config, &lease, "/bin/sleep", &["30"])).0);
        bed.wait_for_ledger("the command's process creation", |ledger| {
            ledger.count("POST", "/v1/sandboxes/*/processes") == 1
        });
        wait(bed.provider.release_lease(bed.lease_params(&config, &lease))).unwrap();
        let error = running.join().unwrap().unwrap_err();
        assert_eq!(
            (error.kind, error.message.as_str()),
            (ErrorKind::CANCELLED, "CreateOS command was cancelled.")
        );
    });
    let ledger = bed.ledger();
    let position = |method: &str, pattern: &str| {
        ledger
            .requests
            .iter()
            .position(|r| r.method == method && createos_sim::path_matches(pattern, &r.path))
    };
    let killed = position("DELETE", "/v1/sandboxes/*/processes/*").expect("the tree was terminated");
    let paused = position("POST", "/v1/sandboxes/*/pause").expect("the lease was paused");
    assert!(killed < paused, "the tree is gone before the pause is sent");
    assert_eq!(bed.status(&lease_id(&lease)), "paused");
}

#[test]
fn the_seed_scenario_end_to_end() {
    let bed = Bed::new();
    let config = bed.config(json!({"reuseLease": true}));
    let lease = bed.acquire(&config);
    let params = bed.lease_params(&config, &lease);
    // Process creation fails ambiguously: the process may be running.
    bed.sim.add_fault(FaultRule::new(
        "POST /v1/sandboxes/*/processes",
        FaultTrigger::nth(1),
        FaultKind::Status(503),
    ));
    let error = bed.execute(&bed.command(&config, &lease, "/bin/true", &[])).0.unwrap_err();
    assert_eq!(error.kind, ErrorKind::CREATION_UNCONFIRMED);
    assert_eq!(
        error.message,
        "CreateOS process creation could not be confirmed; destroy the lease before reusing it."
    );
    // Execute on the unconfirmed lease is refused before any request.
    let before = bed.ledger().requests.len();
    let refused = bed.execute(&bed.command(&config, &lease, "/bin/true", &[])).0.unwrap_err();
    assert_eq!(refused.kind, ErrorKind::CLEANUP_UNCONFIRMED);
    assert_eq!(bed.ledger().requests.len(), before);
    // Release for reuse fails with the release rule's error and pauses nothing.
    let error = wait(bed.provider.release_lease(params.clone())).unwrap_err();
    assert_eq!((error.kind, error.message.as_str()), (ErrorKind::CLEANUP_UNCONFIRMED, SEED_MESSAGE));
    assert_eq!(bed.ledger().count("POST", "/v1/sandboxes/*/pause"), 0);
    // Destroy deletes the sandbox and clears the flag.
    wait(bed.provider.destroy_lease(params.clone())).unwrap();
    assert!(bed.ledger().leaked().is_empty());
    assert!(!wait(bed.provider.inspect_lease(params.clone())).unwrap().unconfirmed);
    // A later lease on the same environment works.
    let fresh = bed.acquire(&config);
    let (result, _) = bed.execute(&bed.command(&config, &fresh, "/bin/echo", &["fresh"]));
    assert_eq!(result.unwrap().stdout, "fresh\n");
    wait(bed.provider.destroy_lease(bed.lease_params(&config, &fresh))).unwrap();
    assert!(bed.ledger().leaked().is_empty());
}
