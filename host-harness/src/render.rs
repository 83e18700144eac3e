//! Turning hook results into JSON (for `--json`) and human-readable lines.

use provider_abi::{HealthReport, Manifest, ProviderError, ValidationReport};
use serde_json::{json, Value};

/// Parses a JSON text field of a hook result, keeping it as a string if it is
/// not valid JSON (a provider bug the user should still see).
pub fn json_field(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_owned()))
}

/// The manifest as JSON.
pub fn manifest(manifest: &Manifest) -> Value {
    json!({
        "id": manifest.id.as_str(),
        "version": manifest.version.as_str(),
        "displayName": manifest.display_name.as_str(),
        "driverKey": manifest.driver_key.as_str(),
        "abiVersion": manifest.abi_version.to_string(),
        "hooks": manifest.hooks.iter().map(|hook| hook.as_str()).collect::<Vec<_>>(),
        "configSchema": json_field(&manifest.config_schema_json),
    })
}

/// A health report as JSON.
pub fn health(report: &HealthReport) -> Value {
    json!({"status": report.status.as_str(), "message": report.message.as_str()})
}

/// A validation report as JSON.
pub fn validation(report: &ValidationReport) -> Value {
    json!({
        "ok": report.ok,
        "normalizedConfig": report.normalized_config_json.as_ref().map(|text| json_field(text)).into_option(),
        "errors": report.errors.iter().map(|error| error.as_str()).collect::<Vec<_>>(),
        "warnings": report.warnings.iter().map(|warning| warning.as_str()).collect::<Vec<_>>(),
    })
}

/// A hook error as JSON.
pub fn error(error: &ProviderError) -> Value {
    json!({
        "kind": error.kind.to_string(),
        "message": error.message.as_str(),
        "httpStatus": error.status(),
        "operation": error.operation(),
    })
}

/// A hook error as one human-readable line.
pub fn error_line(error: &ProviderError) -> String {
    match (error.status(), error.operation()) {
        (Some(status), Some(operation)) => {
            format!("{} [{}; HTTP {status}; {operation}]", error.message, error.kind)
        }
        _ => format!("{} [{}]", error.message, error.kind),
    }
}
