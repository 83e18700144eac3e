//! Pinned provider libraries: the lock file, `--locked` refusing an unpinned
//! library before it is opened, installs pinned when a lock file is in use,
//! and detached minisign signatures reported by `inspect`.

use serde_json::Value;
use std::{
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
};

use e2e::library;

struct Bed {
    dir: tempfile::TempDir,
}

impl Bed {
    fn new() -> Bed {
        Bed { dir: tempfile::tempdir().unwrap() }
    }

    fn lock(&self) -> PathBuf {
        self.dir.path().join("providers.lock")
    }

    /// A copy of fixture library `name` in this bed (so it can be altered).
    fn copy(&self, name: &str) -> PathBuf {
        let copy = self.dir.path().join(format!("{name}.so"));
        std::fs::copy(library(name), &copy).unwrap();
        copy
    }

    fn run(&self, args: &[&str]) -> Output {
        self.command(args).output().unwrap()
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_host-harness"));
        command
            .arg("--lock")
            .arg(self.lock())
            .arg("--providers-dir")
            .arg(self.dir.path().join("providers"))
            .arg("--ledger")
            .arg(self.dir.path().join("ledger.sqlite3"))
            .args(args)
            .env_remove("HOST_HARNESS_PLUGIN")
            .stdin(Stdio::null());
        command
    }
}

/// A FIFO at `path`.
fn mkfifo(path: &Path) {
    let name = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: `name` is a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0);
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn json(output: &Output) -> Value {
    assert_eq!(output.status.code(), Some(0), "{}", stderr(output));
    serde_json::from_slice(output.stdout.split(|byte| *byte == b'\n').next().unwrap()).unwrap()
}

fn refused_in_one_line(output: &Output, needles: &[&str]) {
    assert_eq!(output.status.code(), Some(2), "{}", stderr(output));
    let message = stderr(output);
    assert_eq!(message.lines().count(), 1, "{message}");
    for needle in needles {
        assert!(message.contains(needle), "{needle}: {message}");
    }
}

#[test]
fn locked_refuses_an_unpinned_or_altered_library_before_opening_it() {
    let bed = Bed::new();
    let pinned = bed.copy("fixture_provider");
    let pin = json(&bed.run(&["lock", "add", pinned.to_str().unwrap(), "--json"]));
    assert_eq!(pin["id"], "fixture");
    assert_eq!(pin["version"], "2.0.0");
    assert_eq!(pin["abi"], "2.1");
    let hash = pin["sha256"].as_str().unwrap().to_owned();
    assert!(
        std::fs::read_to_string(bed.lock()).unwrap().contains(&hash),
        "the lock file is TOML with the hash"
    );
    assert_eq!(json(&bed.run(&["lock", "list", "--json"]))["sha256"], hash.as_str());

    let inspected = json(&bed.run(&["--locked", "--plugin", pinned.to_str().unwrap(), "inspect", "--json"]));
    assert_eq!(inspected["version"], "2.0.0");

    // Not a library at all: refused as unpinned, so it was never opened
    // (opening it would say it is not a loadable shared library).
    let garbage = bed.dir.path().join("garbage.so");
    std::fs::write(&garbage, b"garbage").unwrap();
    let output = bed.run(&["--locked", "--plugin", garbage.to_str().unwrap(), "health"]);
    refused_in_one_line(&output, &["not pinned", "none for this path"]);
    assert!(!stderr(&output).contains("shared library"), "{}", stderr(&output));

    // The pinned file altered in place: the expected and the actual hash.
    let mut bytes = std::fs::read(&pinned).unwrap();
    bytes.extend_from_slice(b"tampered");
    std::fs::write(&pinned, bytes).unwrap();
    let output = bed.run(&["--locked", "--plugin", pinned.to_str().unwrap(), "health"]);
    refused_in_one_line(&output, &[&format!("expected {hash}"), "its sha256 is"]);
    let verify = bed.run(&["lock", "verify"]);
    assert_eq!(verify.status.code(), Some(1), "verify reports the altered library");
    // Without --locked the lock file is not consulted.
    assert_eq!(bed.run(&["--plugin", pinned.to_str().unwrap(), "health"]).status.code(), Some(0));
}

#[test]
fn an_install_is_pinned_when_a_lock_file_is_in_use() {
    let bed = Bed::new();
    let first = bed.copy("fixture_next_minor");
    assert!(bed.run(&["providers", "install", first.to_str().unwrap()]).status.success());
    assert!(!bed.lock().exists(), "no lock file in use, none created");
    assert!(bed.run(&["lock", "add", first.to_str().unwrap()]).status.success());
    let second = bed.copy("fixture_provider");
    assert!(bed.run(&["providers", "install", second.to_str().unwrap()]).status.success());
    let pins = String::from_utf8_lossy(&bed.run(&["lock", "list", "--json"]).stdout).into_owned();
    assert!(pins.lines().any(|line| line.contains("\"2.0.0\"")), "the install was pinned: {pins}");
    // The installed copy (the active version) loads under --locked.
    assert!(bed.run(&["providers", "use", "fixture@2.0.0"]).status.success());
    let health = bed.run(&["--locked", "health"]);
    assert_eq!(health.status.code(), Some(0), "{}", stderr(&health));
}

