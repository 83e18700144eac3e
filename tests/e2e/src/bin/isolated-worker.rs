//! `isolated-worker __worker LIBRARY`: a worker of the isolated provider in
//! the benchmarks (cargo builds a package's own binaries for its benches, not
//! a dependency's), serving the hooks as any host binary's workers do.

use std::process::ExitCode;

fn main() -> ExitCode {
    provider_host::isolation::run_worker_if_requested();
    eprintln!("usage: isolated-worker __worker LIBRARY (started by the isolated provider)");
    ExitCode::from(2)
}
