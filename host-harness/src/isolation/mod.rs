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
//! - [`worker`]: the worker's loop ([`serve_worker`]), which the harness
//!   binary runs in its hidden `__worker` subcommand.
//!
//! Why postcard and a hand-written frame loop rather than an RPC framework:
//! each call is served by a thread of its own on both sides (the host's
//! futures must not need an async runtime of the host's, and the provider
//! owns its own), and a round trip must cost microseconds; a length prefix,
//! one frame per message and serde's compact encoding of the ABI's own types
//! (behind `provider-abi`'s `serde` feature) is all the protocol needs.

pub mod client;
pub mod fd_pass;
mod process;
pub mod protocol;
pub mod spawn;
pub mod worker;

pub use client::{
    is_worker_failure, is_worker_failure_message, IsolatedProvider, IsolationError, IsolationOptions,
    WORKER_OPERATION,
};
pub use process::environment_for;
pub use spawn::Limits;
pub use worker::serve_worker;
