//! The embedding example, run as a user runs it.

use std::process::{Command, Stdio};

#[test]
fn the_embedding_example_runs_a_lease_with_live_output() {
    // Built by `cargo test` beside the test binaries (target/<profile>/examples).
    let deps = std::env::current_exe().unwrap().parent().unwrap().to_path_buf();
    let example = deps.join("../examples/embed");
    assert!(example.exists(), "{} is built by `cargo test -p provider-host`", example.display());
    let library = e2e::library("createos_provider");
    let output = Command::new(&example).arg(library).stdin(Stdio::null()).output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}{}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.starts_with("acquired sb-"), "the lease id prints as plain text: {stdout}");
    assert!(stdout.contains("line 1\nline 2\nline 3\n"), "{stdout}");
    assert!(stdout.contains("exit code Some(0)"), "{stdout}");
    assert!(
        stdout.ends_with("released (Kept)\n"),
        "the lease, recorded in the ledger, is paused for reuse: {stdout}"
    );
}
