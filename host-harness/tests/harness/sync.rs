//! `host-harness sync` as users run it against a simulator this test owns:
//! files in (with `--then`) and out, per-operation results, one-line
//! refusals, and `unsupported` from a provider without `sync_files`.

use crate::common::ConfigDir;
use createos_sim::{SimConfig, Simulator};
use provider_host::loader::library_file_name;
use serde_json::{json, Value};
use std::{
    os::unix::fs::PermissionsExt,
    path::PathBuf,
    process::{Command, Output, Stdio},
};

struct Bed {
    dir: tempfile::TempDir,
    config: PathBuf,
}

impl Bed {
    fn new(sim: &Simulator) -> Bed {
        let ConfigDir { dir, config } = ConfigDir::new(sim, |_| {});
        Bed { dir, config }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `host-harness [--plugin P] --json SUBCOMMAND --config FILE REST...`.
    fn run(&self, plugin: Option<&PathBuf>, args: &[&str]) -> Output {
        let (subcommand, rest) = args.split_first().unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_host-harness"));
        if let Some(plugin) = plugin {
            command.arg("--plugin").arg(plugin);
        }
        command
            .arg("--ledger")
            .arg(self.path("ledger.sqlite3"))
            .arg("--json")
            .arg(subcommand)
            .arg("--config")
            .arg(&self.config)
            .args(rest)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    /// Acquires a lease and writes its file.
    fn lease(&self, plugin: Option<&PathBuf>) -> String {
        let output = self.run(plugin, &["acquire"]);
        assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
        let path = self.path("lease.json");
        std::fs::write(&path, &output.stdout).unwrap();
        path.to_string_lossy().into_owned()
    }
}

fn stdout_json(output: &Output) -> Value {
    serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|_| panic!("not JSON: {}", String::from_utf8_lossy(&output.stdout)))
}

/// A failure with `--json`: exit 1 and one JSON line on stdout; its message.
fn one_line_failure(output: &Output) -> String {
    assert_eq!(output.status.code(), Some(1), "{}", String::from_utf8_lossy(&output.stderr));
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert_eq!(stdout.trim_end().lines().count(), 1, "{stdout}");
    let line: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(line["ok"], false, "{stdout}");
    line["error"]["message"].as_str().unwrap().to_owned()
}

#[test]
fn sync_moves_a_directory_in_runs_then_and_brings_a_result_out() {
    let sim = Simulator::start(SimConfig { rate_limit: None, ..Default::default() }).unwrap();
    let bed = Bed::new(&sim);
    let lease = bed.lease(None);
    let local = bed.path("project");
    std::fs::create_dir_all(local.join("node_modules")).unwrap();
    std::fs::write(local.join("input.txt"), "from the host\n").unwrap();
    std::fs::write(local.join("node_modules/skip.js"), "x").unwrap();
    let inbound = format!("{}:/paperclip-workspace/project", local.display());
    let output = bed.run(
        None,
        &[
            "sync",
            "--lease",
            &lease,
            "--in",
            &inbound,
            "--exclude",
            "node_modules",
            "--then",
            "tr a-z A-Z < project/input.txt > project/output.txt",
        ],
    );
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    assert_eq!(
        stdout_json(&output),
        json!({"operations": [{"id": "in", "filesTransferred": 1, "bytesTransferred": 14}]})
    );

    let back = bed.path("back");
    let outbound = format!("/paperclip-workspace/project/:{}", back.display());
    let file = format!("/paperclip-workspace/project/output.txt:{}", bed.path("output.txt").display());
    let output =
        bed.run(None, &["sync", "--lease", &lease, "--out", &outbound, "--out", &file, "--mode", "640"]);
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    let operations = &stdout_json(&output)["operations"][0];
    assert_eq!((operations["id"].as_str(), operations["filesTransferred"].as_u64()), (Some("out"), Some(3)));
    assert_eq!(std::fs::read_to_string(back.join("output.txt")).unwrap(), "FROM THE HOST\n");
    assert!(!back.join("node_modules").exists());
    let output_file = bed.path("output.txt");
    assert_eq!(std::fs::read_to_string(&output_file).unwrap(), "FROM THE HOST\n");
    assert_eq!(std::fs::metadata(&output_file).unwrap().permissions().mode() & 0o777, 0o640);

    // A mapping of the wrong kind says which kind the source is.
    let as_file = format!("/paperclip-workspace/project:{}", bed.path("as-file").display());
    let wrong = one_line_failure(&bed.run(None, &["sync", "--lease", &lease, "--out", &as_file]));
    assert!(wrong.contains("CreateOS transfer source is a directory"), "{wrong}");
    let as_directory = format!("/paperclip-workspace/project/output.txt/:{}", bed.path("as-dir").display());
    let wrong = one_line_failure(&bed.run(None, &["sync", "--lease", &lease, "--out", &as_directory]));
    assert!(wrong.contains("CreateOS transfer source is not a directory"), "{wrong}");

    let escape = format!("{}:/etc/passwd", local.join("input.txt").display());
    let refused = one_line_failure(&bed.run(None, &["sync", "--lease", &lease, "--in", &escape]));
    assert!(refused.contains("CreateOS transfer path escapes the workspace."), "{refused}");
    let failed =
        one_line_failure(&bed.run(None, &["sync", "--lease", &lease, "--in", &inbound, "--then", "exit 7"]));
    assert!(failed.contains("exit code 7"), "{failed}");
    let usage = bed.run(None, &["sync", "--lease", &lease]);
    assert_eq!(usage.status.code(), Some(2));
}

#[test]
fn sync_with_a_provider_without_sync_files_is_unsupported() {
    let sim = Simulator::start(SimConfig { rate_limit: None, ..Default::default() }).unwrap();
    let bed = Bed::new(&sim);
    let deps = std::env::current_exe().unwrap().parent().unwrap().to_path_buf();
    let old = deps.join(library_file_name("fixture_frozen"));
    let lease = bed.lease(Some(&old));
    std::fs::write(bed.path("f"), "f").unwrap();
    let inbound = format!("{}:/fixture/f", bed.path("f").display());
    let output = bed.run(Some(&old), &["sync", "--lease", &lease, "--in", &inbound]);
    let line = one_line_failure(&output);
    assert!(line.contains("does not implement the `sync_files` hook"), "{line}");
}
