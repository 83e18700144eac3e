//! The configuration: `{"root": "/abs/dir", "reuseLease": true, "timeoutMs": 30000}`.

use provider_abi::{abi_stable::std_types::RString, ErrorKind, ProviderError, ValidationReport};
use serde_json::{Map, Value};
use std::path::PathBuf;

/// The JSON schema the manifest publishes. Hosts read `writeOnly` to learn
/// which keys are secret; this provider has none.
pub const SCHEMA: &str = r#"{"type":"object","required":["root"],"additionalProperties":false,"properties":{
"root":{"type":"string","description":"Absolute directory under which lease directories are created."},
"reuseLease":{"type":"boolean","default":true,"description":"Release keeps the lease for reuse (else deletes it)."},
"timeoutMs":{"type":"integer","minimum":1,"maximum":86400000,"default":30000,"description":"Default command deadline."}}}"#;

/// The default command deadline.
pub const DEFAULT_TIMEOUT_MS: u64 = 30_000;
/// The longest deadline accepted (one day).
pub const MAX_TIMEOUT_MS: u64 = 86_400_000;

/// A valid configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Where lease directories live.
    pub root: PathBuf,
    /// Release pauses (keeps) the lease instead of deleting it.
    pub reuse_lease: bool,
    /// The deadline of a command that names none.
    pub timeout_ms: u64,
}

/// Notes the problem `message` and returns `value`, which stands in for the
/// bad one so that the checks go on.
fn problem<T>(errors: &mut Vec<RString>, message: impl Into<RString>, value: T) -> T {
    errors.push(message.into());
    value
}

impl Config {
    /// Parses `text`, collecting *every* problem rather than stopping at the
    /// first: the report is what `validate_config` answers (every problem,
    /// one line each, and remarks that do not stop the configuration from
    /// being used). The configuration comes back when there is no error.
    pub fn parse(text: &str) -> (Option<Config>, ValidationReport) {
        let (mut errors, mut warnings) = (Vec::new(), Vec::new());
        let object = match serde_json::from_str::<Value>(text) {
            Ok(Value::Object(object)) => object,
            Ok(_) => problem(&mut errors, "The configuration must be a JSON object.", Map::new()),
            Err(_) => problem(&mut errors, "The configuration is not valid JSON.", Map::new()),
        };
        let root = match object.get("root") {
            Some(Value::String(root)) if root.starts_with('/') => Some(PathBuf::from(root)),
            Some(_) => problem(&mut errors, "`root` must be an absolute directory path.", None),
            None => {
                problem(&mut errors, "`root` is required: the directory lease directories are made in.", None)
            }
        };
        let reuse_lease = match object.get("reuseLease") {
            None => true,
            Some(Value::Bool(reuse)) => *reuse,
            Some(_) => problem(&mut errors, "`reuseLease` must be true or false.", true),
        };
        let timeout_ms = match object.get("timeoutMs") {
            None => DEFAULT_TIMEOUT_MS,
            Some(value) => {
                value.as_u64().filter(|ms| (1..=MAX_TIMEOUT_MS).contains(ms)).unwrap_or_else(|| {
                    let message = format!("`timeoutMs` must be an integer from 1 to {MAX_TIMEOUT_MS}.");
                    problem(&mut errors, message, DEFAULT_TIMEOUT_MS)
                })
            }
        };
        for key in object.keys().filter(|key| !["root", "reuseLease", "timeoutMs"].contains(&key.as_str())) {
            warnings.push(format!("Unknown configuration key `{key}` is ignored.").into());
        }
        let config = root.filter(|_| errors.is_empty()).map(|root| Config { root, reuse_lease, timeout_ms });
        let report = ValidationReport {
            ok: config.is_some(),
            normalized_config_json: config
                .as_ref()
                .map(|config| config.normalized().to_string().into())
                .into(),
            errors: errors.into(),
            warnings: warnings.into(),
        };
        (config, report)
    }

    /// Parses `text` for a hook other than `validate_config`: the first
    /// problem becomes an `invalid_config` error.
    pub fn for_hook(text: &str) -> Result<Config, ProviderError> {
        let (config, report) = Config::parse(text);
        config.ok_or_else(|| {
            let first = report.errors.into_iter().next().unwrap_or_default();
            ProviderError::new(ErrorKind::INVALID_CONFIG, first)
        })
    }

    /// The normalised configuration: every key spelt out with its value.
    pub fn normalized(&self) -> Value {
        serde_json::json!({
            "root": self.root.to_string_lossy(),
            "reuseLease": self.reuse_lease,
            "timeoutMs": self.timeout_ms,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_problem_is_reported_at_once() {
        let (config, report) = Config::parse(r#"{"root":"relative","reuseLease":"yes","timeoutMs":0,"x":1}"#);
        assert_eq!(config, None);
        assert!(!report.ok && report.normalized_config_json.is_none());
        assert_eq!(report.errors.len(), 3, "{report:?}");
        assert_eq!(report.warnings.as_slice(), ["Unknown configuration key `x` is ignored."]);
        for (text, errors) in [("{}", 1), ("[]", 2)] {
            let (config, report) = Config::parse(text);
            assert_eq!((config, report.errors.len()), (None, errors), "{text}");
        }
    }

    #[test]
    fn defaults_fill_what_is_left_out() {
        let (config, report) = Config::parse(r#"{"root":"/tmp/x"}"#);
        assert!(report.ok && report.errors.is_empty() && report.warnings.is_empty(), "{report:?}");
        assert_eq!(
            config,
            Some(Config { root: "/tmp/x".into(), reuse_lease: true, timeout_ms: DEFAULT_TIMEOUT_MS })
        );
    }
}
