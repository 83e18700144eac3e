//! End-to-end tests through real shared libraries, one binary with modules.

mod abi;
mod async_hooks;
mod binding;
mod commands;
mod docs;
mod execute;
mod lease;
mod lease_outcomes;
mod loading;
mod pacing;
mod support;
mod sync;
mod worker;
