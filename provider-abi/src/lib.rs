//! The stable ABI between a sandbox-provider host and its provider plugins.
//!
//! - [`Provider`]: the hooks, implemented by providers and by [`LoadedProvider`].
//! - [`export_provider!`]: exports a provider type from a `cdylib`.
//! - [`LoadedProvider::load`]: loads one, checking it is a provider of a
//!   compatible ABI version, with one-line errors.
//!
//! Versioning: see [`module`] for why the root module is frozen within a major
//! version and how minor versions add hooks.
//!
//! With the optional `serde` feature, the hook parameter and result types
//! (and [`ProviderError`], [`OutputStream`], [`AbiVersion`]) implement
//! serde's traits, for hosts that carry hooks to another process; layouts
//! are unchanged.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

mod checked;
#[cfg(target_os = "linux")]
mod elf;
mod error;
pub mod export;
mod future;
mod image;
mod loader;
mod log;
pub mod module;
mod provider;
mod recorder;
mod sink;
mod source;
mod sync;
mod types;
mod version;

pub use abi_stable;
pub use checked::open_library;
pub use error::{ErrorKind, HookResult, ProviderError};
pub use future::{ready, HookFuture};
pub use loader::{library_file_name, LoadError, LoadedProvider};
pub use log::{LogField, LogLevel, LogRecord, LogSink};
pub use module::ProviderModuleRef;
pub use provider::{unsupported, Provider};
pub use recorder::{AsyncCreationRecorder, CreationRecorder};
pub use sink::{ByteSink, OutputSink, OutputStream, OwnedByteSink};
pub use source::OwnedByteSource;
pub use sync::*;
pub use types::*;
pub use version::{
    AbiVersion, Hook, ABI_1_0, ABI_1_1, ABI_1_2, ABI_1_3, ABI_1_4, ABI_1_5, ABI_1_6, ABI_1_7, ABI_1_8,
    ABI_1_9, ABI_VERSION,
};
