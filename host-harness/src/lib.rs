//! The host harness: loads a provider library by path and drives its hooks,
//! whole lease lifecycles and soaks, keeping a durable lease ledger.
//!
//! The host's policy (the lease host, its ledger, sweep, provider sets,
//! loading, pinning and installing providers) lives in the `provider-host`
//! library, which the binary and these modules import directly. The binary
//! (`host-harness`) is a thin clap front end over it and these modules:
//! [`lifecycle`], [`soak`], [`config_file`] (the configuration file),
//! [`lease_file`] (the lease JSON of the hook commands), [`resources`] (what a
//! soak costs the process), [`plugin`] (loading, in process or in worker
//! processes), [`embedded`] (the offline simulator) and [`render`] (output).
//! `conform` runs the `provider-conform` suite.

pub mod config_file;
pub mod embedded;
pub mod interrupt;
pub mod lease_file;
pub mod lifecycle;
pub mod plugin;
pub mod provider_log;
pub mod render;
pub mod resources;
pub mod soak;
pub mod swap;
