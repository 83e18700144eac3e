//! The commands behind the clap front end, one file per group: `info`
//! (inspect, health, validate), `hooks` (acquire, resume, release, destroy,
//! probe, exec), `runs` (lifecycle, soak), `ledger` (sweep, leases), `sim`,
//! `conform`, `generated` (completions and man pages).

pub mod conform;
pub mod generated;
pub mod hooks;
pub mod info;
pub mod ledger;
pub mod lock;
pub mod providers;
pub mod runs;
#[cfg(feature = "embedded-sim")]
pub mod sim;

use host_harness::{config_file::ConfigFile, render, swap::Swapper};
use provider_abi::{Provider, ProviderError};
use provider_host::{
    environment::Environment,
    hosted::HostedProvider,
    memory,
    store::{self, sqlite::Ledger, LeaseStore, LedgerLocation, StoreOptions},
};
use serde_json::Value;
use std::{io::Write, path::Path, process::ExitCode, time::Duration};

/// How a command failed; maps to the exit code.
pub enum Failure {
    /// The hook returned an error (`None`: already reported): exit 1.
    Hook(Option<ProviderError>),
    /// Bad usage, unreadable input or an unloadable provider: exit 2.
    Usage(String),
    /// Exit with this code, already reported (`exec`).
    Exit(u8),
}

impl From<ProviderError> for Failure {
    fn from(error: ProviderError) -> Self {
        Failure::Hook(Some(error))
    }
}

impl Failure {
    /// A usage failure (exit 2) saying `error`.
    pub fn usage(error: impl std::fmt::Display) -> Failure {
        Failure::Usage(error.to_string())
    }

    /// Prints the failure and returns the exit code.
    pub fn report(self, out: Printer) -> ExitCode {
        match self {
            Failure::Hook(error) => {
                if let Some(error) = error {
                    out.failure(render::error(&error), &render::error_line(&error));
                }
                ExitCode::from(1)
            }
            Failure::Usage(message) => {
                out.failure(serde_json::json!({"kind": "usage", "message": message}), &message);
                ExitCode::from(2)
            }
            Failure::Exit(code) => ExitCode::from(code),
        }
    }
}

/// Success when `ok`, else exit 1 with the failure already reported.
pub fn passed(ok: bool) -> Result<(), Failure> {
    ok.then_some(()).ok_or(Failure::Hook(None))
}

/// The parser of a duration flag (`30s`, `2m`, `1h30m`, `500ms`) of at
/// least `min`: a text that is no duration is refused naming `examples`, a
/// shorter one naming the flag's value, `what`.
pub fn duration_at_least(
    min: Duration,
    what: &'static str,
    examples: &'static str,
) -> impl Fn(&str) -> Result<Duration, String> + Clone + Send + Sync + 'static {
    move |text| {
        let duration = humantime::parse_duration(text)
            .map_err(|error| format!("`{text}` is not a duration like {examples} ({error})"))?;
        (duration >= min)
            .then_some(duration)
            .ok_or_else(|| format!("the {what} must be at least {}", humantime::format_duration(min)))
    }
}

/// Shuts `provider` down on an interruption (cancelling the commands in
/// flight), logging a failure.
pub fn stop(provider: &impl Provider) {
    if let Err(error) = provider.shutdown() {
        tracing::warn!(kind = %error.kind, "the provider's shutdown failed");
    }
}

/// Shuts `provider` down after a command; the command's own failure comes first.
pub fn shut_down(provider: &HostedProvider, result: Result<(), Failure>) -> Result<(), Failure> {
    let shutdown = provider.shutdown();
    result?;
    Ok(shutdown?)
}

/// Reads a harness configuration file meant for `provider`, logging its
/// remarks (an unknown key) as the provider's are logged.
pub fn read_config(path: &Path, provider: &(impl Provider + ?Sized)) -> Result<Environment, Failure> {
    let file = ConfigFile::read(path, &provider.manifest().driver_key).map_err(Failure::Usage)?;
    for warning in &file.warnings {
        tracing::warn!("configuration: {warning}");
    }
    Ok(file.environment)
}

/// What a command runs with: the loaded provider, the ledger, the printer.
pub struct Session {
    /// The provider, after `setup`.
    pub provider: HostedProvider,
    /// The lease ledger.
    pub ledger: Box<dyn LeaseStore>,
    /// Where results go.
    pub out: Printer,
    /// Swaps the provider on request (`soak --swap-to`, `SIGHUP`).
    pub swapper: Swapper,
}

impl Session {
    /// Opens the ledger at `ledger` for writing (saying so on stderr when it
    /// created a SQLite ledger's directory) and hands `provider` what it
    /// learnt in earlier processes (its memory, kept in the ledger).
    pub fn open(
        provider: HostedProvider,
        ledger: &LedgerLocation,
        options: &StoreOptions,
        out: Printer,
    ) -> Result<Session, Failure> {
        let ledger: Box<dyn LeaseStore> = match ledger {
            LedgerLocation::Sqlite(path) => {
                let ledger = Ledger::open(path).map_err(Failure::usage)?;
                if let Some(dir) = ledger.created_dir() {
                    eprintln!("created ledger directory {}", dir.display());
                }
                Box::new(ledger)
            }
            location => store::open(location, options).map_err(Failure::usage)?,
        };
        memory::restore(&provider, &*ledger);
        Ok(Session { provider, ledger, out, swapper: Swapper::default() })
    }

    /// Saves what the provider learnt into the ledger, for the next
    /// process, and shuts the provider down; the command's own failure
    /// comes first.
    pub fn finish(self, result: Result<(), Failure>) -> Result<(), Failure> {
        memory::save(&self.provider, &*self.ledger);
        shut_down(&self.provider, result)
    }
}

/// Prints results as text or JSON lines on stdout; failures as text on
/// stderr (JSON on stdout with `--json`).
#[derive(Clone, Copy)]
pub struct Printer {
    /// JSON instead of text.
    pub json: bool,
}

impl Printer {
    /// Prints `value` (JSON) or `text()`.
    pub fn value(&self, value: &Value, text: impl FnOnce() -> String) {
        // A closed stdout (`| head`) is not an error worth a panic.
        let line = if self.json { value.to_string() } else { text() };
        let _ = writeln!(std::io::stdout(), "{line}");
    }

    /// Prints a failure.
    pub fn failure(&self, error: Value, line: &str) {
        if self.json {
            let _ = writeln!(std::io::stdout(), "{}", serde_json::json!({"ok": false, "error": error}));
        } else {
            eprintln!("error: {line}");
        }
    }
}
