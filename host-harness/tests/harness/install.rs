//! Installing the harness the way people install tools: a binary copied to a
//! `bin/` folder of its own (what `cargo install` does), providers installed
//! into the providers directory, the search order, each refusal, and the
//! release bundle unpacked and run from elsewhere. `HOME` and the XDG folders
//! point into a temporary directory, so nothing of the user's is read.

use serde_json::Value;
use std::{
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
};

use e2e::library;

/// A temporary home: `HOME`, `XDG_DATA_HOME`, `XDG_STATE_HOME` inside it,
/// an unrelated working directory, and the harness binary copied to `bin/`.
struct Home {
    dir: tempfile::TempDir,
}

impl Home {
    fn new() -> Home {
        let home = Home { dir: tempfile::tempdir().unwrap() };
        for folder in ["bin", "home", "data", "state", "elsewhere"] {
            std::fs::create_dir_all(home.dir.path().join(folder)).unwrap();
        }
        std::fs::copy(env!("CARGO_BIN_EXE_host-harness"), home.binary()).unwrap();
        home
    }

    fn binary(&self) -> PathBuf {
        self.dir.path().join("bin/host-harness")
    }

    fn providers_dir(&self) -> PathBuf {
        self.dir.path().join("data/host-harness/providers")
    }

    /// Runs `binary` with this home's environment from the unrelated folder.
    fn run_binary(&self, binary: &Path, args: &[&str], plugin_variable: Option<&Path>) -> Output {
        let mut command = Command::new(binary);
        command
            .args(args)
            .current_dir(self.dir.path().join("elsewhere"))
            .env("HOME", self.dir.path().join("home"))
            .env("XDG_DATA_HOME", self.dir.path().join("data"))
            .env("XDG_STATE_HOME", self.dir.path().join("state"))
            .env_remove("HOST_HARNESS_PLUGIN")
            .stdin(Stdio::null());
        if let Some(path) = plugin_variable {
            command.env("HOST_HARNESS_PLUGIN", path);
        }
        // Another test thread's fork may still hold the just-copied binary
        // open for writing (Linux's ETXTBSY race): that exec is retried.
        for _ in 0..100 {
            match command.output() {
                Err(error) if error.kind() == std::io::ErrorKind::ExecutableFileBusy => {
                    std::thread::sleep(std::time::Duration::from_millis(20))
                }
                outcome => return outcome.unwrap(),
            }
        }
        panic!("{} stayed busy", binary.display())
    }

