//! `hello-provider`: a template sandbox provider with no remote side.
//!
//! A lease is a directory under the configured `root`; `execute` runs a local
//! process in it. Everything a real provider must get right is here in small:
//! the write-ahead record of every creation (both moments), binding a lease
//! to its environment, refusing a second release of the same lease,
//! cancelling commands before cleanup (and when the host drops a call),
//! never handing out a lease whose cleanup is unconfirmed, honouring
//! deadlines, streaming raw output and pulling standard input, file sync,
//! and reporting errors with kinds. Copy it, replace `lease.rs`'s directory
//! calls with your service's API, and check the result with
//! `host-harness conform`.
//!
//! - [`config`]: parsing and validating the configuration (every problem at once).
//! - [`lease`]: lease records, their binding to an environment, and the
//!   per-lease state (closing, unconfirmed, running commands).
//! - [`process`]: running one command with streaming output and a deadline.
//! - [`sync`]: checking and copying the files of `sync_files`.
//! - [`provider`]: the [`provider_abi::Provider`] implementation.

pub mod config;
pub mod lease;
pub mod process;
pub mod provider;
pub mod sync;

pub use provider::HelloProvider;

// The one line that makes this crate a provider library: the root module the
// host looks for. It names the optional hooks the provider implements (every
// one, here); a hook left out of the list is left out of the library's
// table, and a host reports it `unsupported` without calling it. A hook
// listed here but not implemented would answer `unsupported` from the
// trait's default: list only what you wrote.
provider_abi::export_provider!(
    HelloProvider,
    optional = [Probe, InspectLease, SyncFiles, ImportUnconfirmed, GrantRequestShare]
);
