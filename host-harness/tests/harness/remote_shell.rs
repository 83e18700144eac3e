//! `exec` behaves like a remote shell, errors say what to do, and the
//! provider's logs reach the harness's: the real binary against a simulator
//! this test process owns.

use crate::common::ConfigDir;
use createos_sim::{SimConfig, Simulator};
use serde_json::{json, Value};
use std::{
    io::Write,
    path::PathBuf,
    process::{Child, Command, Output, Stdio},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
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
        // A journal that holds all of the 3,000,000 bytes below, so these
        // tests never depend on how fast the stream is read on a busy machine.
        Bed::serving(SimConfig { rate_limit: None, journal_bytes: 16 << 20, ..Default::default() }, change)
    }

    /// A bed on a simulator started with `config`, the provider
    /// configuration edited by `change`.
    fn serving(config: SimConfig, change: impl FnOnce(&mut Value)) -> Bed {
        let sim = Simulator::start(config).unwrap();
        let ConfigDir { dir, config } = ConfigDir::new(&sim, change);
        Bed { sim, dir, config }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `host-harness --ledger L ARGS...`, its output piped.
    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_host-harness"));
        command.env_remove("RUST_LOG").arg("--ledger").arg(self.path("ledger.sqlite3")).args(args);
        command.stdout(Stdio::piped()).stderr(Stdio::piped());
        command
    }

    /// `host-harness --ledger L ARGS...` with `stdin` on its standard input
    /// (`None`: /dev/null).
    fn run(&self, args: &[&str], stdin: Option<&[u8]>) -> Output {
        let mut command = self.command(args);
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

    /// The arguments of `exec --config C --lease L EXTRA... -- COMMAND...`.
    fn exec_args<'a>(&'a self, lease: &'a str, extra: &[&'a str], command: &[&'a str]) -> Vec<&'a str> {
        let mut args = vec!["exec", "--config", self.config(), "--lease", lease];
        args.extend_from_slice(extra);
        args.push("--");
        args.extend_from_slice(command);
        args
    }

    /// `exec --config C --lease L EXTRA... -- COMMAND...`.
    fn exec(&self, lease: &str, extra: &[&str], command: &[&str], stdin: Option<&[u8]>) -> Output {
        self.run(&self.exec_args(lease, extra, command), stdin)
    }

    /// Starts `exec ... -- COMMAND...` reading `stdin`, watched by a
    /// [`Watched`] that kills it past [`RSS_LIMIT`].
    fn spawn_exec(&self, lease: &str, extra: &[&str], command: &[&str], stdin: Stdio) -> Watched {
        let child = self.command(&self.exec_args(lease, extra, command)).stdin(stdin).spawn().unwrap();
        Watched::new(child)
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

/// What a harness reading an endless stdin may take: far above its own
/// few tens of MiB, far below what buffering the input takes.
const RSS_LIMIT_KIB: u64 = 200 << 10;

/// A harness run whose peak resident memory a thread watches: past
/// [`RSS_LIMIT_KIB`] it is killed (the test fails, the machine survives).
///
/// The peak is the kernel's own high-water mark of the harness's memory
/// since its exec, read while it lives ([`crate::common::peak_kib`]): it
/// misses nothing between two reads.
struct Watched {
    child: Child,
    killed: Arc<AtomicBool>,
    done: Arc<AtomicBool>,
    peak: Arc<AtomicU64>,
}

impl Watched {
    fn new(child: Child) -> Watched {
        let (killed, done) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
        let peak = Arc::new(AtomicU64::new(0));
        let (pid, was_killed, is_done) = (child.id(), Arc::clone(&killed), Arc::clone(&done));
        let seen = Arc::clone(&peak);
        std::thread::spawn(move || {
            while !is_done.load(Ordering::SeqCst) {
                let peak =
                    crate::common::peak_kib(pid).map(|kib| seen.fetch_max(kib, Ordering::SeqCst).max(kib));
                if peak.is_some_and(|peak| peak > RSS_LIMIT_KIB) {
                    was_killed.store(true, Ordering::SeqCst);
                    // SAFETY: kill(2) on our child, not yet reaped (`done` is unset).
                    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
                    return;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        });
        Watched { child, killed, done, peak }
    }

    /// Bytes the harness has read so far (`/proc/PID/io`'s `rchar`).
    fn read_bytes(&self) -> u64 {
        let io = std::fs::read_to_string(format!("/proc/{}/io", self.child.id())).unwrap_or_default();
        io.lines().find_map(|line| line.strip_prefix("rchar: ")).map_or(0, |n| n.trim().parse().unwrap())
    }

    /// Waits for the harness (two minutes at most: a hang guard) and returns
    /// its exit code, stderr (unless the test took it) and peak resident
    /// memory in KiB (the last `VmHWM` read before it exited).
    fn finish(mut self) -> (Option<i32>, String, u64) {
        crate::common::wait_until("the harness exits", Duration::from_secs(120), || {
            if let Some(kib) = crate::common::peak_kib(self.child.id()) {
                self.peak.fetch_max(kib, Ordering::SeqCst);
            }
            // SAFETY: waitid with WNOWAIT only looks: the child stays unreaped.
            let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
            let flags = libc::WEXITED | libc::WNOWAIT | libc::WNOHANG;
            unsafe { libc::waitid(libc::P_PID, self.child.id(), &mut info, flags) };
            (unsafe { info.si_pid() }) != 0
        });
        let mut stderr = String::new();
        if let Some(pipe) = self.child.stderr.as_mut() {
            std::io::Read::read_to_string(pipe, &mut stderr).unwrap();
        }
        let mut status = 0;
        // SAFETY: reaps our own child, which has exited.
        let reaped = unsafe { libc::waitpid(self.child.id() as i32, &mut status, 0) };
        self.done.store(true, Ordering::SeqCst);
        assert_eq!(reaped, self.child.id() as i32);
        assert!(!self.killed.load(Ordering::SeqCst), "the harness grew past {RSS_LIMIT_KIB} KiB: {stderr}");
        let code = libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status));
        (code, stderr, self.peak.load(Ordering::SeqCst))
    }
}

/// `/dev/zero` as a harness's standard input: endless.
fn endless() -> Stdio {
    Stdio::from(std::fs::File::open("/dev/zero").unwrap())
}

#[test]
fn an_endless_stdin_is_streamed_in_bounded_memory_until_the_timeout() {
    let bed = Bed::new();
    let lease = bed.acquire();
    let run = bed.spawn_exec(&lease, &["--timeout", "3s"], &["sh", "-c", "cat >/dev/null"], endless());
    let (code, stderr, peak) = run.finish();
    assert_eq!(code, Some(124), "the timeout's exit code: {stderr}");
    assert!(peak < RSS_LIMIT_KIB, "peak RSS {peak} KiB");
}

#[test]
fn sigterm_stops_exec_while_an_endless_stdin_is_being_sent() {
    let bed = Bed::new();
    let lease = bed.acquire();
    let run = bed.spawn_exec(&lease, &[], &["sh", "-c", "cat >/dev/null"], endless());
    crate::common::wait_until("the harness reads its stdin", Duration::from_secs(60), || {
        run.read_bytes() > 64 << 20
    });
    crate::common::signal(&run.child, libc::SIGTERM);
    let (code, stderr, peak) = run.finish();
    assert_eq!(code, Some(143), "{stderr}");
    assert!(peak < RSS_LIMIT_KIB, "peak RSS {peak} KiB");
}

#[test]
fn fifty_megabytes_of_stdin_arrive_byte_exact() {
    let bed = Bed::new();
    let lease = bed.acquire();
    let input = binary(50_000_000);
    let file = bed.path("input.bin");
    std::fs::write(&file, &input).unwrap();
    let stdin = Stdio::from(std::fs::File::open(&file).unwrap());
    // What is asserted is the bytes, not the speed: a deadline far beyond a
    // loaded machine's transfer time.
    let mut command = bed.command(&bed.exec_args(&lease, &["--timeout", "30m"], &["sha256sum"]));
    let output = command.stdin(stdin).output().unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let remote = String::from_utf8_lossy(&output.stdout).into_owned();
    assert_eq!(remote.split_whitespace().next(), Some(sha256(&input).as_str()), "{remote}");
}

/// The SHA-256 of `bytes`, in hex.
fn sha256(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    sha2::Sha256::digest(bytes).iter().map(|byte| format!("{byte:02x}")).collect()
}

#[test]
fn five_megabytes_of_random_output_arrive_byte_exact_through_the_1_mib_journal() {
    // CreateOS keeps the last 1 MiB of a process's output: a reader that
    // falls further behind than that loses the stream ("output was
    // evicted"), which on a starved machine this one may. The paced journal
    // holds `head` back instead, so the bytes pass through the 1 MiB journal
    // whatever the reader's speed; how often a real one evicts is measured by
    // benches/exec-bytes.sh. `tee` keeps a copy the sandbox hashes.
    let config = SimConfig { rate_limit: None, pace_output: true, ..Default::default() };
    assert_eq!(config.journal_bytes, 1 << 20, "CreateOS's journal");
    let bed = Bed::serving(config, |_| {});
    let lease = bed.acquire();
    let script = "head -c 5000000 /dev/urandom | tee /tmp/random && sha256sum /tmp/random >&2";
    let output = bed.exec(&lease, &[], &["sh", "-c", script], None);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(output.stdout.len(), 5_000_000);
    let remote = stderr(&output);
    assert_eq!(remote.split_whitespace().next(), Some(sha256(&output.stdout).as_str()), "{remote}");
}

/// A reader of `exec`'s output that stalls does not make the harness hold
/// the output without bound: past `host::OUTPUT_BACKLOG` waiting, the rest
/// is dropped (a warning says so at once), and once the reader is back it
/// gets what came before, then `exec` fails saying why.
#[test]
fn a_stalled_reader_of_execs_output_costs_bounded_memory_and_exec_fails_for_what_was_dropped() {
    use provider_host::host::{OUTPUT_BACKLOG, OUTPUT_DROPPED_MESSAGE};
    use std::io::{BufRead, Read};
    // Paced: the output is held back, never evicted, whatever the reader's speed.
    let bed = Bed::serving(SimConfig { rate_limit: None, pace_output: true, ..Default::default() }, |_| {});
    let lease = bed.acquire();
    let total = (3 * OUTPUT_BACKLOG).to_string();
    let mut run =
        bed.spawn_exec(&lease, &["--timeout", "10m"], &["head", "-c", &total, "/dev/zero"], Stdio::null());
    let (lines, stderr) = (std::sync::mpsc::channel(), run.child.stderr.take().unwrap());
    let sender = lines.0;
    std::thread::spawn(move || {
        std::io::BufReader::new(stderr).lines().map_while(Result::ok).try_for_each(|line| sender.send(line))
    });
    // Nobody reads the output until the harness says it drops the rest.
    let mut said = String::new();
    while !said.contains("the command's output is read too slowly") {
        match lines.1.recv_timeout(Duration::from_secs(120)) {
            Ok(line) => said += &format!("{line}\n"),
            Err(error) => panic!("no warning ({error}):\n{said}"),
        }
    }
    let mut stdout = Vec::new();
    run.child.stdout.take().unwrap().read_to_end(&mut stdout).unwrap();
    let (code, _, peak) = run.finish();
    said.extend(lines.1.iter().map(|line| format!("{line}\n")));
    assert_eq!(code, Some(1), "{said}");
    assert!(said.contains(OUTPUT_DROPPED_MESSAGE), "{said}");
    // What was held when the rest was dropped, give or take a pipe and a chunk.
    let held = OUTPUT_BACKLOG - (1 << 20)..OUTPUT_BACKLOG + (1 << 20);
    assert!(held.contains(&stdout.len()), "{} bytes", stdout.len());
    assert!(stdout.iter().all(|&byte| byte == 0));
    assert!(peak < RSS_LIMIT_KIB, "peak RSS {peak} KiB");
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
