//! `isolated-worker __worker LIBRARY`: the isolated provider's worker, as
//! `host-harness __worker LIBRARY` runs it, for the benchmarks (cargo
//! builds a package's own binaries for its benches, not a dependency's).

use std::{path::PathBuf, process::ExitCode};

fn main() -> ExitCode {
    let args: Vec<_> = std::env::args_os().collect();
    match args.as_slice() {
        [_, mode, library] if mode == "__worker" => {
            host_harness::isolation::serve_worker(&PathBuf::from(library), None)
        }
        _ => {
            eprintln!("usage: isolated-worker __worker LIBRARY (started by the isolated provider)");
            ExitCode::from(2)
        }
    }
}
