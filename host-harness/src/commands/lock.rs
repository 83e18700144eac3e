//! `lock add | list | verify`: the lock file of pinned provider libraries.

use super::{Failure, Printer};
use provider_host::pin_file::{LockFile, Pin};
use serde_json::json;
use std::path::{Path, PathBuf};

/// `lock` subcommands.
#[derive(clap::Subcommand)]
pub enum LockCommand {
    /// Check a library as a load would and pin its SHA-256, id, version and ABI.
    #[command(after_help = "Examples:\n  host-harness lock add target/release/libcreateos_provider.so")]
    Add {
        /// The library to pin.
        path: PathBuf,
    },
    /// List the pinned libraries.
    #[command(
        after_help = "Examples:\n  host-harness lock list\n  host-harness --lock ./providers.lock --json lock list"
    )]
    List,
    /// Check that each pinned library (or PATH) still has its pinned hash.
    #[command(
        after_help = "Examples:\n  host-harness lock verify\n  host-harness lock verify target/release/libcreateos_provider.so"
    )]
    Verify {
        /// Check this library only.
        path: Option<PathBuf>,
    },
}

/// Runs `command`; `verify` exits 1 when a library no longer matches its pin.
pub fn run(lock: &mut LockFile, command: &LockCommand, out: Printer) -> Result<(), Failure> {
    match command {
        LockCommand::Add { path } => print(out, "pinned: ", &lock.add(path).map_err(Failure::usage)?),
        LockCommand::List => lock.pins().iter().for_each(|pin| print(out, "", pin)),
        LockCommand::Verify { path: Some(path) } => {
            print(out, "verified: ", lock.verify(path).map_err(Failure::usage)?)
        }
        LockCommand::Verify { path: None } => {
            let mut intact = true;
            for pin in lock.pins() {
                match lock.verify(Path::new(&pin.path)) {
                    Ok(_) => print(out, "verified: ", pin),
                    Err(error) => {
                        intact = false;
                        let message = error.to_string();
                        out.failure(json!({"kind": "not_pinned", "message": message}), &message);
                    }
                }
            }
            return super::passed(intact);
        }
    }
    Ok(())
}

/// Prints one line, `what` (`installed: `, or nothing) before it, or its JSON.
fn print(out: Printer, what: &str, pin: &Pin) {
    let value =
        json!({"id": pin.id, "version": pin.version, "abi": pin.abi, "sha256": pin.sha256, "path": pin.path});
    out.value(&value, || {
        format!("{what}{}@{} ABI {} sha256 {} {}", pin.id, pin.version, pin.abi, pin.sha256, pin.path)
    });
}
