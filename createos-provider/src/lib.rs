//! The CreateOS sandbox provider, exported as a `cdylib` through
//! `provider-abi` (and usable in-process as an `rlib`).
//!
//! One module per concern: `config`, `client` (HTTP), `pacer` (the shared
//! request budget), `gate` (the bound on requests awaiting a reply),
//! `transition` (state machine polling) and `memory` (its schedule kept by
//! the host between processes), `metadata` and `registry` (lease state), `lease` (the lease hooks), `sync` (file sync) and `provider` (the
//! thin ABI layer).

pub mod client;
pub mod config;
pub mod error;
pub mod execute;
mod gate;
mod handoff;
pub mod lease;
mod logs;
mod memory;
pub mod metadata;
pub mod ndjson;
pub mod pacer;
mod provider;
pub mod registry;
pub mod script;
pub mod sync;
pub mod transition;

pub use provider::CreateosProvider;

/// Locks `mutex`, taking it over from a thread that panicked with it: every
/// lock of this crate guards state a panic cannot leave half-changed.
pub(crate) fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

provider_abi::export_provider!(
    CreateosProvider,
    optional =
        [Probe, InspectLease, SyncFiles, ImportUnconfirmed, GrantRequestShare, ExportMemory, ImportMemory]
);
