//! Provider configuration: parsing, validation, normalisation, schema.
//!
//! Validation reports every problem at once. Messages are one line, name the
//! offending field, and never echo a configured value: a value may be a
//! secret pasted into the wrong field, and the API key never appears in any
//! message (unknown key *names* are echoed only when they are short, plain
//! identifiers that do not contain the API key).

use std::net::IpAddr;

use serde_json::{json, Map, Value};
use url::{Host, Url};

use crate::error::Error;

/// Default API origin.
pub const DEFAULT_API_URL: &str = "https://api.sb.createos.sh";
/// Environment variable the API key falls back to.
pub const API_KEY_ENV: &str = "CREATEOS_API_KEY";
/// The longest API key accepted, in bytes: far beyond any real key, and
/// small enough that every request's headers stay within what servers accept.
pub const MAX_API_KEY_BYTES: usize = 4096;
/// Default command timeout.
pub const DEFAULT_TIMEOUT_MS: u64 = 300_000;
/// Largest command timeout (24 h).
pub const MAX_TIMEOUT_MS: u64 = 86_400_000;
/// Default request budget: the CreateOS rate limit per minute.
pub const DEFAULT_REQUESTS_PER_MINUTE: u32 = 300;
/// Largest configurable request budget.
pub const MAX_REQUESTS_PER_MINUTE: u32 = 100_000;

/// Shapes published in the CreateOS catalog.
pub const SHAPES: &[&str] = &[
    "s-1vcpu-256mb",
    "s-0.25vcpu-512mb",
    "s-0.5vcpu-1gb",
    "s-1vcpu-1gb",
    "s-1vcpu-2gb",
    "s-2vcpu-2gb",
    "s-2vcpu-4gb",
    "s-4vcpu-4gb",
    "s-4vcpu-8gb",
    "s-8vcpu-8gb",
    "s-8vcpu-16gb",
];

const KNOWN_KEYS: &[&str] =
    &["apiUrl", "apiKey", "shape", "rootfs", "region", "timeoutMs", "reuseLease", "requestsPerMinute"];

/// A secret string. `Debug` and `Display` print `[redacted]`; read it with
/// [`Secret::expose`].
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret.
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    /// The secret value. Never log or format it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("[redacted]")
    }
}

impl std::fmt::Display for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("[redacted]")
    }
}

/// The validated provider configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderConfig {
    /// The API origin (`scheme://host[:port]`, path `/`).
    pub api_url: Url,
    /// The API key.
    pub api_key: Secret,
    /// A catalog shape.
    pub shape: String,
    /// Optional root filesystem image.
    pub rootfs: Option<String>,
    /// Optional region.
    pub region: Option<String>,
    /// Command timeout in milliseconds.
    pub timeout_ms: u64,
    /// Pause (rather than delete) sandboxes on release.
    pub reuse_lease: bool,
    /// The account's CreateOS request budget per minute (used by the pacer).
    pub requests_per_minute: u32,
}

impl ProviderConfig {
    /// Parses a config, reading `CREATEOS_API_KEY` from the process
    /// environment when `apiKey` is absent. Errors are joined into one
    /// `InvalidConfig` error.
    pub fn from_json(value: &Value) -> Result<ProviderConfig, Error> {
        validate(value)
            .map_err(|errors| Error::invalid_config(format!("Invalid CreateOS config: {}", errors.join(" "))))
    }

    /// The origin as a string without a trailing slash, e.g.
    /// `https://api.sb.createos.sh` (the form stored in lease metadata).
    pub fn origin(&self) -> String {
        self.api_url.origin().ascii_serialization()
    }

    /// The normalised config as JSON, without the API key.
    pub fn normalized_json(&self) -> Value {
        let mut value = json!({
            "apiUrl": self.origin(),
            "shape": self.shape,
            "timeoutMs": self.timeout_ms,
            "reuseLease": self.reuse_lease,
            "requestsPerMinute": self.requests_per_minute,
        });
        for (key, name) in [("rootfs", &self.rootfs), ("region", &self.region)] {
            if let Some(name) = name {
                value[key] = json!(name);
            }
        }
        value
    }
}

/// The reference's words for an empty API URL.
const MISSING_API_URL: &str = "CreateOS requires an API URL.";
/// The reference's words for an API URL that does not parse.
const INVALID_API_URL: &str = "CreateOS API URL is invalid.";
/// The reference's words for every rule an API URL breaks; the rule that
/// failed follows in parentheses.
const API_URL_RULE: &str =
    "CreateOS API URL must be an HTTPS origin (optionally ending in /v1); HTTP is allowed on loopback only.";
/// The reference's words for a missing or unknown shape.
const MISSING_SHAPE: &str = "CreateOS requires a shape from its shape catalog.";

/// Validates a config, reading `CREATEOS_API_KEY` from the process
/// environment when `apiKey` is absent; `Err` holds every problem found (the
/// warnings are [`unknown_key_warnings`], valid or not).
pub fn validate(value: &Value) -> Result<ProviderConfig, Vec<String>> {
    parse_with_env(value, |name| std::env::var(name).ok())
}

