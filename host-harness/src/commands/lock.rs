//! `lock add | list | verify`: the lock file of pinned provider libraries.

use super::{Failure, Printer};
use provider_host::pin_file::{LockFile, Pin};
use serde_json::json;
use std::path::Path;

/// What to do to the lock file.
pub enum Action<'a> {
    /// Pin a library.
    Add(&'a Path),
    /// List the pins.
    List,
    /// Check every pinned library (or one) against its pin.
    Verify(Option<&'a Path>),
}

/// Runs `action`; `verify` exits 1 when a library no longer matches its pin.
pub fn run(lock: &mut LockFile, action: Action<'_>, out: Printer) -> Result<(), Failure> {
    let failed = |error: provider_host::pin_file::LockError| Failure::Usage(error.to_string());
    match action {
        Action::Add(path) => print(out, "pinned", &lock.add(path).map_err(failed)?),
        Action::List => lock.pins().iter().for_each(|pin| print(out, "", pin)),
        Action::Verify(Some(path)) => print(out, "verified", lock.verify(path).map_err(failed)?),
        Action::Verify(None) => {
            let mut broken = 0;
            for pin in lock.pins() {
                match lock.verify(Path::new(&pin.path)) {
                    Ok(_) => print(out, "verified", pin),
                    Err(error) => {
                        broken += 1;
                        out.failure(
                            json!({"kind": "not_pinned", "message": error.to_string()}),
                            &error.to_string(),
                        );
                    }
                }
            }
            if broken > 0 {
                return Err(Failure::Hook(None));
            }
        }
    }
    Ok(())
}

fn print(out: Printer, what: &str, pin: &Pin) {
    let value =
        json!({"id": pin.id, "version": pin.version, "abi": pin.abi, "sha256": pin.sha256, "path": pin.path});
    out.value(&value, || {
        let prefix = if what.is_empty() { String::new() } else { format!("{what}: ") };
        format!("{prefix}{}@{} ABI {} sha256 {} {}", pin.id, pin.version, pin.abi, pin.sha256, pin.path)
    });
}
