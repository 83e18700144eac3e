//! The host knows hooks and error kinds, never a provider's configuration
//! keys: every command works against the fixture provider, whose
//! configuration says `passphrase` (a secret) and `holdOnRelease` (release
//! keeps the lease) in words the host has never heard of; and what a release
//! did comes from the provider's report.

use host_harness::config_file::harness_environment;
use provider_host::{
    host::{Host, Released},
    loader::LoadedProvider,
    store::sqlite::Ledger,
    store::LeaseStore,
    store::Owner,
    wait,
};
use serde_json::{json, Value};
use std::{
    path::Path,
    process::{Command, Output, Stdio},
};

const SECRET: &str = "open-sesame-4242";

use e2e::library as fixture;

struct Bed {
    dir: tempfile::TempDir,
}

impl Bed {
    fn new() -> Self {
        Bed { dir: tempfile::tempdir().unwrap() }
    }

    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).to_string_lossy().into_owned()
    }

    /// Writes a harness configuration file with `hold` as the release policy.
    fn config(&self, hold: bool) -> String {
        let path = self.path(&format!("config-{hold}.json"));
        let config = json!({"companyId": "acme", "environmentId": "dev",
                            "config": {"passphrase": SECRET, "holdOnRelease": hold}});
        std::fs::write(&path, config.to_string()).unwrap();
        path
    }

    fn run(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_host-harness"))
            .arg("--plugin")
            .arg(fixture("fixture_provider"))
            .arg("--ledger")
            .arg(self.path("ledger.sqlite3"))
            .arg("--json")
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    /// Runs a command that must succeed; returns its JSON lines.
    fn ok(&self, args: &[&str]) -> Vec<Value> {
        let output = self.run(args);
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        assert_eq!(output.status.code(), Some(0), "{args:?}: {stdout}{stderr}");
        assert!(!stdout.contains(SECRET) && !stderr.contains(SECRET), "{args:?} showed the secret");
        stdout.lines().filter_map(|line| serde_json::from_str(line).ok()).collect()
    }

    fn lease_file(&self, name: &str, lease: &Value) -> String {
        let path = self.path(name);
        std::fs::write(&path, lease.to_string()).unwrap();
        path
    }

    fn ledger_text(&self) -> String {
        let ledger = Ledger::open(Path::new(&self.path("ledger.sqlite3"))).unwrap();
        ledger.list().unwrap().iter().map(|row| row.to_json().to_string()).collect()
    }
}

#[test]
fn every_command_works_with_a_provider_whose_keys_the_host_does_not_know() {
    let bed = Bed::new();
    let (keep, drop) = (bed.config(true), bed.config(false));

    let validated = bed.ok(&["validate", "--config", &keep]);
    assert_eq!(validated[0]["normalizedConfig"], json!({"holdOnRelease": true}), "{validated:?}");
    bed.ok(&["inspect"]);
    bed.ok(&["health"]);
    bed.ok(&["probe", "--config", &keep]);

    // A kept lease: release keeps it, resume brings it back, destroy ends it.
    let lease = bed.ok(&["acquire", "--config", &keep]).remove(0);
    let lease_path = bed.lease_file("kept.json", &lease);
    let ran = bed.run(&["exec", "--config", &keep, "--lease", &lease_path, "--", "/bin/sh", "-c", "echo hi"]);
    assert_eq!(ran.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&ran.stdout), "hi\n");
    let released = bed.ok(&["release", "--config", &keep, "--lease", &lease_path]).remove(0);
    assert_eq!(released["expired"], false, "the provider said it kept the lease: {released}");
    let resumed = bed.ok(&["resume", "--config", &keep, "--lease", &lease_path]).remove(0);
    assert_eq!(resumed["providerLeaseId"], lease["providerLeaseId"]);
    bed.ok(&["destroy", "--config", &keep, "--lease", &lease_path]);

    // A deleted lease: release says so (an expired lease to keep).
    let lease = bed.ok(&["acquire", "--config", &drop]).remove(0);
    let lease_path = bed.lease_file("dropped.json", &lease);
    let released = bed.ok(&["release", "--config", &drop, "--lease", &lease_path]).remove(0);
    assert_eq!(released["expired"], true, "the provider said it deleted the lease: {released}");

    // Whole lifecycles, both policies, and the ledger commands.
    let kept_steps = bed.ok(&["lifecycle", "--config", &keep]);
    assert!(kept_steps.iter().any(|step| step["step"] == "resume" && step["ok"] == true), "{kept_steps:?}");
    let dropped_steps = bed.ok(&["lifecycle", "--config", &drop]);
    let note = dropped_steps.iter().find(|step| step["step"] == "resume").expect("a resume line");
    assert!(note["note"].as_str().unwrap().contains("skipped"), "{note}");
    bed.ok(&["sweep", "--config", &keep]);
    bed.ok(&["leases"]);
    assert!(!bed.ledger_text().contains(SECRET), "the ledger never holds the secret");
    assert!(bed.ledger_text().contains("holdOnRelease"), "it holds the rest of the configuration");
}