/// The reference's message when neither `apiKey` nor `CREATEOS_API_KEY`
/// holds a key (users search for this wording).
pub const MISSING_API_KEY: &str =
    "CreateOS requires an API key in the environment config or CREATEOS_API_KEY.";

/// Validates a config with an injectable environment lookup.
///
/// Rules: a JSON object (`null` counts as `{}`); a key whose value is `null`
/// counts as absent; an `apiKey` that is empty or only whitespace counts as
/// absent too (falls back to the environment); like the reference, the key
/// is used with surrounding whitespace trimmed, and an empty or blank
/// `CREATEOS_API_KEY` is no key ([`MISSING_API_KEY`]). Unknown keys are
/// left to [`unknown_key_warnings`].
pub fn parse_with_env(
    value: &Value,
    env: impl Fn(&str) -> Option<String>,
) -> Result<ProviderConfig, Vec<String>> {
    let empty = Map::new();
    let map = match value {
        Value::Object(map) => map,
        Value::Null => &empty,
        _ => return Err(vec!["CreateOS config must be a JSON object.".to_string()]),
    };
    let field = |name: &str| map.get(name).filter(|v| !v.is_null());
    let mut errors = Vec::new();
    // apiKey first: later messages must not contain it.
    let api_key = keep(&mut errors, api_key(map, &env));
    let api_url = keep(
        &mut errors,
        match field("apiUrl") {
            None => Ok(Url::parse(DEFAULT_API_URL).expect("default URL is valid")),
            Some(Value::String(s)) => parse_api_url(s),
            Some(_) => Err(format!("{INVALID_API_URL} (apiUrl must be a string)")),
        },
    );
    let shape = keep(
        &mut errors,
        match field("shape") {
            None => Err(MISSING_SHAPE.to_string()),
            Some(Value::String(s)) if SHAPES.contains(&s.as_str()) => Ok(s.clone()),
            Some(Value::String(_)) => Err(format!(
                "{MISSING_SHAPE} (it is not one of the published CreateOS shapes: {})",
                SHAPES.join(", ")
            )),
            Some(_) => Err(format!("{MISSING_SHAPE} (shape must be a string)")),
        },
    );
    let rootfs = keep(&mut errors, optional_name(field("rootfs"), "rootfs"));
    let region = keep(&mut errors, optional_name(field("region"), "region"));
    let timeout_ms =
        keep(&mut errors, integer_in(field("timeoutMs"), "timeoutMs", MAX_TIMEOUT_MS, DEFAULT_TIMEOUT_MS));
    let requests_per_minute = keep(
        &mut errors,
        integer_in(
            field("requestsPerMinute"),
            "requestsPerMinute",
            MAX_REQUESTS_PER_MINUTE.into(),
            DEFAULT_REQUESTS_PER_MINUTE.into(),
        ),
    );
    let reuse_lease = keep(
        &mut errors,
        match field("reuseLease") {
            None => Ok(false),
            Some(Value::Bool(b)) => Ok(*b),
            Some(_) => Err("reuseLease must be a boolean.".to_string()),
        },
    );
    // Every field that is `None` has put its problem in `errors`.
    let config = (|| {
        Some(ProviderConfig {
            api_url: api_url?,
            api_key: api_key?,
            shape: shape?,
            rootfs: rootfs?,
            region: region?,
            timeout_ms: timeout_ms?,
            reuse_lease: reuse_lease?,
            requests_per_minute: requests_per_minute? as u32,
        })
    })();
    config.ok_or(errors)
}

/// A field's checked value, or `None` with its problem added to `errors`.
fn keep<T>(errors: &mut Vec<String>, checked: Result<T, String>) -> Option<T> {
    checked.map_err(|problem| errors.push(problem)).ok()
}

/// The API key: `apiKey` unless it is absent, `null`, empty or blank, else
/// `CREATEOS_API_KEY` unless that is empty or blank; trimmed, like the
/// reference.
fn api_key(map: &Map<String, Value>, env: impl Fn(&str) -> Option<String>) -> Result<Secret, String> {
    let trimmed = |text: &str| Some(text.trim()).filter(|key| !key.is_empty()).map(str::to_owned);
    let (key, source) = match map.get("apiKey") {
        Some(Value::String(text)) if trimmed(text).is_some() => (trimmed(text), "apiKey"),
        None | Some(Value::Null | Value::String(_)) => {
            (env(API_KEY_ENV).and_then(|text| trimmed(&text)), API_KEY_ENV)
        }
        Some(_) => return Err("apiKey must be a non-empty string.".to_string()),
    };
    let key = key.ok_or_else(|| MISSING_API_KEY.to_string())?;
    // A header value cannot carry control characters other than TAB; CR, LF
    // and NUL would also allow header injection.
    if key.chars().any(|c| (c.is_control() && c != '\t') || c == '\u{7f}') {
        Err(format!("{source} must not contain control characters (CR, LF, NUL)."))
    } else if key.len() > MAX_API_KEY_BYTES {
        Err(format!("{source} must be at most {MAX_API_KEY_BYTES} bytes long (it is {}).", key.len()))
    } else {
        Ok(Secret::new(key))
    }
}

