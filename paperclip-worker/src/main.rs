//! `paperclip-worker`: serves Paperclip's plugin worker protocol on stdio
//! (`serve`), or builds the plugin package (`package`).

use clap::{Parser, Subcommand};
use provider_abi::{Provider, SetupParams};
use provider_host::{
    hosted::HookSupport,
    loader::LoadedProvider,
    store::{self, LeaseStore, LedgerLocation, StoreOptions},
};
use std::{path::PathBuf, process::ExitCode};

#[derive(Parser)]
#[command(version, about = "A Paperclip plugin worker over provider-host")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve Paperclip's JSON-RPC protocol on stdin and stdout (what the
    /// package's worker entry point runs)
    Serve {
        /// The provider library
        #[arg(long)]
        plugin: PathBuf,
        /// The lease ledger: a SQLite file, or a postgres:// URL
        #[arg(long)]
        ledger: std::ffi::OsString,
    },
    /// Build the Paperclip plugin package for a provider library
    Package {
        /// The provider library
        #[arg(long)]
        plugin: PathBuf,
        /// The package directory (created if missing)
        #[arg(long)]
        out: PathBuf,
    },
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Serve { plugin, ledger } => serve(plugin, ledger),
        Command::Package { plugin, out } => package(plugin, out),
    }
}

/// One line on stderr, and exit 2.
fn refuse(message: impl std::fmt::Display) -> ExitCode {
    eprintln!("paperclip-worker: {message}");
    ExitCode::from(2)
}

fn load(plugin: &PathBuf) -> Result<LoadedProvider, String> {
    LoadedProvider::load(plugin)
        .map_err(|error| format!("cannot load the provider {}: {error}", plugin.display()))
}

fn package(plugin: PathBuf, out: PathBuf) -> ExitCode {
    let provider = match load(&plugin) {
        Ok(provider) => provider,
        Err(error) => return refuse(error),
    };
    let worker = match std::env::current_exe() {
        Ok(worker) => worker,
        Err(error) => return refuse(format!("cannot find this program's own file: {error}")),
    };
    match paperclip_worker::package::write(&provider.manifest(), &plugin, &worker, &out) {
        Ok(files) => {
            for file in files {
                println!("{}", file.display());
            }
            ExitCode::SUCCESS
        }
        Err(error) => refuse(error),
    }
}

fn serve(plugin: PathBuf, ledger: std::ffi::OsString) -> ExitCode {
    // The worker's own events (the host's warnings) go to stderr, which the
    // server logs line by line.
    tracing_subscriber::fmt().with_writer(std::io::stderr).with_ansi(false).init();
    stop_with_parent();
    let (outbox, outgoing) = paperclip_worker::worker::Outbox::new();
    let provider = match load(&plugin) {
        Ok(provider) => provider,
        Err(error) => return refuse(error),
    };
    let params =
        SetupParams { host_name: "paperclip".into(), host_version: env!("CARGO_PKG_VERSION").into() };
    if let Err(error) = provider.setup(&params, outbox.log_sink(), provider_abi::LogLevel::Info) {
        return refuse(format!("the provider's setup failed: {}", error.message));
    }
    let location = LedgerLocation::parse(&ledger);
    let ledger: Box<dyn LeaseStore> = match store::open(&location, &StoreOptions::default()) {
        Ok(ledger) => ledger,
        Err(error) => return refuse(format!("cannot open the lease ledger: {error}")),
    };
    // What the provider learnt in earlier workers (kept in the ledger).
    provider_host::memory::restore(&provider, &*ledger);
    let provider: &'static dyn HookSupport = Box::leak(Box::new(provider));
    let ledger: &'static dyn LeaseStore = Box::leak(ledger);
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => return refuse(format!("cannot start the runtime: {error}")),
    };
    runtime.block_on(async {
        let worker = paperclip_worker::worker::Worker::new(provider, ledger, outbox);
        let stop = async {
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(mut terminate) => drop(terminate.recv().await),
                Err(_) => std::future::pending().await,
            }
        };
        paperclip_worker::worker::serve(worker, outgoing, tokio::io::stdin(), tokio::io::stdout(), stop)
            .await;
    });
    ExitCode::SUCCESS
}

/// The worker is started by the package's entry point: when that process
/// dies (the server killed it), the worker is sent SIGTERM and stops as on
/// `shutdown`, rather than run on with nobody to answer.
fn stop_with_parent() {
    // SAFETY: prctl with PR_SET_PDEATHSIG only sets this process's attribute.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
    }
    // The parent may have died before the attribute was set.
    if std::os::unix::process::parent_id() == 1 {
        std::process::exit(0);
    }
}
