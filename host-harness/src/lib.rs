//! The host harness: loads a provider library by path and drives its hooks,
//! whole lease lifecycles and soaks, keeping a durable lease ledger.
//!
//! The binary (`host-harness`) is a thin clap front end over these modules:
//! [`host`] (each hook as a host calls it: ledger records and the seed's
//! policy), [`ledger`] (SQLite), [`lifecycle`], [`soak`], [`sweep`],
//! [`lease_file`] (the lease JSON of the hook commands), [`conform`] (the
//! provider-agnostic lease-contract checks), [`resources`]
//! (what a soak costs the process), [`plugin`]
//! (loading), [`hosted`] and [`isolation`] (a provider in process or in a
//! worker process), [`request`] (the configuration file), [`embedded`] (the
//! offline simulator) and [`render`] (output).

pub mod async_host;
pub mod conform;
pub mod embedded;
pub mod host;
pub mod hosted;
pub mod interrupt;
pub mod isolation;
pub mod lease_file;
pub mod ledger;
pub mod lifecycle;
pub mod lock;
pub mod plugin;
pub mod provider_log;
pub mod provider_set;
pub mod providers;
pub mod render;
pub mod request;
pub mod resources;
pub mod secrets;
pub mod soak;
pub mod sweep;
