//! `host-harness conform` through the built binary: the CreateOS provider
//! on the embedded simulator and the template `hello-provider` conform; the
//! deliberately broken fixture fails exactly the checks of its four bugs,
//! each failure naming the check and the contract sentence it breaks. And
//! `hello-provider` runs a whole host lifecycle, loaded by the harness.
//!
//! No timed assertions here: conform's own bounds (an empty configuration
//! answered within 5 s, a timed-out command back within 30 s of its
//! timeout) are part of what it checks, and they are generous by design.

use provider_conform::CHECKS;
use provider_host::loader::library_file_name;
use serde_json::{json, Value};
use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
};

/// The shared library cargo built for crate `name` next to this test.
fn library(name: &str) -> PathBuf {
    let deps = std::env::current_exe().unwrap().parent().unwrap().to_path_buf();
    let path = deps.join(library_file_name(name));
    assert!(path.exists(), "{} was not built", path.display());
    path
}

/// Runs the harness with its state (ledger) in `dir`.
fn harness(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_host-harness"))
        .env("XDG_STATE_HOME", dir)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run host-harness")
}

/// A harness configuration for hello-provider whose leases live in `root`.
fn hello_config(dir: &Path, root: &Path) -> PathBuf {
    let path = dir.join("hello.json");
    let config = json!({"companyId": "acme", "environmentId": "dev",
                        "config": {"root": root.to_string_lossy()}});
    std::fs::write(&path, config.to_string()).unwrap();
    path
}

fn json_lines(output: &Output) -> Vec<Value> {
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|_| panic!("not JSON: {line}")))
        .collect()
}

/// Asserts a `--json` conform run passed every check, in order.
fn assert_conforms(output: &Output) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    let lines = json_lines(output);
    let failed: Vec<&Value> = lines.iter().filter(|line| line["status"] == "failed").collect();
    assert!(failed.is_empty(), "failed checks: {failed:#?}\nstderr: {stderr}");
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    let names: Vec<&str> = lines.iter().filter_map(|line| line["check"].as_str()).collect();
    let expected: Vec<&str> = CHECKS.iter().map(|check| check.name).collect();
    assert_eq!(names, expected);
    assert!(lines.iter().filter(|line| line["check"].is_string()).all(|line| line["status"] == "passed"));
    let summary = &lines.last().unwrap()["summary"];
    assert_eq!(summary["passed"], CHECKS.len());
    assert_eq!(summary["ok"], true);
}

#[test]
fn the_createos_provider_conforms_on_the_embedded_simulator() {
    let dir = tempfile::tempdir().unwrap();
    let output = harness(dir.path(), &["conform", "--json"]);
    assert_conforms(&output);
}

#[test]
fn hello_provider_conforms_and_leaves_no_lease_behind() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("leases");
    let config = hello_config(dir.path(), &root);
    let plugin = library("hello_provider");
    let output = harness(
        dir.path(),
        &["--plugin", plugin.to_str().unwrap(), "conform", "--config", config.to_str().unwrap(), "--json"],
    );
    assert_conforms(&output);
    let left: Vec<_> = std::fs::read_dir(&root).unwrap().collect();
    assert!(left.is_empty(), "conform destroys every lease it acquires: {left:?}");
}

#[test]
fn the_broken_fixture_fails_exactly_the_checks_of_its_bugs_naming_each_contract_sentence() {
    let dir = tempfile::tempdir().unwrap();
    let config = hello_config(dir.path(), &dir.path().join("leases"));
    let plugin = library("fixture_broken");
    let output = harness(
        dir.path(),
        &["--plugin", plugin.to_str().unwrap(), "conform", "--config", config.to_str().unwrap()],
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(1), "{stdout}");
    let failures: Vec<&str> = stdout.lines().filter(|line| line.starts_with("FAIL ")).collect();
    let failed: BTreeSet<&str> = failures.iter().filter_map(|line| line.split_whitespace().nth(1)).collect();
    assert_eq!(
        failed,
        BTreeSet::from(["lifecycle", "destroy-twice", "other-environment", "concurrent-release"]),
        "{stdout}"
    );
    for line in &failures {
        let name = line.split_whitespace().nth(1).unwrap();
        let check = CHECKS.iter().find(|check| check.name == name).unwrap();
        assert!(line.ends_with(&format!("(contract: {})", check.contract)), "{line}");
    }
    let why =
        |name: &str| *failures.iter().find(|line| line.split_whitespace().nth(1) == Some(name)).unwrap();
    assert!(why("lifecycle").contains("output is not streamed"), "{stdout}");
    assert!(why("destroy-twice").contains("the second destroy_lease failed"), "{stdout}");
    assert!(
        why("other-environment").contains("another company's lease: realize_workspace accepted it"),
        "{stdout}"
    );
    assert!(why("concurrent-release").contains("both succeeded"), "{stdout}");
    assert!(
        stdout.lines().last().unwrap().starts_with("13 checks: 9 passed, 4 failed, 0 skipped"),
        "{stdout}"
    );
}