fn parse_api_url(s: &str) -> Result<Url, String> {
    if s.trim().is_empty() {
        return Err(MISSING_API_URL.to_string());
    }
    let url = Url::parse(s).map_err(|_| format!("{INVALID_API_URL} (it is not an absolute URL)"))?;
    let loopback = match url.host() {
        Some(Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        Some(Host::Ipv4(ip)) => IpAddr::V4(ip).is_loopback(),
        Some(Host::Ipv6(ip)) => IpAddr::V6(ip).is_loopback(),
        None => return Err(format!("{INVALID_API_URL} (it names no host)")),
    };
    // The rules in the order they are checked: the first broken one is named.
    let rules = [
        (url.scheme() == "http" && !loopback, "it uses http on a host that is not loopback; use https"),
        (!matches!(url.scheme(), "http" | "https"), "its scheme must be https"),
        (!url.username().is_empty() || url.password().is_some(), "it must not contain user info"),
        (url.query().is_some(), "it must not contain a query"),
        (url.fragment().is_some(), "it must not contain a fragment"),
        (!matches!(url.path(), "" | "/" | "/v1" | "/v1/"), "its path must be empty, / or /v1"),
    ];
    match rules.into_iter().find(|(broken, _)| *broken) {
        Some((_, rule)) => Err(format!("{API_URL_RULE} ({rule})")),
        None => Url::parse(&url.origin().ascii_serialization())
            .map_err(|_| format!("{INVALID_API_URL} (it is not an absolute URL)")),
    }
}

fn optional_name(value: Option<&Value>, name: &str) -> Result<Option<String>, String> {
    match value {
        None => Ok(None),
        Some(Value::String(s)) if s.chars().any(char::is_control) => {
            Err(format!("{name} must be a non-empty string. (it must not contain control characters)"))
        }
        Some(Value::String(s)) if !s.is_empty() => Ok(Some(s.clone())),
        Some(_) => Err(format!("{name} must be a non-empty string.")),
    }
}

/// An integer between 1 and `max`, `default` when absent.
fn integer_in(value: Option<&Value>, name: &str, max: u64, default: u64) -> Result<u64, String> {
    value.map_or(Ok(default), |value| {
        value
            .as_u64()
            .filter(|number| (1..=max).contains(number))
            .ok_or_else(|| format!("{name} must be an integer between 1 and {max}."))
    })
}

/// The warnings of a configuration that may also have errors: one per
/// unknown key, naming it (unless the name is not plain or holds the key).
pub fn unknown_key_warnings(value: &Value) -> Vec<String> {
    unknown_key_warnings_with_env(value, |name| std::env::var(name).ok())
}

fn unknown_key_warnings_with_env(value: &Value, env: impl Fn(&str) -> Option<String>) -> Vec<String> {
    let Value::Object(map) = value else { return Vec::new() };
    let secrets = possible_keys(map, env);
    map.keys()
        .filter(|name| !KNOWN_KEYS.contains(&name.as_str()))
        .map(|name| unknown_key_warning(name, &secrets))
        .collect()
}

/// Every value that may be an API key, trimmed and non-empty: each string in
/// `apiKey` (a string, or one put in an array or object by mistake) and
/// `CREATEOS_API_KEY`, whichever validation ends up using. A key name holding
/// any of them is not shown.
fn possible_keys(map: &Map<String, Value>, env: impl Fn(&str) -> Option<String>) -> Vec<Secret> {
    fn strings_in(value: &Value, found: &mut Vec<String>) {
        match value {
            Value::String(text) => found.push(text.clone()),
            Value::Array(items) => items.iter().for_each(|item| strings_in(item, found)),
            Value::Object(fields) => fields.values().for_each(|field| strings_in(field, found)),
            Value::Null | Value::Bool(_) | Value::Number(_) => {}
        }
    }
    let mut found = Vec::new();
    if let Some(api_key) = map.get("apiKey") {
        strings_in(api_key, &mut found);
    }
    found.extend(env(API_KEY_ENV));
    found.iter().map(|text| text.trim()).filter(|key| !key.is_empty()).map(Secret::new).collect()
}

fn unknown_key_warning(name: &str, secrets: &[Secret]) -> String {
    let plain = !name.is_empty()
        && name.len() <= 64
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    let has_key = secrets.iter().any(|key| name.contains(key.expose()));
    if plain && !has_key {
        match nearest_known_key(name) {
            Some(known) => format!("unknown config key {name} is ignored; did you mean {known}?"),
            None => format!("unknown config key {name} is ignored."),
        }
    } else {
        "an unknown config key is ignored (its name is not shown: it is not a plain name or contains the API key).".to_string()
    }
}

/// The known key `name` was most likely meant to be, when one is close
/// (case aside, Jaro-Winkler similarity of at least 0.85).
fn nearest_known_key(name: &str) -> Option<&'static str> {
    let name = name.to_ascii_lowercase();
    KNOWN_KEYS
        .iter()
        .map(|known| (strsim::jaro_winkler(&name, &known.to_ascii_lowercase()), *known))
        .filter(|(similarity, _)| *similarity >= 0.85)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, known)| known)
}

