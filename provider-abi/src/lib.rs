//! The stable ABI between a sandbox-provider host and its provider plugins:
//! the contract, and nothing a host needs to load a library.
//!
//! - [`Provider`]: the hooks, one per operation, implemented by providers
//!   and by [`Instance`] (a loaded library's provider).
//! - [`export_provider!`]: exports a provider type from a `cdylib`.
//! - The types that cross: parameters and results, [`ByteSink`],
//!   [`ByteSource`], [`LogSink`], [`CreationRecorder`], [`HookFuture`],
//!   [`MemoryEntry`].
//!
//! Versioning and growth: see [`module`].
//!
//! With the optional `serde` feature, the hook parameter and result types
//! (and [`ProviderError`], [`OutputStream`], [`AbiVersion`]) implement
//! serde's traits, for hosts that carry hooks to another process; layouts
//! are unchanged.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

mod error;
pub mod export;
mod file_sync;
mod future;
mod instance;
mod log;
mod memory;
pub mod module;
mod provider;
mod recorder;
mod sink;
mod source;
mod types;
mod version;

pub use abi_stable;
pub use error::{ErrorKind, HookResult, ProviderError};
pub use file_sync::{
    PostUploadCommand, SyncDirection, SyncMapping, SyncOperation, SyncOperationResult, SyncParams, SyncResult,
};
pub use future::{blocking, ready, HookFuture};
pub use instance::Instance;
pub use log::{LogField, LogLevel, LogRecord, LogSink};
pub use memory::{MemoryEntry, MEMORY_LIMIT};
pub use module::ProviderModuleRef;
pub use provider::{unsupported, Provider};
pub use recorder::{CreationRecorder, RecordCreation};
pub use sink::{ByteSink, OutputStream};
pub use source::ByteSource;
pub use types::*;
pub use version::{AbiVersion, Hook, ABI_2_0, ABI_2_1, ABI_VERSION};
