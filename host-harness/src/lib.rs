//! The host harness: loads a provider library by path and drives its hooks.
//!
//! The binary (`host-harness`) is a thin clap front end over these modules.

pub mod embedded;
pub mod lifecycle;
pub mod plugin;
pub mod render;
pub mod request;