/// The JSON schema (draft 2020-12) of the provider config.
pub fn config_schema() -> Value {
    json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "CreateOS provider config",
        "type": "object",
        "required": ["shape"],
        "properties": {
            "apiUrl": {
                "type": "string",
                "format": "uri",
                "default": DEFAULT_API_URL,
                "description": "CreateOS API origin: https (plain http only on loopback), no user info, query or fragment; path empty, / or /v1."
            },
            "apiKey": {
                "type": "string",
                "writeOnly": true,
                "x-secret-scope": ["apiUrl"],
                "x-env": API_KEY_ENV,
                "description": "CreateOS API key; falls back to the CREATEOS_API_KEY environment variable. No CR, LF or NUL; at most 4096 bytes."
            },
            "shape": {
                "type": "string",
                "enum": SHAPES,
                "description": "Sandbox shape from the CreateOS catalog."
            },
            "rootfs": { "type": "string", "minLength": 1, "description": "Root filesystem image." },
            "region": { "type": "string", "minLength": 1, "description": "Region." },
            "timeoutMs": {
                "type": "integer",
                "minimum": 1,
                "maximum": MAX_TIMEOUT_MS,
                "default": DEFAULT_TIMEOUT_MS,
                "description": "Command timeout in milliseconds."
            },
            "reuseLease": {
                "type": "boolean",
                "default": false,
                "description": "Pause sandboxes on release for reuse instead of deleting them."
            },
            "requestsPerMinute": {
                "type": "integer",
                "minimum": 1,
                "maximum": MAX_REQUESTS_PER_MINUTE,
                "default": DEFAULT_REQUESTS_PER_MINUTE,
                "description": "The account's CreateOS rate limit (requests per minute), shared by every lease of this process."
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const KEY: &str = "sk_live_Zq8Xv4Lm2Pn7Rt5Wy1";

    fn no_env(_: &str) -> Option<String> {
        None
    }

    /// The configuration and its warnings, or its errors.
    fn parse(v: Value) -> Result<(ProviderConfig, Vec<String>), Vec<String>> {
        parse_with_env(&v, no_env).map(|config| (config, unknown_key_warnings_with_env(&v, no_env)))
    }

    #[test]
    fn good_configs() {
        // (config, apiUrl origin, timeoutMs, requestsPerMinute, reuseLease, warnings)
        let cases: Vec<(Value, &str, u64, u32, bool, usize)> = vec![
            (
                json!({"apiKey": KEY, "shape": "s-1vcpu-1gb"}),
                "https://api.sb.createos.sh",
                300_000,
                300,
                false,
                0,
            ),
            (
                json!({"apiKey": KEY, "shape": "s-0.25vcpu-512mb", "apiUrl": "https://example.com/v1/"}),
                "https://example.com",
                300_000,
                300,
                false,
                0,
            ),
            (
                json!({"apiKey": KEY, "shape": "s-8vcpu-16gb", "apiUrl": "http://127.0.0.1:8080/v1"}),
                "http://127.0.0.1:8080",
                300_000,
                300,
                false,
                0,
            ),
            (
                json!({"apiKey": KEY, "shape": "s-1vcpu-256mb", "apiUrl": "http://localhost:9/"}),
                "http://localhost:9",
                300_000,
                300,
                false,
                0,
            ),
            (
                json!({"apiKey": KEY, "shape": "s-1vcpu-256mb", "apiUrl": "http://[::1]:3000"}),
                "http://[::1]:3000",
                300_000,
                300,
                false,
                0,
            ),
            (
                json!({"apiKey": KEY, "shape": "s-1vcpu-256mb", "apiUrl": "http://127.9.9.9"}),
                "http://127.9.9.9",
                300_000,
                300,
                false,
                0,
            ),
            (
                json!({"apiKey": KEY, "shape": "s-2vcpu-4gb", "apiUrl": "https://EXAMPLE.com:443",
                       "timeoutMs": 1, "requestsPerMinute": 100000, "reuseLease": true,
                       "rootfs": "ubuntu-22.04", "region": "eu-1", "extra": 1}),
                "https://example.com",
                1,
                100_000,
                true,
                1,
            ),
            (
                json!({"apiKey": KEY, "shape": "s-1vcpu-1gb", "timeoutMs": 86_400_000,
                       "requestsPerMinute": 1, "rootfs": null, "region": null}),
                "https://api.sb.createos.sh",
                86_400_000,
                1,
                false,
                0,
            ),
        ];
        for (config, origin, timeout, rpm, reuse, n_warnings) in cases {
            let (c, warnings) = parse(config.clone()).unwrap_or_else(|e| panic!("{config}: {e:?}"));
            assert_eq!(c.origin(), origin, "{config}");
            assert_eq!(c.api_url.path(), "/");
            assert_eq!(c.timeout_ms, timeout);
            assert_eq!(c.requests_per_minute, rpm);
            assert_eq!(c.reuse_lease, reuse);
            assert_eq!(c.api_key.expose(), KEY);
            assert_eq!(warnings.len(), n_warnings, "{warnings:?}");
        }
    }

    #[test]
    fn bad_configs() {
        // (config, a substring of one of the errors)
        let cases: Vec<(Value, &str)> = vec![
            (json!([]), "must be a JSON object"),
            (json!("x"), "must be a JSON object"),
            (json!({"shape": "s-1vcpu-1gb"}), "CreateOS requires an API key"),
            (json!({"shape": "s-1vcpu-1gb", "apiKey": ""}), "CreateOS requires an API key"),
            (json!({"shape": "s-1vcpu-1gb", "apiKey": 5}), "apiKey must be a non-empty string."),
            (json!({"shape": "s-1vcpu-1gb", "apiKey": "a\nb"}), "control characters"),
            (json!({"shape": "s-1vcpu-1gb", "apiKey": "a\rb"}), "control characters"),
            (json!({"shape": "s-1vcpu-1gb", "apiKey": "a\0b"}), "control characters"),
            (json!({"shape": "s-1vcpu-1gb", "apiKey": "k".repeat(4097)}), "at most 4096 bytes long"),
            (json!({"apiKey": KEY}), "CreateOS requires a shape from its shape catalog."),
            (json!({"apiKey": KEY, "shape": "huge"}), "published CreateOS shapes"),
            (json!({"apiKey": KEY, "shape": 1}), "shape must be a string"),
            (
                json!({"apiKey": KEY, "shape": "s-1vcpu-1gb", "apiUrl": "http://example.com"}),
                "it uses http on a host that is not loopback; use https",
            ),
            (
                json!({"apiKey": KEY, "shape": "s-1vcpu-1gb", "apiUrl": "ftp://example.com"}),
                "its scheme must be https",
            ),
            (json!({"apiKey": KEY, "shape": "s-1vcpu-1gb", "apiUrl": "example.com"}), "absolute URL"),
            (
                json!({"apiKey": KEY, "shape": "s-1vcpu-1gb", "apiUrl": "https://u:p@example.com"}),
                "user info",
            ),
            (json!({"apiKey": KEY, "shape": "s-1vcpu-1gb", "apiUrl": "https://u@example.com"}), "user info"),
            (json!({"apiKey": KEY, "shape": "s-1vcpu-1gb", "apiUrl": "https://example.com/?a=1"}), "query"),
            (json!({"apiKey": KEY, "shape": "s-1vcpu-1gb", "apiUrl": "https://example.com/?"}), "query"),
            (json!({"apiKey": KEY, "shape": "s-1vcpu-1gb", "apiUrl": "https://example.com/#f"}), "fragment"),
            (json!({"apiKey": KEY, "shape": "s-1vcpu-1gb", "apiUrl": "https://example.com/v2"}), "path"),
            (json!({"apiKey": KEY, "shape": "s-1vcpu-1gb", "apiUrl": "https://example.com/v1/x"}), "path"),
            (
                json!({"apiKey": KEY, "shape": "s-1vcpu-1gb", "apiUrl": "http://127.0.0.1.example.com"}),
                "it uses http on a host that is not loopback; use https",
            ),
            (json!({"apiKey": KEY, "shape": "s-1vcpu-1gb", "apiUrl": 3}), "apiUrl must be a string"),
            (
                json!({"apiKey": KEY, "shape": "s-1vcpu-1gb", "rootfs": ""}),
                "rootfs must be a non-empty string.",
            ),
            (json!({"apiKey": KEY, "shape": "s-1vcpu-1gb", "rootfs": "a\tb"}), "must not contain control"),
            (
                json!({"apiKey": KEY, "shape": "s-1vcpu-1gb", "region": 1}),
                "region must be a non-empty string.",
            ),
            (json!({"apiKey": KEY, "shape": "s-1vcpu-1gb", "timeoutMs": 0}), "timeoutMs must be an integer"),
            (json!({"apiKey": KEY, "shape": "s-1vcpu-1gb", "timeoutMs": 86_400_001}), "timeoutMs"),
            (json!({"apiKey": KEY, "shape": "s-1vcpu-1gb", "timeoutMs": 1.5}), "timeoutMs"),
            (json!({"apiKey": KEY, "shape": "s-1vcpu-1gb", "timeoutMs": 1000.0}), "timeoutMs"),
            (json!({"apiKey": KEY, "shape": "s-1vcpu-1gb", "timeoutMs": "1000"}), "timeoutMs"),
            (json!({"apiKey": KEY, "shape": "s-1vcpu-1gb", "timeoutMs": -5}), "timeoutMs"),
            (json!({"apiKey": KEY, "shape": "s-1vcpu-1gb", "requestsPerMinute": 0}), "requestsPerMinute"),
            (
                json!({"apiKey": KEY, "shape": "s-1vcpu-1gb", "requestsPerMinute": 100_001}),
                "requestsPerMinute",
            ),
            (
                json!({"apiKey": KEY, "shape": "s-1vcpu-1gb", "reuseLease": "true"}),
                "reuseLease must be a boolean",
            ),
        ];
        for (config, needle) in cases {
            let errors = parse(config.clone()).expect_err(&config.to_string());
            assert!(errors.iter().any(|e| e.contains(needle)), "{config}: {errors:?} lacks {needle}");
            for e in &errors {
                assert!(!e.contains(KEY) && !e.contains('\n'), "{e}");
            }
        }
    }

    #[test]
    fn every_problem_is_reported_at_once() {
        let errors = parse(json!({
            "apiUrl": "http://example.com", "shape": "x", "timeoutMs": 0,
            "requestsPerMinute": "a", "reuseLease": 1, "rootfs": "", "region": 2
        }))
        .unwrap_err();
        assert_eq!(errors.len(), 8, "{errors:?}");
    }

    #[test]
    fn api_key_falls_back_to_env() {
        let env = |name: &str| (name == API_KEY_ENV).then(|| "from-env".to_string());
        let c = parse_with_env(&json!({"shape": "s-1vcpu-1gb"}), env).unwrap();
        assert_eq!(c.api_key.expose(), "from-env");
        let c = parse_with_env(&json!({"shape": "s-1vcpu-1gb", "apiKey": "k"}), env).unwrap();
        assert_eq!(c.api_key.expose(), "k");
        let bad_env = |_: &str| Some("a\nb".to_string());
        let errors = parse_with_env(&json!({"shape": "s-1vcpu-1gb"}), bad_env).unwrap_err();
        assert!(errors[0].contains(API_KEY_ENV));
    }

    /// The reference provider's wording (`resolveApiKey`).
    const REFERENCE_MISSING_KEY: &str =
        "CreateOS requires an API key in the environment config or CREATEOS_API_KEY.";

    #[test]
    fn an_empty_or_blank_key_anywhere_gives_the_reference_missing_key_message() {
        // (apiKey in the config, CREATEOS_API_KEY)
        let cases: [(Value, Option<&str>); 8] = [
            (Value::Null, None),
            (Value::Null, Some("")),
            (Value::Null, Some("   ")),
            (Value::Null, Some("\n")),
            (json!(""), None),
            (json!(""), Some("")),
            (json!(" \t "), None),
            (json!(" "), Some(" ")),
        ];
        for (api_key, from_env) in cases {
            let env = |name: &str| from_env.filter(|_| name == "CREATEOS_API_KEY").map(str::to_string);
            let config = json!({"shape": "s-1vcpu-1gb", "apiKey": api_key});
            let errors = parse_with_env(&config, env).unwrap_err();
            assert_eq!(errors, [REFERENCE_MISSING_KEY], "{config} with CREATEOS_API_KEY={from_env:?}");
        }
    }

    #[test]
    fn keys_are_used_trimmed_like_the_reference() {
        // (apiKey in the config, CREATEOS_API_KEY, the key used)
        let cases: [(Value, Option<&str>, &str); 4] = [
            (json!(" k1 "), None, "k1"),
            (Value::Null, Some("k2\n"), "k2"),
            (Value::Null, Some("  k3"), "k3"),
            (json!("  "), Some("k4"), "k4"),
        ];
        for (api_key, from_env, used) in cases {
            let env = |name: &str| from_env.filter(|_| name == "CREATEOS_API_KEY").map(str::to_string);
            let config = json!({"shape": "s-1vcpu-1gb", "apiKey": api_key});
            let parsed = parse_with_env(&config, env).unwrap();
            assert_eq!(parsed.api_key.expose(), used, "{config} with CREATEOS_API_KEY={from_env:?}");
        }
    }

    #[test]
    fn a_null_config_counts_as_an_empty_object() {
        let env = |_: &str| Some(KEY.to_string());
        let null = parse_with_env(&Value::Null, env).unwrap_err();
        assert_eq!(null, ["CreateOS requires a shape from its shape catalog."]);
        assert_eq!(null, parse_with_env(&json!({}), env).unwrap_err());
        let errors = parse(Value::Null).unwrap_err();
        assert_eq!(errors, [REFERENCE_MISSING_KEY, "CreateOS requires a shape from its shape catalog."]);
        // Any other non-object is refused.
        for not_an_object in [json!(false), json!(0), json!("{}"), json!([{}])] {
            assert_eq!(
                parse_with_env(&not_an_object, env).unwrap_err(),
                ["CreateOS config must be a JSON object."]
            );
        }
    }

    #[test]
    fn normalized_json_omits_the_key_and_secret_is_redacted() {
        let (c, _) = parse(json!({"apiKey": KEY, "shape": "s-1vcpu-1gb",
                                  "apiUrl": "https://example.com:8443/v1", "region": "r"}))
        .unwrap();
        let n = c.normalized_json();
        assert_eq!(
            n,
            json!({"apiUrl": "https://example.com:8443", "shape": "s-1vcpu-1gb", "region": "r",
                   "timeoutMs": 300000, "reuseLease": false, "requestsPerMinute": 300})
        );
        assert!(!n.to_string().contains(KEY));
        assert!(!format!("{c:?}").contains(KEY));
        assert_eq!(c.api_key.to_string(), "[redacted]");
        assert_eq!(format!("{:?}", c.api_key), "[redacted]");
        // Normalising is idempotent.
        let mut again = n.clone();
        again["apiKey"] = json!(KEY);
        assert_eq!(parse(again).unwrap().0, c);
    }

    #[test]
    fn a_misspelt_key_gets_the_nearest_known_one() {
        for (typed, meant) in
            [("reuselease", "reuseLease"), ("apikey", "apiKey"), ("timeout", "timeoutMs"), ("shap", "shape")]
        {
            let mut config = json!({"apiKey": KEY, "shape": "s-1vcpu-1gb"});
            config[typed] = json!(1);
            let (_, warnings) = parse(config).unwrap();
            assert_eq!(warnings, [format!("unknown config key {typed} is ignored; did you mean {meant}?")]);
        }
    }

    #[test]
    fn an_unknown_key_is_named_only_when_short_and_plain() {
        let sixty_four = "k".repeat(64);
        let sixty_five = "k".repeat(65);
        let with_key = format!("x-{KEY}");
        // (unknown key, named in the warning)
        let cases: [(&str, bool); 11] = [
            ("colour", true),
            ("my_key", true),
            ("x-y", true),
            ("Volume2", true),
            (&sixty_four, true),
            (&sixty_five, false),
            (&with_key, false),
            ("", false),
            ("a b", false),
            ("a.b", false),
            ("clé", false),
        ];
        for (name, named) in cases {
            let mut config = json!({"apiKey": KEY, "shape": "s-1vcpu-1gb"});
            config[name] = json!(1);
            let (_, warnings) = parse(config).unwrap();
            let expected = if named {
                format!("unknown config key {name} is ignored.")
            } else {
                "an unknown config key is ignored (its name is not shown: it is not a plain name or contains the API key).".into()
            };
            assert_eq!(warnings, [expected], "{name:?}");
        }
    }

    #[test]
    fn unknown_keys_warn_without_leaking() {
        let (_, w) = parse(json!({"apiKey": KEY, "shape": "s-1vcpu-1gb", "colour": 1,
                                  "x-sk_live_Zq8Xv4Lm2Pn7Rt5Wy1": 2, "a b": 3}))
        .unwrap();
        assert_eq!(w.len(), 3);
        assert!(w.iter().any(|w| w.contains("colour")));
        assert!(w.iter().all(|w| !w.contains(KEY) && !w.contains("a b")));
    }

    #[test]
    fn unknown_keys_are_named_beside_errors() {
        // A config with errors still warns of its unknown keys (and of
        // nothing else), by the same rule as a valid one.
        let config = json!({"apiKey": KEY, "shape": "s-9vcpu", "timeoutMs": 0, "colour": 1});
        assert!(parse(config.clone()).is_err());
        assert_eq!(unknown_key_warnings(&config), ["unknown config key colour is ignored."]);
        // The config's own API key hides a name that holds it, whatever the
        // environment says.
        let mut config = json!({"apiKey": KEY, "shape": "s-9vcpu"});
        config[format!("x-{KEY}")] = json!(1);
        assert_eq!(
            unknown_key_warnings(&config),
            ["an unknown config key is ignored (its name is not shown: it is not a plain name or contains the API key)."]
        );
        assert!(unknown_key_warnings(&json!(["colour"])).is_empty());
    }

    #[test]
    fn unknown_keys_are_hidden_by_the_key_as_it_is_used() {
        // The key is used trimmed, so a name holding the trimmed key holds
        // the key, wherever the key comes from.
        let hidden = ["an unknown config key is ignored (its name is not shown: it is not a plain name or contains the API key)."];
        let mut config = json!({"apiKey": format!("  {KEY}\t"), "shape": "s-9vcpu"});
        config[format!("x-{KEY}")] = json!(1);
        assert_eq!(unknown_key_warnings_with_env(&config, no_env), hidden);
        let mut config = json!({"apiKey": " ", "shape": "s-9vcpu"});
        config[format!("x-{KEY}")] = json!(1);
        let padded_env = |name: &str| (name == API_KEY_ENV).then(|| format!(" {KEY} "));
        assert_eq!(unknown_key_warnings_with_env(&config, padded_env), hidden);
        // An empty or blank CREATEOS_API_KEY is no key: it hides nothing.
        for blank in ["", "  "] {
            let env = |name: &str| (name == API_KEY_ENV).then(|| blank.to_string());
            let config = json!({"shape": "s-9vcpu", "colour": 1});
            assert_eq!(
                unknown_key_warnings_with_env(&config, env),
                ["unknown config key colour is ignored."],
                "CREATEOS_API_KEY={blank:?}"
            );
        }
    }

    #[test]
    fn every_key_that_may_be_used_hides_a_name_holding_it() {
        // The environment's key when apiKey is not a string, the
        // environment's key beside another apiKey, and a string put in an
        // array by mistake: each is a secret, whichever validation uses.
        let hidden = "an unknown config key is ignored (its name is not shown: it is not a plain name or contains the API key).";
        let env = |name: &str| (name == API_KEY_ENV).then(|| KEY.to_string());
        for api_key in [json!(5), json!("k-123"), json!(["other_secret_9"]), json!({"k": "other_secret_9"})] {
            let mut config = json!({"apiKey": api_key, "shape": "s-1vcpu-1gb"});
            config[KEY] = json!(1);
            config["x-other_secret_9"] = json!(1);
            let warnings = unknown_key_warnings_with_env(&config, env);
            let in_api_key = matches!(config["apiKey"], Value::Array(_) | Value::Object(_));
            assert!(warnings.iter().all(|w| !w.contains(KEY)), "{warnings:?}");
            assert!(!in_api_key || warnings.iter().all(|w| !w.contains("other_secret_9")), "{warnings:?}");
            let named = warnings.iter().filter(|w| w.starts_with("unknown config key")).count();
            let expected_named = usize::from(!in_api_key);
            assert_eq!(named, expected_named, "{api_key}: {warnings:?}");
            assert_eq!(warnings.iter().filter(|w| *w == hidden).count(), 2 - expected_named, "{warnings:?}");
        }
    }

    #[test]
    fn schema_lists_the_catalog() {
        let schema = config_schema();
        assert_eq!(schema["properties"]["shape"]["enum"], json!(SHAPES));
        assert_eq!(schema["required"], json!(["shape"]));
        assert_eq!(SHAPES.len(), 11);
    }

    #[test]
    fn from_json_joins_errors_into_one_line() {
        let err =
            ProviderConfig::from_json(&json!({"apiKey": KEY, "shape": "x", "timeoutMs": 0})).unwrap_err();
        let msg = err.to_string();
        assert!(msg.starts_with("Invalid CreateOS config: "), "{msg}");
        assert!(msg.contains("shape") && msg.contains("timeoutMs") && !msg.contains('\n'));
    }

    fn hostile_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            any::<u64>().prop_map(|n| json!(n)),
            any::<f64>().prop_map(|f| json!(f)),
            ".*".prop_map(Value::String),
            Just(json!(KEY)),
            Just(json!(format!("https://{KEY}@x.com/?k={KEY}#{KEY}"))),
            prop::sample::select(SHAPES).prop_map(|s| json!(s)),
        ];
        leaf.prop_recursive(4, 32, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::hash_map(
                    prop_oneof![
                        prop::sample::select(KNOWN_KEYS).prop_map(str::to_string),
                        ".*",
                        Just(KEY.to_string()),
                    ],
                    inner,
                    0..6
                )
                .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    fn hostile_config() -> impl Strategy<Value = Value> {
        prop::collection::hash_map(
            prop_oneof![
                prop::sample::select(KNOWN_KEYS).prop_map(str::to_string),
                ".{0,8}",
                Just(format!("{KEY}!")),
            ],
            hostile_value(),
            0..10,
        )
        .prop_map(|m| {
            let mut m: Map<String, Value> = m.into_iter().collect();
            m.insert("apiKey".into(), json!(KEY));
            Value::Object(m)
        })
    }

    proptest! {
        #[test]
        fn hostile_values_never_panic_or_leak(v in prop_oneof![hostile_value(), hostile_config()]) {
            let env = |_: &str| Some(KEY.to_string());
            let (messages, normalized) = match parse_with_env(&v, env) {
                Ok(c) => (unknown_key_warnings_with_env(&v, env), Some(c.normalized_json())),
                Err(e) => (e, None),
            };
            for m in &messages {
                prop_assert!(!m.contains(KEY), "{}", m);
                prop_assert!(!m.contains('\n') && !m.contains('\r'), "{}", m);
            }
            if let Some(n) = normalized {
                prop_assert!(n.get("apiKey").is_none());
            }
            if let Err(e) = ProviderConfig::from_json(&v) {
                prop_assert!(!e.to_string().contains(KEY));
            }
        }
    }
}
