//! Isolation mode: the same provider in a worker process, so a crashing
//! provider cannot take the host down.
//!
//! - [`protocol`]: the messages and their framing (postcard over
//!   length-prefixed frames on Unix sockets);
//! - [`fd_pass`]: handing a worker the sockets of new calls;
//! - [`spawn`]: starting a worker (what it inherits, its limits);
//! - [`process`]: one worker process as the host holds it (its call
//!   sockets, its control socket, how it ended);
//! - [`client`]: [`IsolatedProvider`], the host's side, implementing
//!   [`provider_abi::Provider`];
//! - [`worker`]: the worker's side: [`run_worker_if_requested`], which a
//!   host binary's `main` calls first, serves the hooks when the process was
//!   started as a worker.
//!
//! A worker is the host's own executable (or [`IsolationOptions::program`])
//! started as `PROGRAM __worker LIBRARY [--sha256 HEX]`, its control socket
//! on file descriptor 3. Isolating a provider takes two calls:
//!
//! ```no_run
//! use provider_abi::Provider;
//! use provider_host::isolation::{run_worker_if_requested, IsolatedProvider, IsolationOptions};
//!
//! fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     // In a worker process this serves the hooks and exits; here it returns.
//!     run_worker_if_requested();
//!     let provider = IsolatedProvider::start("libcreateos_provider.so", IsolationOptions::default())?;
//!     println!("{}", provider.manifest().id);
//!     Ok(())
//! }
//! ```
//!
//! Why postcard and a hand-written frame loop rather than an RPC framework:
//! each call is served by a thread of its own on both sides (the host's
//! futures must not need an async runtime of the host's, and the provider
//! owns its own), and a round trip must cost microseconds; a length prefix,
//! one frame per message and serde's compact encoding of the ABI's own types
//! (behind `provider-abi`'s `serde` feature) is all the protocol needs.

mod client;
mod fd_pass;
mod process;
mod protocol;
mod spawn;
mod worker;

pub use client::{
    is_worker_failure, is_worker_failure_message, IsolatedProvider, IsolationError, IsolationOptions,
    WORKER_OPERATION,
};
pub use spawn::Limits;
pub use worker::{run_worker_if_requested, WORKER_ARGUMENT};

use crate::{lock, read, write};
