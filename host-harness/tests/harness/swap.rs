//! Hot swap in a running harness, through the real binary: `soak --swap-to`
//! and `SIGHUP` (the library at the `--plugin` path, re-checked, and pinned
//! by the lock file when one exists). Synchronised on the harness's output.

use e2e::library;
use serde_json::Value;
use std::{
    io::{BufRead, BufReader, Read},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc::{self, Receiver},
};

/// A plugin directory holding a copy of the CreateOS provider, and a ledger.
struct Bed {
    dir: tempfile::TempDir,
}

impl Bed {
    fn new() -> Bed {
        let bed = Bed { dir: tempfile::tempdir().unwrap() };
        bed.drop_build(&library("createos_provider"));
        bed
    }

    fn plugin(&self) -> PathBuf {
        self.dir.path().join(provider_host::loader::library_file_name("createos_provider"))
    }

    /// Puts a build at the plugin path as a package manager does: written
    /// beside it, renamed over it.
    fn drop_build(&self, build: &Path) {
        let incoming = self.dir.path().join("incoming.so");
        std::fs::copy(build, &incoming).unwrap();
        std::fs::rename(&incoming, self.plugin()).unwrap();
    }

    fn harness(&self) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_host-harness"));
        command
            .arg("--plugin")
            .arg(self.plugin())
            .arg("--ledger")
            .arg(self.dir.path().join("ledger.sqlite3"));
        command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        command
    }
}

/// A running harness whose output lines arrive on channels.
struct Running {
    child: Child,
    stdout: Receiver<String>,
    stderr: Receiver<String>,
}

impl Running {
    fn spawn(mut command: Command) -> Running {
        let mut child = command.spawn().unwrap();
        let lines = |stream: Box<dyn Read + Send>| {
            let (sender, receiver) = mpsc::channel();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    let _ = sender.send(line);
                }
            });
            receiver
        };
        let stdout = lines(Box::new(child.stdout.take().unwrap()));
        let stderr = lines(Box::new(child.stderr.take().unwrap()));
        Running { child, stdout, stderr }
    }

    fn signal(&self, signal: i32) {
        // SAFETY: `kill` only sends a signal to our own child process.
        assert_eq!(unsafe { libc::kill(self.child.id() as i32, signal) }, 0);
    }

    /// The next stderr line containing `text` (the lines before it are
    /// returned too); panics when none comes within a minute (a guard
    /// against a hung harness, not a measurement).
    fn stderr_until(&self, text: &str) -> String {
        let mut seen = String::new();
        loop {
            match self.stderr.recv_timeout(std::time::Duration::from_secs(60)) {
                Ok(line) => {
                    seen.push_str(&line);
                    seen.push('\n');
                    if line.contains(text) {
                        return seen;
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    panic!("the harness said no `{text}` within a minute:\n{seen}")
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    panic!("the harness ended before saying `{text}`:\n{seen}")
                }
            }
        }
    }

    /// Stops the soak (SIGINT) and returns its exit code and summary.
    fn interrupt(self) -> (Option<i32>, Value) {
        self.stop(libc::SIGINT)
    }

    /// Stops the soak with `signal` and returns its exit code and summary.
    fn stop(mut self, signal: i32) -> (Option<i32>, Value) {
        self.signal(signal);
        let status = self.child.wait().unwrap();
        let summary = self
            .stdout
            .iter()
            .filter_map(|line| serde_json::from_str::<Value>(&line).ok())
            .find(|line| line["summary"] == true)
            .expect("a summary");
        (status.code(), summary)
    }
}

