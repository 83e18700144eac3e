//! A faithful, in-process simulator of the CreateOS sandbox HTTP API
//! (see `shared/createos-api.md`): sandbox lifecycle with asynchronous
//! transitions, real OS processes isolated per sandbox, NDJSON output
//! journals, `/files`, rate limiting, fault injection and a request ledger.
//!
//! ```no_run
//! let sim = createos_sim::Simulator::start(createos_sim::SimConfig::default()).unwrap();
//! println!("{} key {}", sim.url(), sim.api_key());
//! ```
//!
//! Requires Linux and root (see [`Simulator`]).

mod admission;
mod config;
mod faults;
mod isolation;
mod ledger;
mod pidfd;
mod pidns;
mod process;
mod proctable;
mod ratelimit;
mod routes;
mod server;
mod sim;
mod state;

pub use config::{Algorithm, RateLimit, SimConfig, SHAPES, SMALL_BURST};
pub use faults::{parse_rules, FaultId, FaultKind, FaultProfile, FaultRule, FaultTrigger};
pub use isolation::WORKSPACE;
pub use ledger::{path_matches, Ledger, ProcessRecord, RequestRecord, SandboxRecord, TransitionRecord};
pub use sim::{remove_stale_temp_dirs, remove_temp_dirs, Simulator};
pub use state::SandboxStatus;
