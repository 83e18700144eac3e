//! The simulator leaves no temporary directory behind: not on SIGTERM to
//! `sim`, not when a second Ctrl-C makes the harness exit at once, and the
//! directories of simulators that were killed are removed when the next one
//! starts. Real signals to the real binary, each run with a private TMPDIR.

use crate::common::{signal, wait_until};
use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

fn harness(tmp: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_host-harness"));
    command
        .env("TMPDIR", tmp)
        .arg("--ledger")
        .arg(tmp.join("ledger.sqlite3"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

/// The simulator directories under `tmp`.
fn sim_dirs(tmp: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(tmp)
        .unwrap()
        .flatten()
        .map(|entry| entry.path())
        .filter(|path| path.file_name().unwrap().to_string_lossy().starts_with("createos-sim-"))
        .collect()
}

#[test]
fn sim_removes_its_directory_on_sigterm() {
    let tmp = tempfile::tempdir().unwrap();
    let mut child = harness(tmp.path(), &["sim"]).spawn().unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut first).unwrap();
    assert!(first.contains("listening"), "{first}");
    assert_eq!(sim_dirs(tmp.path()).len(), 1, "the simulator's directory while it runs");
    signal(&child, libc::SIGTERM);
    child.wait().unwrap();
    assert_eq!(sim_dirs(tmp.path()), Vec::<PathBuf>::new());
}

#[test]
fn a_second_ctrl_c_still_removes_the_embedded_simulators_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let child = harness(tmp.path(), &["soak", "--leases", "400", "--concurrency", "16", "--no-rate-limit"])
        .spawn()
        .unwrap();
    // Sandboxes exist: their directories are inside the simulator's.
    wait_until("sandboxes exist", Duration::from_secs(60), || {
        sim_dirs(tmp.path()).iter().any(|dir| std::fs::read_dir(dir).is_ok_and(|entries| entries.count() > 2))
    });
    signal(&child, libc::SIGINT);
    signal(&child, libc::SIGINT);
    let output = child.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(130), "{}", String::from_utf8_lossy(&output.stderr));
    assert_eq!(sim_dirs(tmp.path()), Vec::<PathBuf>::new());
}

#[test]
fn directories_of_dead_simulators_are_removed_at_start_and_live_ones_kept() {
    let tmp = tempfile::tempdir().unwrap();
    let mut exited = Command::new("true").spawn().unwrap();
    let dead_pid = exited.id();
    exited.wait().unwrap();
    let stale = tmp.path().join(format!("createos-sim-{dead_pid}-AbCd12"));
    std::fs::create_dir_all(stale.join("sb-1/workspace")).unwrap();
    std::fs::write(stale.join("sb-1/workspace/file"), "left behind").unwrap();
    let live = tmp.path().join(format!("createos-sim-{}-XyZ789", std::process::id()));
    std::fs::create_dir_all(&live).unwrap();
    let unnamed = tmp.path().join("createos-sim-old");
    std::fs::create_dir_all(&unnamed).unwrap();

    let output = harness(tmp.path(), &["lifecycle"]).output().unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    let mut left = sim_dirs(tmp.path());
    left.sort();
    assert_eq!(left, [live, unnamed], "the dead simulator's directory is gone, the others kept");
}
