//! `providers install | list | use | remove`: the providers directory.

use super::{Failure, Printer};
use provider_host::{
    pin_file::LockFile,
    providers::{Entry, ProvidersDir},
};
use serde_json::json;
use std::path::PathBuf;

/// `providers` subcommands.
#[derive(clap::Subcommand)]
pub enum ProvidersCommand {
    /// Check a provider library as a load would and install it as
    /// <id>/<version>; the first version installed becomes active.
    #[command(
        after_help = "Examples:\n  host-harness providers install target/release/libcreateos_provider.so"
    )]
    Install {
        /// The library to install.
        path: PathBuf,
        /// Replace an installed version built from another library.
        #[arg(long)]
        force: bool,
    },
    /// List installed versions: id, version, ABI, SHA-256, active, path.
    #[command(after_help = "Examples:\n  host-harness providers list\n  host-harness providers list --json")]
    List,
    /// Make an installed version active (ID@VERSION, e.g. createos@0.1.0).
    #[command(after_help = "Examples:\n  host-harness providers use createos@0.1.0")]
    Use {
        /// ID@VERSION.
        spec: String,
    },
    /// Remove an installed version (never the active one).
    #[command(after_help = "Examples:\n  host-harness providers remove createos@0.1.0")]
    Remove {
        /// ID@VERSION.
        spec: String,
    },
}

/// Runs `command`, printing each affected version.
///
/// An install also pins the installed library when a lock file is in use.
pub fn run(
    providers: &ProvidersDir,
    lock: &mut LockFile,
    command: &ProvidersCommand,
    out: Printer,
) -> Result<(), Failure> {
    match command {
        ProvidersCommand::Install { path, force } => {
            let entry = providers.install(path, *force).map_err(Failure::usage)?;
            if lock.exists() {
                lock.add(&entry.path).map_err(Failure::usage)?;
            }
            print(out, "installed: ", &entry);
            if !entry.active && !out.json {
                let spec = entry.installed.spec();
                println!("{spec} is not active: `host-harness providers use {spec}` makes it so");
            }
        }
        ProvidersCommand::List => {
            let entries = providers.list().map_err(Failure::usage)?;
            if entries.is_empty() && !out.json {
                println!("no provider installed in {}", providers.root().display());
            }
            entries.iter().for_each(|entry| print(out, "", entry));
        }
        ProvidersCommand::Use { spec } => {
            versions_needed(providers, spec)?;
            print(out, "active: ", &providers.use_version(spec).map_err(Failure::usage)?)
        }
        ProvidersCommand::Remove { spec } => {
            versions_needed(providers, spec)?;
            print(out, "removed: ", &providers.remove(spec).map_err(Failure::usage)?)
        }
    }
    Ok(())
}

/// Refuses a bare provider id where `ID@VERSION` is needed, listing the
/// versions of that id that are installed.
fn versions_needed(providers: &ProvidersDir, spec: &str) -> Result<(), Failure> {
    if spec.contains('@') {
        return Ok(());
    }
    let entries = providers.list().map_err(Failure::usage)?;
    let versions: Vec<String> = entries
        .iter()
        .filter(|entry| entry.installed.id == spec)
        .map(|entry| entry.installed.spec())
        .collect();
    Err(Failure::Usage(if versions.is_empty() {
        format!("`{spec}` is not ID@VERSION, and no version of a provider `{spec}` is installed (`host-harness providers list`)")
    } else {
        format!("`{spec}` is not ID@VERSION; installed: {}", versions.join(", "))
    }))
}

/// Prints one line, `what` (`installed: `, or nothing) before it, or its JSON.
fn print(out: Printer, what: &str, entry: &Entry) {
    let installed = &entry.installed;
    let value = json!({
        "id": installed.id,
        "version": installed.version,
        "abi": installed.abi,
        "sha256": installed.sha256,
        "active": entry.active,
        "path": entry.path,
    });
    out.value(&value, || {
        let marker = if entry.active { "*" } else { " " };
        format!(
            "{what}{marker} {:<24} ABI {:<5} sha256 {}  {}",
            installed.spec(),
            installed.abi,
            &installed.sha256[..16.min(installed.sha256.len())],
            entry.path.display()
        )
    });
}
