//! What the harness opens: exactly the provider file it checked (never one
//! the dynamic loader's search path finds instead), only regular files as
//! providers, and configuration and lease files of bounded weight.

use std::{
    ffi::CString,
    io::Write,
    os::unix::ffi::OsStrExt,
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    sync::mpsc,
    time::Duration,
};

/// How long a harness run may take before the test calls it hung: a guard
/// against a test that never ends, far above any normal run.
const HANG_GUARD: Duration = Duration::from_secs(120);

/// Runs the harness with `args` in `dir` (its ledger, state and working
/// directory), with `stdin` and extra environment; kills it and fails the
/// test if it has not ended within [`HANG_GUARD`].
fn harness_in(dir: &Path, args: &[&str], env: &[(&str, &Path)], stdin: &[u8]) -> Output {
    // The ledger's directory exists, so stderr holds only what is asserted.
    std::fs::create_dir_all(dir.join("state/host-harness")).unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_host-harness"));
    command
        .current_dir(dir)
        .env("XDG_STATE_HOME", dir.join("state"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (name, value) in env {
        command.env(name, value);
    }
    let mut child = command.spawn().expect("run host-harness");
    let pid = child.id();
    let mut input = child.stdin.take().unwrap();
    let stdin = stdin.to_vec();
    // The harness may refuse before reading all of stdin (a closed pipe then).
    let writer = std::thread::spawn(move || drop(input.write_all(&stdin)));
    let (done, finished) = mpsc::channel();
    std::thread::spawn(move || drop(done.send(child.wait_with_output())));
    let output = match finished.recv_timeout(HANG_GUARD) {
        Ok(output) => output.unwrap(),
        Err(_) => {
            // SAFETY: kill(2) on the child's pid, which it keeps until reaped.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            panic!("host-harness {args:?} hung");
        }
    };
    writer.join().unwrap();
    output
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Asserts the run failed with a usage error (exit 2) of one line naming `file`
/// and containing `words`.
fn assert_refused(output: &Output, file: &str, words: &str) {
    let text = stderr(output);
    assert_eq!(output.status.code(), Some(2), "{text}");
    assert_eq!(text.lines().count(), 1, "one line: {text}");
    assert!(text.contains(file) && text.contains(words), "{text}");
}

/// The directory cargo builds shared libraries into (beside this test binary).
fn deps_dir() -> PathBuf {
    std::env::current_exe().unwrap().parent().unwrap().to_path_buf()
}

fn mkfifo(path: &Path) {
    let name = CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: `name` is a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0, "mkfifo {}", path.display());
}

#[test]
fn a_bare_plugin_name_loads_the_file_in_the_current_directory_not_one_on_the_search_path() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    let search = dir.path().join("search");
    std::fs::create_dir_all(&work).unwrap();
    std::fs::create_dir_all(&search).unwrap();
    let name = "renamed-provider.so";
    std::fs::copy(
        deps_dir().join(provider_host::loader::library_file_name("createos_provider")),
        work.join(name),
    )
    .unwrap();
    std::fs::copy(
        deps_dir().join(provider_host::loader::library_file_name("fixture_frozen")),
        search.join(name),
    )
    .unwrap();

    let output = harness_in(&work, &["--plugin", name, "inspect"], &[("LD_LIBRARY_PATH", &search)], b"");
    let text = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(text.contains("(createos)"), "the CreateOS provider in the working directory: {text}");
    let loaded = work.canonicalize().unwrap().join(name);
    assert!(text.contains(&format!("loaded from {}", loaded.display())), "{text}");

    // The same name where only the search path has it: not found, not searched.
    let elsewhere = dir.path().join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    let output = harness_in(&elsewhere, &["--plugin", name, "health"], &[("LD_LIBRARY_PATH", &search)], b"");
    assert_refused(&output, name, "No such file");
}

#[test]
fn a_fifo_as_plugin_is_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("provider.so");
    mkfifo(&fifo);
    let output = harness_in(dir.path(), &["--plugin", fifo.to_str().unwrap(), "health"], &[], b"");
    assert_refused(&output, fifo.to_str().unwrap(), "not a regular file but a FIFO");
    let output = harness_in(dir.path(), &["--plugin", dir.path().to_str().unwrap(), "health"], &[], b"");
    assert_refused(&output, dir.path().to_str().unwrap(), "not a regular file but a directory");
}

#[test]
fn dev_zero_as_config_fails_fast_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let output = harness_in(dir.path(), &["validate", "--config", "/dev/zero"], &[], b"");
    assert_refused(&output, "/dev/zero", "not a regular file or a pipe but a character device");
    // The same stream through stdin is cut at the cap.
    let zeros = vec![0u8; 3 << 20];
    let output = harness_in(dir.path(), &["validate", "--config", "-"], &[], &zeros);
    assert_refused(&output, "stdin", "larger than 1024 KiB");
}

#[test]
fn a_config_through_a_named_pipe_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("config.json");
    mkfifo(&fifo);
    let writer_path = fifo.clone();
    // Opening a FIFO for writing waits for its reader: the harness.
    let writer = std::thread::spawn(move || {
        std::fs::write(writer_path, br#"{"shape":"s-1vcpu-1gb","apiKey":"k"}"#).unwrap();
    });
    let output = harness_in(dir.path(), &["validate", "--config", fifo.to_str().unwrap()], &[], b"");
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    writer.join().unwrap();
}

#[test]
fn a_two_mebibyte_lease_file_is_refused_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.json");
    std::fs::write(&config, r#"{"shape":"s-1vcpu-1gb"}"#).unwrap();
    let lease = dir.path().join("lease.json");
    let padding = " ".repeat(2 << 20);
    std::fs::write(&lease, format!(r#"{{"providerLeaseId":"sb-1","metadata":{{}}{padding}}}"#)).unwrap();
    let args = ["destroy", "--config", config.to_str().unwrap(), "--lease", lease.to_str().unwrap()];
    let output = harness_in(dir.path(), &args, &[], b"");
    assert_refused(&output, lease.to_str().unwrap(), "larger than 1024 KiB");
}
