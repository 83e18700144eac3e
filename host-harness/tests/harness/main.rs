//! The harness's integration tests, one binary with a module per concern:
//! most run the built `host-harness` binary against a simulator started in
//! this process ([`common`] holds the test bed they share).
//!
//! Tests of different modules now run side by side as threads, as those of
//! one module always did: libtest runs as many at once as the machine has
//! cores, the bound each test binary had when they were separate. Nothing
//! here changes process-wide state (environment variables, signal
//! handlers, resource limits): a child's environment, its signals and the
//! thread counts a soak reports are those of the `host-harness` processes
//! the tests start.

mod cli;
mod common;
mod conform;
mod fleet;
mod hostile;
mod inputs;
mod install;
mod isolation;
mod ledger;
mod ledger_open;
mod lock;
mod memory;
mod provider_set;
mod provider_words;
mod remote_shell;
mod shared_budget;
mod signals;
mod sim_dirs;
mod soak_threads;
mod swap;
mod sync;
mod wording;