#[test]
fn conform_without_a_configuration_for_another_provider_says_it_needs_one() {
    // The embedded simulator serves CreateOS only: a provider whose empty
    // configuration is not valid is told to give one, before any check.
    let dir = tempfile::tempdir().unwrap();
    let plugin = library("hello_provider");
    let output = harness(dir.path(), &["--plugin", plugin.to_str().unwrap(), "conform", "--json"]);
    assert_eq!(output.status.code(), Some(2));
    let said =
        format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(
        said.contains("provider `hello` needs --config FILE") && said.contains("`root` is required"),
        "{said}"
    );
    assert!(!said.contains("validate-config"), "no check ran: {said}");
}

#[test]
fn hello_provider_runs_a_whole_host_lifecycle_when_loaded_by_the_harness() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("leases");
    let config = hello_config(dir.path(), &root);
    let plugin = library("hello_provider");
    let ledger = dir.path().join("ledger.sqlite3");
    let output = harness(
        dir.path(),
        &[
            "--plugin",
            plugin.to_str().unwrap(),
            "--ledger",
            ledger.to_str().unwrap(),
            "lifecycle",
            "--config",
            config.to_str().unwrap(),
            "--json",
        ],
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{}\n{stderr}", String::from_utf8_lossy(&output.stdout));
    let steps = json_lines(&output);
    assert!(steps.iter().all(|step| step["ok"] == true), "{steps:#?}");
    let names: Vec<&str> = steps.iter().filter_map(|step| step["step"].as_str()).collect();
    for step in ["validate", "probe", "acquire", "execute", "release", "resume", "destroy"] {
        assert!(names.contains(&step), "no {step} step in {names:?}");
    }
    let left: Vec<_> = std::fs::read_dir(&root).unwrap().collect();
    assert!(left.is_empty(), "the lifecycle destroyed its lease: {left:?}");
}

#[test]
fn an_interrupted_conform_run_starts_no_further_check_and_leaves_no_lease_behind() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("leases");
    let config = hello_config(dir.path(), &root);
    let plugin = library("hello_provider");
    let mut child = Command::new(env!("CARGO_BIN_EXE_host-harness"))
        .env("XDG_STATE_HOME", dir.path())
        .args(["--plugin", plugin.to_str().unwrap(), "conform", "--config", config.to_str().unwrap()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let mut seen = Vec::new();
    // The third check has reported: interrupt while the rest are to come.
    while !seen.last().is_some_and(|line: &String| line.contains("validate-config")) {
        seen.push(lines.next().expect("conform reported the validate-config check").unwrap());
    }
    // SAFETY: `kill` only sends a signal to our own child process.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
    seen.extend(lines.map(Result::unwrap));
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(130), "{seen:?}\n{stderr}");
    assert!(stderr.contains("SIGINT: stopped after"), "{stderr}");
    let checks = seen.iter().filter(|line| line.starts_with("PASS ") || line.starts_with("FAIL ")).count();
    assert!(checks < CHECKS.len(), "no check starts after the interruption: {seen:?}");
    assert!(!seen.iter().any(|line| line.contains(" checks: ")), "no summary: {seen:?}");
    // The root is made by the first acquire: it may not exist yet.
    let left: Vec<_> = std::fs::read_dir(&root).into_iter().flatten().collect();
    assert!(left.is_empty(), "the check in flight destroyed its leases: {left:?}");
}
