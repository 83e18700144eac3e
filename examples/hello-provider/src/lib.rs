//! `hello-provider`: a template sandbox provider with no remote side.
//!
//! A lease is a directory under the configured `root`; `execute` runs a local
//! process in it. Everything a real provider must get right is here in small:
//! binding a lease to its environment, refusing a second release of the same
//! lease, cancelling commands before cleanup, never handing out a lease whose
//! cleanup is unconfirmed, honouring deadlines, and reporting errors with
//! kinds. Copy it, replace `lease.rs`'s directory calls with your service's
//! API, and check the result with `host-harness conform`.
//!
//! - [`config`]: parsing and validating the configuration (every problem at once).
//! - [`lease`]: lease records, their binding to an environment, and the
//!   per-lease state (closing, unconfirmed, running commands).
//! - [`process`]: running one command with streaming output and a deadline.
//! - [`provider`]: the [`provider_abi::Provider`] implementation.

pub mod config;
pub mod lease;
pub mod process;
pub mod provider;

pub use provider::HelloProvider;

// The one line that makes this crate a provider library: the root module the
// host looks for. It names the ABI minor whose hooks the provider implements
// (see `provider::ABI`), so a newer `provider-abi` does not make it claim
// hooks it lacks; an older host still loads it and never calls the newer ones.
provider_abi::export_provider!(HelloProvider, abi = provider::ABI);
