//! What is secret in a provider's configuration, by the provider's own
//! account: the top-level properties its manifest's JSON schema marks
//! `writeOnly`. The host never names a provider's configuration keys.
//!
//! A secret is never stored (the ledger keeps the configuration without it).
//! When a stored lease is acted on later (`sweep`), the secret comes from the
//! current configuration, and only for a lease of the same account: the
//! stored and current configurations must agree on every property the
//! schema lists in the secret's `x-secret-scope` (for CreateOS, `apiUrl`: a
//! key is never sent to another API), or on every property when it lists
//! none. Both sides are the provider's normalised configuration, so the
//! comparison uses the provider's own spelling of each value.
//!
//! Nor is a credential carried inside a URL: a stored or shown configuration
//! keeps no URL's user information (`user:key@`) or query (`?k=key`), in
//! whatever property it is.

use provider_abi::Manifest;
use serde_json::Value;

/// One secret property of a configuration schema.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Secret {
    /// The property name.
    name: String,
    /// The properties that say which account the secret belongs to (empty:
    /// the whole rest of the configuration).
    scope: Vec<String>,
}

/// The secret properties of a provider's configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SecretFields {
    secrets: Vec<Secret>,
}

impl SecretFields {
    /// The secrets the provider's configuration schema declares.
    pub fn of(manifest: &Manifest) -> Self {
        Self::from_schema(&serde_json::from_str(&manifest.config_schema_json).unwrap_or(Value::Null))
    }

    /// The secrets a JSON schema declares (`writeOnly` top-level properties).
    pub fn from_schema(schema: &Value) -> Self {
        let properties = schema.get("properties").and_then(Value::as_object);
        let secrets = properties
            .into_iter()
            .flatten()
            .filter(|(_, property)| property.get("writeOnly").and_then(Value::as_bool) == Some(true))
            .map(|(name, property)| Secret {
                name: name.clone(),
                scope: property
                    .get("x-secret-scope")
                    .and_then(Value::as_array)
                    .map(|names| names.iter().filter_map(Value::as_str).map(str::to_owned).collect())
                    .unwrap_or_default(),
            })
            .collect();
        Self { secrets }
    }

    /// `config` without its secrets, nor any URL's user information or
    /// query: what may be stored or shown.
    pub fn strip(&self, config: &Value) -> Value {
        let mut config = config.clone();
        if let Value::Object(object) = &mut config {
            for secret in &self.secrets {
                object.remove(&secret.name);
            }
        }
        strip_url_credentials(&mut config);
        config
    }

    /// The non-empty secret values `config` holds (to check no output shows them).
    pub fn values<'a>(&self, config: &'a Value) -> Vec<&'a str> {
        self.secrets
            .iter()
            .filter_map(|secret| config.get(&secret.name).and_then(Value::as_str))
            .filter(|value| !value.is_empty())
            .collect()
    }

    /// A stored (secret-free) configuration with the secrets of `current`
    /// added back, each only where `stored` belongs to the same account as
    /// `current_stored` (the current configuration without secrets).
    pub fn restore(&self, stored: &Value, current: &Value, current_stored: &Value) -> Value {
        let mut restored = stored.clone();
        if let Value::Object(object) = &mut restored {
            for secret in &self.secrets {
                let Some(value) = current.get(&secret.name) else { continue };
                if same_account(&secret.scope, stored, current_stored) {
                    object.insert(secret.name.clone(), value.clone());
                }
            }
        }
        restored
    }
}

/// Removes the user information and query of every URL string in `value`.
fn strip_url_credentials(value: &mut Value) {
    match value {
        Value::String(text) => strip_credentials(text),
        Value::Array(items) => items.iter_mut().for_each(strip_url_credentials),
        Value::Object(object) => object.values_mut().for_each(strip_url_credentials),
        _ => {}
    }
}

/// Removes the user information and query of `text` when it is a URL that
/// carries either; any other text is kept as it is.
fn strip_credentials(text: &mut String) {
    let Some(mut url) = url::Url::parse(text).ok().filter(|url| !url.cannot_be_a_base()) else { return };
    if url.username().is_empty() && url.password().is_none() && url.query().is_none() {
        return;
    }
    // Neither fails on a URL that can be a base.
    let _ = url.set_username("");
    let _ = url.set_password(None);
    url.set_query(None);
    *text = url.into();
}

/// True when `a` and `b` agree on every property of `scope` (a value that
/// is no object has none), or are equal when `scope` is empty.
fn same_account(scope: &[String], a: &Value, b: &Value) -> bool {
    if scope.is_empty() {
        return a == b;
    }
    scope.iter().all(|name| a.get(name) == b.get(name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn fields() -> SecretFields {
        SecretFields::from_schema(&json!({"properties": {
            "token": {"type": "string", "writeOnly": true, "x-secret-scope": ["endpoint"]},
            "pin": {"type": "string", "writeOnly": true},
            "endpoint": {"type": "string"},
            "size": {"type": "string", "writeOnly": false},
        }}))
    }

    #[test]
    fn strips_exactly_the_write_only_properties() {
        let config = json!({"token": "t0k", "pin": "1234", "endpoint": "e", "size": "s"});
        assert_eq!(fields().strip(&config), json!({"endpoint": "e", "size": "s"}));
        let mut values = fields().values(&config);
        values.sort();
        assert_eq!(values, ["1234", "t0k"]);
        assert_eq!(SecretFields::from_schema(&json!({"type": "object"})).strip(&config), config);
    }

    #[test]
    fn strips_the_credentials_of_every_url() {
        let config = json!({
            "endpoint": "http://user:KEY@127.0.0.1:8080/v1?k=KEY",
            "mirrors": ["https://example.com/?token=KEY", "https://example.com/plain"],
            "nested": {"url": "https://KEY@example.com"},
            "size": "s-1vcpu-1gb",
            "note": "a:KEY",
        });
        assert_eq!(
            fields().strip(&config),
            json!({
                "endpoint": "http://127.0.0.1:8080/v1",
                "mirrors": ["https://example.com/", "https://example.com/plain"],
                "nested": {"url": "https://example.com/"},
                "size": "s-1vcpu-1gb",
                "note": "a:KEY",
            })
        );
    }

    #[test]
    fn restores_a_secret_only_for_the_same_account() {
        let current = json!({"token": "t0k", "pin": "1234", "endpoint": "e", "size": "s"});
        let current_stored = fields().strip(&current);
        // Same endpoint, another size: the scoped token comes back, the
        // unscoped pin (whole configuration must match) does not.
        let other_size = json!({"endpoint": "e", "size": "xl"});
        assert_eq!(
            fields().restore(&other_size, &current, &current_stored),
            json!({"endpoint": "e", "size": "xl", "token": "t0k"})
        );
        // Another endpoint: no secret travels there.
        let elsewhere = json!({"endpoint": "https://elsewhere", "size": "s"});
        assert_eq!(fields().restore(&elsewhere, &current, &current_stored), elsewhere);
        // Identical configuration: both come back.
        assert_eq!(fields().restore(&current_stored, &current, &current_stored), current);
    }
}
