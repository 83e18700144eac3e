//! `exec` behaves like a remote shell, errors say what to do, and the
//! provider's logs reach the harness's: the real binary against a simulator
//! this test process owns (issue 11).

use createos_sim::{SimConfig, Simulator};
use serde_json::{json, Value};
use std::{
    io::Write,
    path::PathBuf,
    process::{Command, Output, Stdio},
};

struct Bed {
    sim: Simulator,
    dir: tempfile::TempDir,
    config: PathBuf,
}

impl Bed {
    fn new() -> Bed {
        Bed::with(|_| {})
    }

    /// A bed whose provider configuration `change` edits first.
    fn with(change: impl FnOnce(&mut Value)) -> Bed {
        // A journal that holds all of the 3,000,000 bytes below, so the test
        // never depends on how fast the stream is read on a busy machine.
        Bed::serving(SimConfig { journal_bytes: 16 << 20, ..Default::default() }, change)
    }

    /// A bed on a simulator started with `config` (its rate limit off).
    fn serving(config: SimConfig, change: impl FnOnce(&mut Value)) -> Bed {
        let sim = Simulator::start(SimConfig { rate_limit: None, ..config }).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let mut provider = sim.provider_config(true);
        provider["requestsPerMinute"] = json!(100_000);
        change(&mut provider);
        let config = dir.path().join("config.json");
        let file = json!({"companyId": "acme", "environmentId": "dev", "config": provider});
        std::fs::write(&config, file.to_string()).unwrap();
        Bed { sim, dir, config }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `host-harness --ledger L ARGS...` with `stdin` on its standard input
    /// (`None`: /dev/null).
    fn run(&self, args: &[&str], stdin: Option<&[u8]>) -> Output {
        let mut command = Command::new(env!("CARGO_BIN_EXE_host-harness"));
        command.env_remove("RUST_LOG").arg("--ledger").arg(self.path("ledger.sqlite3")).args(args);
        command.stdout(Stdio::piped()).stderr(Stdio::piped());
        command.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() });
        let mut child = command.spawn().expect("run host-harness");
        if let Some(bytes) = stdin {
            // A command refused up front exits without reading its stdin.
            let _ = child.stdin.take().unwrap().write_all(bytes);
        }
        child.wait_with_output().unwrap()
    }

    fn config(&self) -> &str {
        self.config.to_str().unwrap()
    }

    /// Acquires a lease into `lease.json`; returns its path.
    fn acquire(&self) -> String {
        let output = self.run(&["acquire", "--config", self.config()], None);
        assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
        let path = self.path("lease.json");
        std::fs::write(&path, &output.stdout).unwrap();
        path.to_str().unwrap().to_owned()
    }

    /// `exec --config C --lease L EXTRA... -- COMMAND...`.
    fn exec(&self, lease: &str, extra: &[&str], command: &[&str], stdin: Option<&[u8]>) -> Output {
        let mut args = vec!["exec", "--config", self.config(), "--lease", lease];
        args.extend_from_slice(extra);
        args.push("--");
        args.extend_from_slice(command);
        self.run(&args, stdin)
    }

    fn requests(&self) -> usize {
        self.sim.ledger().requests.len()
    }
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Bytes that are not text: the same every run.
fn binary(len: usize) -> Vec<u8> {
    (0..len as u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8).collect()
}

#[test]
fn exec_output_is_byte_exact() {
    let bed = Bed::new();
    let lease = bed.acquire();
    let printed = bed.exec(&lease, &[], &["printf", r"\377\376A\000B\n"], None);
    assert_eq!(printed.status.code(), Some(0), "{}", stderr(&printed));
    assert_eq!(printed.stdout, b"\xff\xfeA\x00B\n");

    let random = bed.exec(&lease, &[], &["head", "-c", "3000000", "/dev/urandom"], None);
    assert_eq!(random.status.code(), Some(0), "{}", stderr(&random));
    assert_eq!(random.stdout.len(), 3_000_000, "3,000,000 random bytes come out as 3,000,000");

    let input = binary(300_000);
    let file = bed.path("input.bin");
    std::fs::write(&file, &input).unwrap();
    let echoed = bed.exec(&lease, &["--stdin", file.to_str().unwrap()], &["cat"], None);
    assert_eq!(echoed.status.code(), Some(0), "{}", stderr(&echoed));
    assert!(echoed.stdout == input, "binary stdin comes back byte for byte through cat");

    let to_stderr = bed.exec(&lease, &[], &["sh", "-c", r"printf '\377x' >&2"], None);
    assert_eq!(to_stderr.stderr, b"\xffx", "standard error is byte-exact too");
}