/// What the host concludes from a release is what the provider reports:
/// kept (paused for reuse) or deleted, for a library with every hook and
/// for one with the required hooks only.
#[test]
fn what_a_release_did_comes_from_the_providers_report() {
    let cases = [
        ("fixture_provider", true, Released::Kept),
        ("fixture_provider", false, Released::Deleted),
        ("fixture_frozen", true, Released::Kept),
        ("fixture_frozen", false, Released::Deleted),
    ];
    for (library, hold, expected) in cases {
        let dir = tempfile::tempdir().unwrap();
        let ledger = Ledger::open(&dir.path().join("ledger.sqlite3")).unwrap();
        let provider = LoadedProvider::load(fixture(library)).unwrap();
        let config = harness_environment(json!({"passphrase": SECRET, "holdOnRelease": hold}));
        let host = Host::new(&provider, &ledger, &config, Owner::Command, "run");
        let held = wait(host.acquire()).unwrap();
        assert_eq!(wait(host.release(&held)).unwrap(), expected, "{library} hold={hold}");
    }
}

/// Words that name the CreateOS provider or one of its configuration keys.
const CREATEOS_WORDS: [&str; 7] =
    ["createos", "requestsPerMinute", "apiUrl", "apiKey", "reuseLease", "timeoutMs", "rootfs"];

/// The files of the host crates that are CreateOS's by nature: the embedded
/// simulator (the harness's offline default, which serves CreateOS only)
/// and the `sim` command that serves it.
const CREATEOS_BY_NATURE: [&str; 2] = ["host-harness/src/embedded.rs", "host-harness/src/commands/sim.rs"];

/// Lines that keep a provider's words on purpose, by file and text: the
/// sentence the host refuses an unconfirmed lease with is the one the
/// release rule was written with, which users (and Paperclip's tests) match
/// word for word.
const KEPT_ON_PURPOSE: [(&str, &str); 1] = [(
    "provider-host/src/host.rs",
    "\"CreateOS process cleanup is unconfirmed; destroy this lease before reusing it.\";",
)];

/// Every `.rs` file below `dir`.
fn rust_files(dir: &Path, files: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|error| panic!("{}: {error}", dir.display())) {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, files);
        } else if path.extension().is_some_and(|extension| extension == "rs") {
            files.push(path);
        }
    }
}

/// The lines of `text` that are code: not comments, not a `--help`
/// example (`after_help = "Examples: ...`), and before the file's unit tests.
fn code_lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.lines().enumerate().take_while(|(_, line)| line.trim() != "#[cfg(test)]").filter(|(_, line)| {
        !line.trim_start().starts_with("//") && !line.contains("after_help = \"Examples:")
    })
}

#[test]
fn the_host_crates_name_no_provider_outside_docs_and_examples() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let mut files = Vec::new();
    for crate_src in ["provider-host/src", "host-harness/src"] {
        rust_files(&workspace.join(crate_src), &mut files);
    }
    assert!(files.len() > 40, "found the sources: {files:?}");
    let mut named = Vec::new();
    for file in &files {
        let shown = file.strip_prefix(workspace).unwrap().to_string_lossy().into_owned();
        if CREATEOS_BY_NATURE.contains(&shown.as_str()) {
            continue;
        }
        let text = std::fs::read_to_string(file).unwrap();
        for (number, line) in code_lines(&text) {
            if KEPT_ON_PURPOSE.contains(&(shown.as_str(), line.trim())) {
                continue;
            }
            let lower = line.to_ascii_lowercase();
            if CREATEOS_WORDS.iter().any(|word| lower.contains(&word.to_ascii_lowercase())) {
                named.push(format!("{shown}:{}: {}", number + 1, line.trim()));
            }
        }
    }
    assert!(named.is_empty(), "provider words in the host crates:\n{}", named.join("\n"));
}
