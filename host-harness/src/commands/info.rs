//! `inspect`, `health` and `validate`: hooks that touch no lease, so they run
//! without a ledger (a read-only home directory is no obstacle).

use super::{Failure, Printer};
use host_harness::{config_file::ConfigFile, render};
use provider_abi::Provider;
use provider_host::{hosted::HostedProvider, pin_file::Signature};
use serde_json::json;
use std::path::Path;

/// Prints the provider's manifest, and what its detached signature says.
pub fn inspect(provider: &HostedProvider, out: Printer, signature: &Signature) -> Result<(), Failure> {
    let manifest = provider.manifest();
    let (verdict, signed) = match signature {
        Signature::Unsigned => (json!({"status": "unsigned"}), "unsigned".to_owned()),
        Signature::Verified { key } => {
            (json!({"status": "verified", "key": key}), format!("signature verified with key {key}"))
        }
        Signature::Untrusted { reason } => {
            (json!({"status": "untrusted", "reason": reason}), format!("signature NOT trusted: {reason}"))
        }
    };
    let mut value = render::manifest(&manifest);
    value["signature"] = verdict;
    out.value(&value, || {
        format!(
            "{} {} ({}), driver `{}`, ABI {}\nhooks: {}\nloaded from {} ({signed})",
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
    let json = json!({"status": report.status.as_str(), "message": report.message.as_str()});
    out.value(&json, || format!("{}: {}", report.status, report.message));
    Ok(())
}

/// Calls `validate_config` on the configuration at `path`.
pub fn validate(provider: &HostedProvider, out: Printer, path: &Path) -> Result<(), Failure> {
    let file = ConfigFile::read(path, &provider.manifest().driver_key).map_err(Failure::Usage)?;
    let mut report = provider.validate_config(&file.environment.params(&provider.manifest().driver_key))?;
    // The file's remarks beside the provider's, in one list.
    for (at, warning) in file.warnings.iter().enumerate() {
        report.warnings.insert(at, warning.as_str().into());
    }
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
    super::passed(report.ok)
}