/// The SHA-256 of `bytes`, in hex.
fn sha256(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    sha2::Sha256::digest(bytes).iter().map(|byte| format!("{byte:02x}")).collect()
}

#[test]
fn five_megabytes_of_random_output_arrive_byte_exact_through_the_default_journal() {
    // The simulator keeps CreateOS's 1 MiB of output per process: the
    // harness must read binary output as fast as `cat` of a file writes it.
    let bed = Bed::serving(SimConfig::default(), |_| {});
    let lease = bed.acquire();
    let script = "head -c 5000000 /dev/urandom >/tmp/random && sha256sum /tmp/random >&2 && cat /tmp/random";
    let output = bed.exec(&lease, &[], &["sh", "-c", script], None);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(output.stdout.len(), 5_000_000);
    let remote = stderr(&output);
    assert_eq!(remote.split_whitespace().next(), Some(sha256(&output.stdout).as_str()), "{remote}");
}

#[test]
fn exec_forwards_piped_stdin_and_takes_env_cwd_and_timeout() {
    let bed = Bed::new();
    let lease = bed.acquire();
    let piped = bed.exec(&lease, &[], &["cat"], Some(b"hello\n"));
    assert_eq!(
        (piped.status.code(), piped.stdout.as_slice()),
        (Some(0), &b"hello\n"[..]),
        "{}",
        stderr(&piped)
    );

    let shaped = bed.exec(
        &lease,
        &["--env", "GREETING=hi there", "--env", "EMPTY=", "--cwd", "/tmp"],
        &["sh", "-c", r#"printf '%s|%s|' "$GREETING" "${EMPTY-unset}"; pwd"#],
        None,
    );
    assert_eq!(String::from_utf8_lossy(&shaped.stdout), "hi there||/tmp\n", "{}", stderr(&shaped));

    let exited = bed.exec(&lease, &[], &["sh", "-c", "exit 7"], None);
    assert_eq!(exited.status.code(), Some(7), "the command's own exit code");

    let timed_out = bed.exec(&lease, &["--timeout", "1s"], &["sleep", "30"], None);
    assert_eq!(timed_out.status.code(), Some(124), "{}", stderr(&timed_out));
}

#[test]
fn bad_exec_options_are_refused_before_any_request() {
    let bed = Bed::new();
    let lease = bed.acquire();
    let before = bed.requests();
    for (options, says) in [
        (["--env", "1BAD=x"], "`1BAD` is not a variable name"),
        (["--env", "NOVALUE"], "is not K=V"),
        (["--timeout", "soon"], "is not a duration like 30s"),
    ] {
        let output = bed.exec(&lease, &options, &["true"], None);
        assert_eq!(output.status.code(), Some(2), "{options:?}");
        assert!(stderr(&output).contains(says), "{options:?}: {}", stderr(&output));
    }
    assert_eq!(bed.requests(), before, "nothing was sent");
}

#[test]
fn config_and_lease_both_from_stdin_are_refused_up_front() {
    let bed = Bed::new();
    for command in ["exec", "resume", "release", "destroy"] {
        let mut args = vec![command, "--config", "-", "--lease", "-"];
        if command == "exec" {
            args.extend(["--", "true"]);
        }
        let output = bed.run(&args, Some(b"{}"));
        assert_eq!(output.status.code(), Some(2), "{command}");
        assert_eq!(
            stderr(&output),
            "error: --config - and --lease - cannot both read stdin; give one of them as a file\n",
            "{command}"
        );
    }
}

#[test]
fn exec_on_a_paused_or_destroyed_lease_says_what_to_do() {
    let bed = Bed::new();
    let lease = bed.acquire();
    let released = bed.run(&["release", "--config", bed.config(), "--lease", &lease], None);
    assert_eq!(released.status.code(), Some(0), "{}", stderr(&released));
    let paused = bed.exec(&lease, &[], &["true"], None);
    assert_eq!(paused.status.code(), Some(1));
    assert_eq!(
        stderr(&paused),
        "error: CreateOS sandbox is paused (HTTP 409 on process creation); resume the lease before running commands in it. [api; HTTP 409; process creation]\n"
    );

    let destroyed = bed.run(&["destroy", "--config", bed.config(), "--lease", &lease], None);
    assert_eq!(destroyed.status.code(), Some(0), "{}", stderr(&destroyed));
    let gone = bed.exec(&lease, &[], &["true"], None);
    assert_eq!(gone.status.code(), Some(1));
    assert!(
        stderr(&gone).starts_with("error: CreateOS sandbox no longer exists (HTTP 404 on process creation); the lease was destroyed or expired, acquire a new one."),
        "{}",
        stderr(&gone)
    );
    assert_eq!(stderr(&gone).lines().count(), 1);
}

#[test]
fn a_rejected_api_key_is_said_so_with_a_kind_of_its_own() {
    let bed = Bed::with(|config| config["apiKey"] = json!("wrong-key-4f1d"));
    let output = bed.run(&["acquire", "--config", bed.config()], None);
    assert_eq!(output.status.code(), Some(1));
    let text = stderr(&output);
    assert!(text.starts_with("error: CreateOS rejected the API key (HTTP 401)."), "{text}");
    assert!(text.contains("unauthorized"), "the kind is named: {text}");
    assert!(!text.contains("wrong-key-4f1d"), "{text}");
    let json = bed.run(&["acquire", "--json", "--config", bed.config()], None);
    let line: Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(line["error"]["kind"], "unauthorized", "{line}");
}

#[test]
fn the_providers_logs_reach_the_harness_at_its_level() {
    let bed = Bed::new();
    let quiet = bed.run(&["lifecycle", "--config", bed.config()], None);
    assert_eq!(quiet.status.code(), Some(0), "{}", stderr(&quiet));
    assert!(!stderr(&quiet).contains("createos_provider"), "warn level: {}", stderr(&quiet));

    let verbose = bed.run(&["-v", "lifecycle", "--config", bed.config()], None);
    let text = stderr(&verbose);
    let created = text.lines().find(|line| line.contains("CreateOS sandbox created")).unwrap_or_else(|| {
        panic!("-v shows the provider's INFO events: {text}");
    });
    assert!(created.contains("INFO") && created.contains("createos_provider::lease"), "{created}");
    assert!(created.contains("shape=s-1vcpu-1gb"), "its fields: {created}");
    assert!(!text.contains('\x1b'), "no colours when stderr is not a terminal: {text:?}");
    assert!(!text.contains(bed.sim.api_key()), "never the API key in a log line");

    let json = bed.run(&["-v", "--log-format", "json", "lifecycle", "--config", bed.config()], None);
    let events: Vec<Value> = String::from_utf8_lossy(&json.stderr)
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect();
    let event = events
        .iter()
        .find(|event| event["fields"]["message"] == "CreateOS sandbox created")
        .expect("the provider's event as JSON");
    assert_eq!(event["target"], "createos_provider::lease");
    assert_eq!(event["level"], "INFO");
    assert_eq!(event["fields"]["shape"], "s-1vcpu-1gb");
}

/// The shared library cargo built for fixture crate `name` (`fixture_v1_2`).
fn fixture(name: &str) -> PathBuf {
    let deps = std::env::current_exe().unwrap().parent().unwrap().to_path_buf();
    deps.join(provider_abi::library_file_name(name))
}

#[test]
fn older_providers_still_deliver_text_and_only_1_3_forwards_logs() {
    for (library, logs) in [("fixture_v1_2", false), ("fixture_v1_3", true)] {
        let dir = tempfile::tempdir().unwrap();
        let plugin = fixture(library);
        let run = |args: &[&str]| {
            Command::new(env!("CARGO_BIN_EXE_host-harness"))
                .env_remove("RUST_LOG")
                .arg("--plugin")
                .arg(&plugin)
                .arg("--ledger")
                .arg(dir.path().join("ledger.sqlite3"))
                .args(args)
                .stdin(Stdio::null())
                .output()
                .unwrap()
        };
        let config = dir.path().join("config.json");
        std::fs::write(&config, r#"{"passphrase": "p"}"#).unwrap();
        let config = config.to_str().unwrap();
        let acquired = run(&["acquire", "--config", config]);
        assert_eq!(acquired.status.code(), Some(0), "{library}: {}", stderr(&acquired));
        let lease = dir.path().join("lease.json");
        std::fs::write(&lease, &acquired.stdout).unwrap();
        let lease = lease.to_str().unwrap();
        let output = run(&[
            "-v",
            "exec",
            "--config",
            config,
            "--lease",
            lease,
            "--",
            "/bin/sh",
            "-c",
            "printf 'hi\\n'",
        ]);
        assert_eq!((output.status.code(), output.stdout.as_slice()), (Some(0), &b"hi\n"[..]), "{library}");
        assert_eq!(stderr(&output).contains("fixture set up"), logs, "{library}: {}", stderr(&output));
    }
}
