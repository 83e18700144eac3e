//! The lease JSON the hook commands read and print, for scripting:
//! `{"providerLeaseId": "..." | null, "metadata": {...}, "expired": false}`.

use provider_abi::Lease;
use serde_json::{json, Value};
use std::path::Path;

/// A lease as JSON.
pub fn to_json(lease: &Lease) -> Value {
    json!({
        "providerLeaseId": lease.provider_lease_id.as_ref().map(|id| id.as_str()).into_option(),
        "metadata": crate::render::json_field(&lease.metadata_json),
        "expired": lease.expired,
    })
}

/// Parses lease JSON.
pub fn parse(text: &str) -> Result<Lease, String> {
    let value: Value = serde_json::from_str(text).map_err(|error| format!("not valid JSON ({error})"))?;
    let id = match value.get("providerLeaseId") {
        None | Some(Value::Null) => None,
        Some(Value::String(id)) if !id.is_empty() => Some(id.as_str().into()),
        Some(_) => return Err("`providerLeaseId` must be a non-empty string or null".into()),
    };
    let metadata = match value.get("metadata") {
        Some(metadata @ Value::Object(_)) => metadata.to_string(),
        _ => return Err("`metadata` must be a JSON object".into()),
    };
    let expired = match value.get("expired") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(expired)) => *expired,
        Some(_) => return Err("`expired` must be a boolean".into()),
    };
    Ok(Lease {
        provider_lease_id: id.into(),
        metadata_json: metadata.into(),
        expires_at: None.into(),
        expired,
    })
}

/// Reads a lease file (`-` for stdin).
pub fn read(path: &Path) -> Result<Lease, String> {
    let text = crate::config_file::read_text(path)?;
    parse(&text).map_err(|error| format!("{}: {error}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_rejects_bad_leases() {
        let lease = Lease {
            provider_lease_id: Some("sb-1".into()).into(),
            metadata_json: r#"{"marker":"m"}"#.into(),
            ..Default::default()
        };
        assert_eq!(parse(&to_json(&lease).to_string()).unwrap(), lease);
        for bad in ["[]", r#"{"providerLeaseId":5,"metadata":{}}"#, r#"{"providerLeaseId":"x"}"#] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}
