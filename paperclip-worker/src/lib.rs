//! A Paperclip plugin worker over `provider-host`.
//!
//! Paperclip runs a sandbox provider as a plugin worker: a process it forks,
//! speaking JSON-RPC 2.0 one object a line on stdio. This crate serves that
//! protocol with any provider the host loads, through the host's policy
//! (ledger, write-ahead record, sweep, the unconfirmed-cleanup fallback):
//! [`rpc`] frames and sorts the messages, [`protocol`] knows Paperclip's
//! environment-driver messages, [`errors`] maps a hook's error to
//! Paperclip's shape, [`text`] turns output bytes into `execute.log` chunks,
//! [`worker`] serves the calls, and [`package`] builds the plugin package an
//! operator installs. The host knows nothing of Paperclip.

pub mod errors;
pub mod package;
pub mod protocol;
pub mod rpc;
pub mod text;
pub mod worker;
