//! `inspect`, `health` and `validate`: hooks that touch no lease, so they run
//! without a ledger (a read-only home directory is no obstacle).

use super::{read_config, Failure, Printer};
use host_harness::hosted::HostedProvider;
use host_harness::render;
use provider_abi::Provider;
use std::path::Path;

/// Prints the provider's manifest.
pub fn inspect(provider: &HostedProvider, out: Printer) -> Result<(), Failure> {
    let manifest = provider.manifest();
    out.value(&render::manifest(&manifest), || {
        format!(
            "{} {} ({}), driver `{}`, ABI {}\nhooks: {}\nloaded from {}",
            manifest.display_name,
            manifest.version,
            manifest.id,
            manifest.driver_key,
            manifest.abi_version,
            manifest.hooks.iter().map(|hook| hook.as_str()).collect::<Vec<_>>().join(", "),
            provider.path().display()
        )
    });
    Ok(())
}

/// Calls `health`.
pub fn health(provider: &HostedProvider, out: Printer) -> Result<(), Failure> {
    let report = provider.health()?;
    out.value(&render::health(&report), || format!("{}: {}", report.status, report.message));
    Ok(())
}

/// Calls `validate_config` on the configuration at `path`.
pub fn validate(provider: &HostedProvider, out: Printer, path: &Path) -> Result<(), Failure> {
    let config = read_config(path)?;
    let report = provider.validate_config(&config.environment(&provider.manifest().driver_key))?;
    out.value(&render::validation(&report), || {
        let verdict = match report.normalized_config_json.as_ref().into_option() {
            Some(normalized) if report.ok => format!("valid; normalised configuration: {normalized}"),
            _ => "invalid configuration".to_owned(),
        };
        std::iter::once(verdict)
            .chain(report.errors.iter().map(|error| format!("error: {error}")))
            .chain(report.warnings.iter().map(|warning| format!("warning: {warning}")))
            .collect::<Vec<_>>()
            .join("\n")
    });
    if report.ok {
        Ok(())
    } else {
        Err(Failure::Hook(None))
    }
}
