//! The configuration: `{"root": "/abs/dir", "reuseLease": true, "timeoutMs": 30000}`.

use provider_abi::{ErrorKind, ProviderError};
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

/// What parsing a configuration found: every problem, one line each, and
/// remarks that do not stop it from being used.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Problems {
    /// Fatal problems.
    pub errors: Vec<String>,
    /// Non-fatal remarks (unknown keys).
    pub warnings: Vec<String>,
}

/// Notes the problem `message` and returns `value`, which stands in for the
/// bad one so that the checks go on.
fn problem<T>(errors: &mut Vec<String>, message: impl Into<String>, value: T) -> T {
    errors.push(message.into());
    value
}

impl Config {
    /// Parses `text`, collecting *every* problem rather than stopping at the
    /// first: `validate_config` must report them all at once. The
    /// configuration comes back when there is no error.
    pub fn parse(text: &str) -> (Option<Config>, Problems) {
        let mut problems = Problems::default();
        let errors = &mut problems.errors;
        let object = match serde_json::from_str::<Value>(text) {
            Ok(Value::Object(object)) => object,
            Ok(_) => problem(errors, "The configuration must be a JSON object.", Map::new()),
            Err(_) => problem(errors, "The configuration is not valid JSON.", Map::new()),
        };
        let root = match object.get("root") {
            Some(Value::String(root)) if root.starts_with('/') => Some(PathBuf::from(root)),
            Some(_) => problem(errors, "`root` must be an absolute directory path.", None),
            None => problem(errors, "`root` is required: the directory lease directories are made in.", None),
        };
        let reuse_lease = match object.get("reuseLease") {
            None => true,
            Some(Value::Bool(reuse)) => *reuse,
            Some(_) => problem(errors, "`reuseLease` must be true or false.", true),
        };
        let timeout_ms = match object.get("timeoutMs") {
            None => DEFAULT_TIMEOUT_MS,
            Some(value) => {
                value.as_u64().filter(|ms| (1..=MAX_TIMEOUT_MS).contains(ms)).unwrap_or_else(|| {
                    let message = format!("`timeoutMs` must be an integer from 1 to {MAX_TIMEOUT_MS}.");
                    problem(errors, message, DEFAULT_TIMEOUT_MS)
                })
            }
        };
        for key in object.keys().filter(|key| !["root", "reuseLease", "timeoutMs"].contains(&key.as_str())) {
            problems.warnings.push(format!("Unknown configuration key `{key}` is ignored."));
        }
        let config = root.filter(|_| problems.errors.is_empty());
        (config.map(|root| Config { root, reuse_lease, timeout_ms }), problems)
    }

    /// Parses `text` for a hook other than `validate_config`: the first
    /// problem becomes an `invalid_config` error.
    pub fn for_hook(text: &str) -> Result<Config, ProviderError> {
        let (config, problems) = Config::parse(text);
        config.ok_or_else(|| {
            let first = problems.errors.into_iter().next().unwrap_or_default();
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
        let (config, problems) =
            Config::parse(r#"{"root":"relative","reuseLease":"yes","timeoutMs":0,"x":1}"#);
        assert_eq!(config, None);
        assert_eq!(problems.errors.len(), 3, "{problems:?}");
        assert_eq!(problems.warnings, ["Unknown configuration key `x` is ignored."]);
        for (text, errors) in [("{}", 1), ("[]", 2)] {
            let (config, problems) = Config::parse(text);
            assert_eq!((config, problems.errors.len()), (None, errors), "{text}");
        }
    }

    #[test]
    fn defaults_fill_what_is_left_out() {
        let (config, problems) = Config::parse(r#"{"root":"/tmp/x"}"#);
        assert_eq!(problems, Problems::default());
        assert_eq!(
            config,
            Some(Config { root: "/tmp/x".into(), reuse_lease: true, timeout_ms: DEFAULT_TIMEOUT_MS })
        );
    }
}
