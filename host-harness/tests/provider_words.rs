//! The host knows hooks and error kinds, never a provider's configuration
//! keys: every command works against the fixture provider, whose
//! configuration says `passphrase` (a secret) and `holdOnRelease` (release
//! keeps the lease) in words the host has never heard of; and what a release
//! did comes from the provider's report.

use host_harness::{
    config_file::harness_environment,
    host::{Host, Released},
    ledger::{Ledger, Owner},
    loader::LoadedProvider,
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
