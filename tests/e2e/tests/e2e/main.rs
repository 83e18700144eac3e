//! End-to-end tests through real shared libraries, one binary with modules.

mod abi;
mod commands;
mod execute;
mod lease;
mod support;
mod worker;