impl Drop for Running {
    /// Ends a harness a failed test leaves running.
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A soak long enough to be running whatever the machine's speed: it is
/// stopped by SIGINT once the test has seen what it waits for.
fn endless_soak(bed: &Bed) -> Running {
    let mut command = bed.harness();
    command.args(["soak", "--leases", "1000000", "--concurrency", "2", "--no-rate-limit", "--json"]);
    let running = Running::spawn(command);
    // A finished lifecycle: the soak (and its SIGHUP handler) is running.
    running.stdout.recv().expect("a first lifecycle");
    running
}

#[test]
fn a_sighup_after_a_new_build_is_dropped_at_the_plugin_path_swaps_to_it() {
    let bed = Bed::new();
    let soak = endless_soak(&bed);
    bed.drop_build(&library("createos_provider"));
    soak.signal(libc::SIGHUP);
    let said = soak.stderr_until("SIGHUP:");
    assert!(said.contains("SIGHUP: swapped provider version"), "{said}");
    let (code, summary) = soak.interrupt();
    assert_eq!(code, Some(130), "{summary}");
    assert_eq!(summary["swaps"], 1, "{summary}");
    assert_eq!(summary["swapsRefused"], 0, "{summary}");
    assert_eq!(summary["leaked"], 0, "{summary}");
    assert_eq!(summary["unconfirmedReused"], 0, "{summary}");
}

#[test]
fn a_sighup_to_an_unpinned_library_is_refused_when_a_lock_file_exists() {
    let bed = Bed::new();
    let pinned = bed.harness().args(["lock", "add"]).arg(bed.plugin()).output().unwrap();
    assert!(pinned.status.success(), "{}", String::from_utf8_lossy(&pinned.stderr));
    let soak = endless_soak(&bed);
    bed.drop_build(&library("fixture_frozen")); // not pinned (and another provider)
    soak.signal(libc::SIGHUP);
    let said = soak.stderr_until("SIGHUP:");
    let line = said.lines().find(|line| line.starts_with("SIGHUP:")).unwrap();
    assert!(line.contains("swap refused") && line.contains("is not pinned in"), "{line}");
    assert!(line.ends_with("the active version stays"), "{line}");
    let (code, summary) = soak.interrupt();
    assert_eq!(code, Some(130), "{summary}");
    assert_eq!(
        (summary["swaps"].as_u64(), summary["swapsRefused"].as_u64()),
        (Some(0), Some(1)),
        "{summary}"
    );
}

#[test]
fn soak_swaps_every_n_lifecycles_alternating_between_two_builds() {
    let bed = Bed::new();
    let other =
        bed.dir.path().join("other").join(provider_host::loader::library_file_name("createos_provider"));
    std::fs::create_dir(other.parent().unwrap()).unwrap();
    std::fs::copy(library("createos_provider"), &other).unwrap();
    let output = bed
        .harness()
        .args([
            "soak",
            "--leases",
            "40",
            "--concurrency",
            "8",
            "--no-rate-limit",
            "--json",
            "--swap-every",
            "10",
        ])
        .arg("--swap-to")
        .arg(&other)
        .arg("--swap-to")
        .arg(bed.plugin())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let summary: Value =
        serde_json::from_str(String::from_utf8_lossy(&output.stdout).lines().last().unwrap()).unwrap();
    assert_eq!(summary["swaps"], 4, "{summary}");
    assert_eq!(summary["drainedPerSwap"].as_array().unwrap().len(), 4, "{summary}");
    assert!(summary["longestSwapWaitMs"].as_f64().unwrap() >= 0.0, "{summary}");
    assert_eq!(summary["succeeded"], 40, "{summary}");
    assert_eq!(summary["leaked"], 0, "{summary}");
    assert_eq!(stderr.matches("--swap-to: swapped provider version").count(), 4, "{stderr}");
}

#[test]
fn swap_to_with_an_isolated_provider_is_a_usage_error() {
    let bed = Bed::new();
    let output = bed
        .harness()
        .args(["--isolate", "soak", "--leases", "1", "--swap-to"])
        .arg(bed.plugin())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--swap-to needs the provider in this process"), "{stderr}");
}

#[test]
fn a_sighup_to_a_fifo_at_the_plugin_path_is_refused_and_the_soak_goes_on() {
    let bed = Bed::new();
    let soak = endless_soak(&bed);
    std::fs::remove_file(bed.plugin()).unwrap();
    let fifo = std::ffi::CString::new(bed.plugin().as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: `fifo` is a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
    soak.signal(libc::SIGHUP);
    let said = soak.stderr_until("SIGHUP:");
    let line = said.lines().find(|line| line.starts_with("SIGHUP:")).unwrap();
    assert!(line.contains("swap refused") && line.contains("not a regular file but a FIFO"), "{line}");
    assert!(line.ends_with("the active version stays"), "{line}");
    // The soak goes on, and a later SIGHUP swaps once a library is back.
    soak.stdout.recv().expect("a lifecycle after the refusal");
    std::fs::remove_file(bed.plugin()).unwrap();
    bed.drop_build(&library("createos_provider"));
    soak.signal(libc::SIGHUP);
    let said = soak.stderr_until("SIGHUP:");
    assert!(said.contains("SIGHUP: swapped provider version"), "{said}");
    // And SIGTERM still ends it, with its summary.
    let (code, summary) = soak.stop(libc::SIGTERM);
    assert_eq!(code, Some(143), "{summary}");
    assert_eq!(
        (summary["swaps"].as_u64(), summary["swapsRefused"].as_u64()),
        (Some(1), Some(1)),
        "{summary}"
    );
    assert_eq!(summary["leaked"], 0, "{summary}");
}

#[test]
fn soak_checks_every_swap_to_library_before_its_first_lifecycle() {
    let bed = Bed::new();
    let not_a_provider = bed.dir.path().join("notes.so");
    std::fs::write(&not_a_provider, "not a library").unwrap();
    let missing = bed.dir.path().join("missing.so");
    for (library, says) in [
        (missing.as_path(), "missing.so"),
        (not_a_provider.as_path(), "notes.so"),
        (library("fixture_provider").as_path(), "cannot swap provider `createos` for a library of provider"),
    ] {
        let output = bed
            .harness()
            .args(["soak", "--leases", "4", "--no-rate-limit", "--swap-every", "1", "--swap-to"])
            .arg(library)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{stderr}");
        let lines: Vec<&str> = stderr.lines().filter(|line| !line.starts_with("created ledger")).collect();
        assert_eq!(lines.len(), 1, "{stderr}");
        assert!(lines[0].starts_with("error: --swap-to ") && lines[0].contains(says), "{stderr}");
        assert!(!lines[0].contains("the active version stays"), "{stderr}");
        assert!(output.stdout.is_empty(), "no lifecycle ran: {}", String::from_utf8_lossy(&output.stdout));
    }
}
