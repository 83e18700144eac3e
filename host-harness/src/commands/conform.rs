//! `conform`: checks a provider against the lease contract (the
//! `provider-conform` suite), one line per check and a summary; exit 1 when
//! a check failed.

use super::{runs::Target, Failure, Printer};
use host_harness::{embedded, interrupt, plugin::Library};
use provider_abi::Provider;
use std::{ops::ControlFlow, path::Path, sync::Arc};

/// Runs every check against the provider `library` with the configuration
/// in `config`, or against the embedded CreateOS simulator without one.
pub fn run(library: &Library, config: Option<&Path>, out: Printer) -> Result<(), Failure> {
    // In process: the checks read the library's own ABI and hooks.
    let provider = Arc::new(host_harness::plugin::load_library(library).map_err(Failure::usage)?);
    // The simulator's rate limit is off: 32 leases at once would otherwise
    // wait a minute for the budget, not on the provider.
    let unlimited = Some(embedded::UNLIMITED_REQUEST_BUDGET);
    let Target { sim, config } = Target::new(&*provider, config, false, unlimited)?;
    let manifest = provider.manifest();
    if !out.json {
        if let Some(sim) = &sim {
            println!("{}", embedded::banner(sim));
        }
        let (id, version, abi) = (&manifest.id, &manifest.version, provider.library_abi());
        println!("checking {id} {version} (ABI {abi}) from {}", provider.path().display());
    }
    // The first SIGINT or SIGTERM shuts the provider down (cancelling the
    // commands in flight); the check under way then fails and destroys its
    // leases, and no further check starts.
    let stop = || super::stop(&*provider);
    let report = interrupt::watch(true, stop, || {
        provider_conform::run(provider.clone(), &config, &mut |report| {
            out.value(&report.to_json(), || report.to_line());
            match interrupt::requested() {
                Some(_) => ControlFlow::Break(()),
                None => ControlFlow::Continue(()),
            }
        })
    })
    .map_err(|error| Failure::Usage(format!("cannot watch for signals: {error}")))?;
    if let Some(signal) = interrupt::requested() {
        drop(sim);
        eprintln!("{}: stopped after {} checks", interrupt::name(Some(signal)), report.checks.len());
        return Err(Failure::Exit(interrupt::exit_code(signal)));
    }
    let summary = report.summary();
    out.value(&summary.to_json(), || summary.to_line());
    let shutdown = provider.shutdown();
    drop(sim);
    super::passed(summary.failed == 0)?;
    Ok(shutdown?)
}
