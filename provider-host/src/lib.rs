//! The host's policy for sandbox providers, for any platform to embed.
//!
//! Provider-agnostic: it knows hooks and error kinds, never a provider's
//! configuration keys. [`host`] calls each lease hook as a host should
//! (ledger records before and after, the fallback for unconfirmed leases);
//! [`store`] is what it records into, with [`store::sqlite`] the embedded
//! default and [`store::postgres`] a fleet's, whose hosts keep a
//! heartbeat; [`sweep`](mod@sweep) destroys what a crashed run left; [`hosted`] holds any
//! provider (loaded, or in worker processes: [`isolation`]);
//! [`provider_set`] keeps versions side by side with hot swap and drain;
//! [`unconfirmed_handover`] tells a newly active version which leases it must refuse
//! to reuse; [`memory`] keeps what a provider learnt across processes;
//! [`loader`] loads provider libraries; [`pin_file`] and [`providers`] pin and
//! install provider libraries, loading [`staging`]'s private copies; [`secrets`] keeps secrets out of the ledger;
//! [`environment`] is the environment a host acts for.
//!
//! Cargo features, all on by default: `sqlite` ([`store::sqlite`]: the
//! ledger in a SQLite file; rusqlite), `postgres` ([`store::postgres`]:
//! postgres, r2d2), `pinning` ([`pin_file`]: toml, minisign-verify) and
//! `isolation` ([`isolation`]: a provider in worker processes; postcard,
//! nix). A host on one machine takes `default-features = false, features =
//! ["sqlite"]`; with none, it brings a [`LeaseStore`] of its own.
//!
//! A platform goes through [`Host`]: load the provider, open a ledger,
//! and call each hook through the host, which records the lease before the
//! call that needs it returns (condensed from `examples/embed.rs`). The
//! host's hook methods are async; a blocking caller runs each with
//! [`wait`]. What an embedder uses is re-exported here, the contract's
//! types with it ([`provider_abi`] itself too), so this crate is the one
//! dependency a platform needs:
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use provider_host::{
//!     ByteSource, Environment, Host, Ledger, LoadedProvider, LogLevel, LogSink, Owner, Provider,
//!     RemoteCommand, SetupParams,
//! };
//!
//! let provider = LoadedProvider::load(std::path::Path::new("libcreateos_provider.so"))?;
//! provider.setup(&SetupParams::new("my-platform", "1.0.0"), LogSink::new(|_| {}), LogLevel::Warn)?;
//! let ledger = Ledger::open(std::path::Path::new("ledger.sqlite3"))?;
//! let config = Environment::new("acme", "production", serde_json::json!({"shape": "s-1vcpu-1gb"}));
//! let host = Host::new(&provider, &ledger, &config, Owner::Command, "run-1");
//! let lease = host.acquire().await?;
//! println!("acquired {}", lease.id().unwrap_or("-"));
//! let command = RemoteCommand::new("/bin/echo").args(["hi"]);
//! let mut print = |_stream, bytes: &[u8]| print!("{}", String::from_utf8_lossy(bytes));
//! let result = host.execute(&lease, command, ByteSource::empty(), &mut print).await?;
//! println!("exit code {:?}", result.exit_code);
//! host.release(&lease).await?;
//! # Ok(()) }
//! ```

pub mod budget;
pub mod command;
pub mod environment;
pub mod file_transfer;
mod forward;
#[cfg(feature = "sqlite")]
mod group_commit;
pub mod host;
pub mod hosted;
#[cfg(feature = "isolation")]
pub mod isolation;
pub mod loader;
pub mod memory;
#[cfg(feature = "pinning")]
pub mod pin_file;
pub mod provider_set;
pub mod providers;
pub mod secrets;
pub mod staging;
pub mod store;
pub mod sweep;
pub mod unconfirmed_handover;

pub use command::{CommandOutcome, RemoteCommand};
pub use environment::Environment;
pub use file_transfer::{
    FileTransfer, OperationMoved, PathMapping, PostUpload, TransferOperation, TransferOutcome,
};
pub use host::{HeldLease, Host, Released};
pub use hosted::{HookSupport, HostedProvider};
#[cfg(feature = "isolation")]
pub use isolation::{run_worker_if_requested, IsolatedProvider, IsolationOptions};
pub use loader::{LoadError, LoadProblem, LoadedProvider};
pub use provider_set::ProviderSet;
#[cfg(feature = "postgres")]
pub use store::postgres::{PgLedger, PgOptions};
#[cfg(feature = "sqlite")]
pub use store::sqlite::Ledger;
pub use store::{LeaseRecord, LeaseState, LedgerError, Owner};
pub use store::{LeaseStore, LedgerLocation, StoreOptions};
pub use sweep::{sweep, Scope, SweepSecrets};

/// The contract between host and provider, for the types the hooks take and
/// return beyond those re-exported below.
pub use provider_abi;
pub use provider_abi::{
    ByteSource, ErrorKind, Hook, HookResult, Lease, LogLevel, LogRecord, LogSink, OutputStream, Provider,
    ProviderError, SetupParams, SyncDirection,
};

/// Locks `mutex`, taking it over from a thread that panicked with it.
pub(crate) fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Reads `lock`, taking it over from a thread that panicked with it.
pub(crate) fn read<T>(lock: &std::sync::RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Writes `lock`, taking it over from a thread that panicked with it.
pub(crate) fn write<T>(lock: &std::sync::RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Runs a host future to its end on the calling thread: the one adapter a
/// blocking caller needs (every hook that waits on the network is `async`).
/// The provider runs its network work on its own runtime, so this needs none.
pub fn wait<F: std::future::Future>(future: F) -> F::Output {
    pollster::block_on(future)
}

/// A hook error as JSON (`kind`, `message`, `httpStatus`, `operation`): the
/// shape sweep reports and command output share.
pub fn error_json(error: &provider_abi::ProviderError) -> serde_json::Value {
    serde_json::json!({
        "kind": error.kind.to_string(),
        "message": error.message.as_str(),
        "httpStatus": error.status(),
        "operation": error.operation(),
    })
}