    fn run(&self, args: &[&str]) -> Output {
        self.run_binary(&self.binary(), args, None)
    }
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn json_lines(output: &Output) -> Vec<Value> {
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect()
}

/// The manifest version `inspect` reports.
fn inspected_version(output: &Output) -> String {
    assert_eq!(output.status.code(), Some(0), "{}", stderr(output));
    json_lines(output)[0]["version"].as_str().unwrap().to_owned()
}

#[test]
fn an_installed_harness_runs_the_lifecycle_once_its_provider_is_installed() {
    let home = Home::new();
    // Nothing installed and nothing beside the binary: one line that names
    // where it looked and the two commands that fix it.
    let missing = home.run(&["lifecycle"]);
    assert_eq!(missing.status.code(), Some(2));
    let message = stderr(&missing);
    assert_eq!(message.lines().count(), 1, "{message}");
    assert!(message.contains("cargo build --locked --release -p createos-provider"), "{message}");
    assert!(message.contains("host-harness providers install"), "{message}");
    assert!(message.contains(&home.providers_dir().display().to_string()), "{message}");

    let installed =
        home.run(&["providers", "install", library("createos_provider").to_str().unwrap(), "--json"]);
    assert_eq!(installed.status.code(), Some(0), "{}", stderr(&installed));
    let listed = home.run(&["providers", "list", "--json"]);
    let entries = json_lines(&listed);
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert_eq!(entries[0]["id"], "createos");
    assert_eq!(entries[0]["active"], true, "the first version installed is active");
    assert_eq!(entries[0]["sha256"].as_str().unwrap().len(), 64);
    assert!(Path::new(entries[0]["path"].as_str().unwrap()).starts_with(home.providers_dir()));

    let lifecycle = home.run(&["lifecycle"]);
    assert_eq!(lifecycle.status.code(), Some(0), "{}", stderr(&lifecycle));
}

#[test]
fn each_refusal_is_one_line_and_changes_nothing() {
    let home = Home::new();
    let refused = |output: &Output, needle: &str| {
        assert_eq!(output.status.code(), Some(2), "{}", stderr(output));
        let message = stderr(output);
        assert_eq!(message.lines().count(), 1, "{message}");
        assert!(message.contains(needle), "{needle}: {message}");
    };

    // A garbage library.
    let garbage = home.dir.path().join("garbage.so");
    std::fs::write(&garbage, b"not a library at all").unwrap();
    refused(&home.run(&["providers", "install", garbage.to_str().unwrap()]), "garbage.so");
    assert!(json_lines(&home.run(&["providers", "list", "--json"])).is_empty());

    // The same version from another library (trailing bytes change the hash,
    // not the provider): refused, then accepted with --force.
    let first = library("fixture_provider");
    let altered = home.dir.path().join("altered.so");
    let mut bytes = std::fs::read(&first).unwrap();
    bytes.extend_from_slice(b"another build");
    std::fs::write(&altered, bytes).unwrap();
    assert!(home.run(&["providers", "install", first.to_str().unwrap()]).status.success());
    refused(&home.run(&["providers", "install", altered.to_str().unwrap()]), "--force");
    let forced = home.run(&["providers", "install", "--force", altered.to_str().unwrap()]);
    assert_eq!(forced.status.code(), Some(0), "{}", stderr(&forced));

    // A second version is installed inactive, and says so.
    let second = home.run(&["providers", "install", library("fixture_next_minor").to_str().unwrap()]);
    assert!(second.status.success());
    assert!(
        String::from_utf8_lossy(&second.stdout)
            .contains("fixture@2.2.0 is not active: `host-harness providers use fixture@2.2.0` makes it so"),
        "{second:?}"
    );
    // A bare id lists its installed versions.
    refused(&home.run(&["providers", "use", "fixture"]), "installed: fixture@2.0.0, fixture@2.2.0");

    // Removing the active version; another one can go.
    refused(&home.run(&["providers", "remove", "fixture@2.0.0"]), "active");
    assert!(home.run(&["providers", "use", "fixture@2.2.0"]).status.success());
    assert!(home.run(&["providers", "remove", "fixture@2.0.0"]).status.success());
    let left: Vec<Value> = json_lines(&home.run(&["providers", "list", "--json"]));
    assert_eq!(left.len(), 1);
    assert_eq!(left[0]["version"], "2.2.0");
    refused(&home.run(&["providers", "use", "fixture@9.9.9"]), "not installed");
    refused(&home.run(&["providers", "use", "no-version"]), "ID@VERSION");

    // A providers directory that cannot be written (a file stands where its
    // parent should be: tests run as root, which ignores permission bits).
    let blocked = home.dir.path().join("blocked");
    std::fs::write(&blocked, b"a file").unwrap();
    let unwritable = blocked.join("providers");
    let output = home.run(&[
        "--providers-dir",
        unwritable.to_str().unwrap(),
        "providers",
        "install",
        first.to_str().unwrap(),
    ]);
    refused(&output, "cannot");
}

#[test]
fn the_search_order_is_flag_then_variable_then_installed_then_beside_the_binary() {
    let home = Home::new();
    for fixture in ["fixture_frozen", "fixture_next_minor"] {
        assert!(home.run(&["providers", "install", library(fixture).to_str().unwrap()]).status.success());
    }
    assert!(home.run(&["providers", "use", "fixture@2.2.0"]).status.success());
    let flag = library("fixture_frozen");
    let variable = library("fixture_provider");
    let inspect = |binary: &Path, flag: Option<&Path>, variable: Option<&Path>| {
        let mut args = vec!["inspect", "--json"];
        if let Some(path) = flag {
            args.extend(["--plugin", path.to_str().unwrap()]);
        }
        inspected_version(&home.run_binary(binary, &args, variable))
    };
    // 1. --plugin wins over everything.
    assert_eq!(inspect(&home.binary(), Some(&flag), Some(&variable)), "2.0.0-frozen");
    // 2. then HOST_HARNESS_PLUGIN.
    assert_eq!(inspect(&home.binary(), None, Some(&variable)), "2.0.0");
    // 3. then the providers directory's active version, even where a provider
    //    sits beside the binary (the build's own binary has one in deps/).
    let built = Path::new(env!("CARGO_BIN_EXE_host-harness"));
    assert_eq!(inspect(built, None, None), "2.2.0");
    // 4. then beside the binary.
    let empty = Home::new();
    let beside = empty.run_binary(built, &["inspect", "--json"], None);
    assert_eq!(json_lines(&beside)[0]["id"], "createos", "{}", stderr(&beside));
}

#[test]
fn the_release_bundle_unpacks_and_runs_from_anywhere() {
    let home = Home::new();
    let out = home.dir.path().join("dist");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/bundle.sh");
    let target = Path::new(env!("CARGO_BIN_EXE_host-harness")).parent().unwrap().to_path_buf();
    let bundled = Command::new("bash")
        .arg(&script)
        .args(["--from", target.to_str().unwrap(), "--out", out.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(bundled.status.success(), "{}", stderr(&bundled));
    let archive = PathBuf::from(String::from_utf8_lossy(&bundled.stdout).trim());
    assert!(archive.exists(), "{}", archive.display());

    let unpacked = home.dir.path().join("unpacked");
    std::fs::create_dir_all(&unpacked).unwrap();
    let untar = Command::new("tar").arg("-xzf").arg(&archive).arg("-C").arg(&unpacked).status().unwrap();
    assert!(untar.success());
    let folder = std::fs::read_dir(&unpacked).unwrap().next().unwrap().unwrap().path();
    for file in [
        "bin/host-harness",
        "bin/libcreateos_provider.so",
        "SHA256SUMS",
        "INSTALL",
        "share/completions/host-harness.bash",
        "share/man/man1/host-harness.1",
        "share/man/man1/host-harness-lock-add.1",
    ] {
        assert!(folder.join(file).exists(), "the bundle holds {file}");
    }
    // INSTALL lists the contents in two aligned columns.
    let install = std::fs::read_to_string(folder.join("INSTALL")).unwrap();
    let columns: Vec<usize> = install
        .lines()
        .filter(|line| line.starts_with("  bin/") || line.starts_with("  share/"))
        .map(|line| line.len() - line[2..].split_once("  ").unwrap().1.trim_start().len())
        .collect();
    assert!(columns.len() == 4 && columns.iter().all(|&at| at == columns[0]), "{install}");
    let sums = Command::new("sha256sum")
        .arg("--check")
        .arg("--quiet")
        .arg("SHA256SUMS")
        .current_dir(&folder)
        .status();
    assert!(sums.unwrap().success(), "SHA256SUMS matches the files");
    let lifecycle = home.run_binary(&folder.join("bin/host-harness"), &["lifecycle"], None);
    assert_eq!(lifecycle.status.code(), Some(0), "{}", stderr(&lifecycle));
}