#[test]
fn inspect_reports_what_a_detached_signature_says() {
    let bed = Bed::new();
    let signed = bed.copy("fixture_provider");
    let keys = minisign::KeyPair::generate_unencrypted_keypair().unwrap();
    let other = minisign::KeyPair::generate_unencrypted_keypair().unwrap();
    let bytes = std::fs::read(&signed).unwrap();
    let signature = minisign::sign(Some(&keys.pk), &keys.sk, &bytes[..], None, None).unwrap();
    std::fs::write(signed.with_extension("so.minisig"), signature.to_string()).unwrap();
    let (trusted, stranger) = (keys.pk.to_base64(), other.pk.to_base64());

    let status = |extra: &[&str], library: &Path| {
        let mut args = vec!["--plugin", library.to_str().unwrap(), "inspect", "--json"];
        args.extend(extra);
        json(&bed.run(&args))["signature"]["status"].as_str().unwrap().to_owned()
    };
    assert_eq!(status(&["--trusted-key", &trusted], &signed), "verified");
    assert_eq!(status(&["--trusted-key", &stranger], &signed), "untrusted");
    assert_eq!(status(&[], &signed), "untrusted");
    assert_eq!(status(&["--trusted-key", &trusted], &bed.copy("fixture_frozen")), "unsigned");
}

/// Sets its flag when dropped.
struct StopOnDrop<'a>(&'a std::sync::atomic::AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// What a loop replacing the plugin path puts there each time.
#[derive(Clone, Copy)]
enum Replacement {
    /// A hard link of one library or the other, renamed over the path.
    Rename,
    /// A symbolic link to one library or the other, renamed over the path.
    Symlink,
}

/// Runs `--locked [EXTRA...] inspect` `runs` times while a thread keeps
/// replacing the plugin path by the pinned library and an unpinned one (two
/// builds of the fixture with other versions): no run may load the unpinned
/// one, every refusal is one line, and both outcomes occur (the race ran).
fn locked_inspect_under_a_replacement_loop(replacement: Replacement, extra: &[&str], runs: usize) {
    let bed = Bed::new();
    let pinned = bed.copy("fixture_provider");
    let unpinned = bed.copy("fixture_next_minor");
    assert!(bed.run(&["lock", "add", pinned.to_str().unwrap()]).status.success());
    let plugin = bed.dir.path().join("plugin.so");
    let incoming = bed.dir.path().join("incoming.so");
    let put = |library: &Path| {
        let _ = std::fs::remove_file(&incoming);
        match replacement {
            Replacement::Rename => std::fs::hard_link(library, &incoming).unwrap(),
            Replacement::Symlink => std::os::unix::fs::symlink(library, &incoming).unwrap(),
        }
        std::fs::rename(&incoming, &plugin).unwrap();
    };
    put(&pinned);
    let stop = std::sync::atomic::AtomicBool::new(false);
    let (mut loaded_pinned, mut refused) = (0, 0);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                put(&unpinned);
                put(&pinned);
            }
        });
        // Stops the loop however this thread leaves the scope (a failed
        // assertion included: the scope waits for the loop).
        let _stop = StopOnDrop(&stop);
        let mut args = vec!["--locked", "--plugin", plugin.to_str().unwrap()];
        args.extend(extra);
        args.extend(["inspect", "--json"]);
        for _ in 0..runs {
            let output = bed.run(&args);
            if output.status.success() {
                let version = json(&output)["version"].as_str().unwrap().to_owned();
                if version != "2.0.0" {
                    panic!(
                        "--locked loaded the unpinned library {version} (run {})",
                        loaded_pinned + refused + 1
                    );
                }
                loaded_pinned += 1;
            } else {
                // With --json the refusal is a JSON line on stdout.
                let said = format!("{}{}", String::from_utf8_lossy(&output.stdout), stderr(&output));
                assert_eq!(output.status.code(), Some(2), "{said}");
                assert_eq!(said.lines().count(), 1, "{said}");
                refused += 1;
            }
        }
    });
    assert!(
        loaded_pinned > 0 && refused > 0,
        "the loop raced no run: {loaded_pinned} loaded, {refused} refused"
    );
}

#[test]
fn locked_never_loads_a_library_renamed_over_the_pinned_one_while_it_loads() {
    locked_inspect_under_a_replacement_loop(Replacement::Rename, &[], 40);
}

#[test]
fn locked_never_loads_a_library_a_swapped_symlink_points_at_while_it_loads() {
    locked_inspect_under_a_replacement_loop(Replacement::Symlink, &[], 40);
}

#[test]
fn locked_isolated_worker_never_loads_a_library_renamed_over_the_pinned_one() {
    locked_inspect_under_a_replacement_loop(Replacement::Rename, &["--isolate"], 30);
}

/// Runs the harness with `args`, failing the test (and ending the run)
/// when it has not returned within a minute: a blocking open of a FIFO
/// never returns.
fn run_guarded(bed: &Bed, args: &[&str]) -> Output {
    let mut child = bed.command(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let waited = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        crate::common::wait_until(&format!("{args:?} returns"), std::time::Duration::from_secs(60), || {
            child.try_wait().unwrap().is_some()
        })
    }));
    if let Err(panic) = waited {
        let _ = child.kill();
        std::panic::resume_unwind(panic);
    }
    child.wait_with_output().unwrap()
}

#[test]
fn lock_add_install_and_verify_refuse_a_fifo_in_one_line() {
    let bed = Bed::new();
    let fifo = bed.dir.path().join("plugin.so");
    mkfifo(&fifo);
    let fifo = fifo.to_str().unwrap();
    for args in [
        vec!["lock", "add", fifo],
        vec!["providers", "install", fifo],
        vec!["lock", "verify", fifo],
        vec!["--locked", "--plugin", fifo, "inspect"],
    ] {
        refused_in_one_line(&run_guarded(&bed, &args), &["plugin.so", "not a regular file but a FIFO"]);
    }
    // A FIFO as a library's detached signature: no signature.
    let library = bed.copy("fixture_provider");
    mkfifo(&library.with_extension("so.minisig"));
    let inspected = json(&run_guarded(&bed, &["--plugin", library.to_str().unwrap(), "inspect", "--json"]));
    assert_eq!(inspected["signature"]["status"], "unsigned", "{inspected}");
}
