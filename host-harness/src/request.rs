//! The harness configuration file: provider config plus who is asking.

use provider_abi::EnvironmentParams;
use serde_json::Value;
use std::{io::Read, path::Path};

/// The environment a harness command acts for.
#[derive(Debug, Clone, PartialEq)]
pub struct HarnessConfig {
    /// The provider's driver key; the manifest's when the file names none.
    pub driver_key: Option<String>,
    /// The company id sent with every hook.
    pub company_id: String,
    /// The environment id sent with every hook.
    pub environment_id: String,
    /// The provider configuration.
    pub config: Value,
}

/// Company used when the configuration file names none.
pub const DEFAULT_COMPANY: &str = "harness-company";
/// Environment used when the configuration file names none.
pub const DEFAULT_ENVIRONMENT: &str = "harness-environment";

impl HarnessConfig {
    /// A configuration for `config` with the default company and environment.
    pub fn for_config(config: Value) -> Self {
        Self {
            driver_key: None,
            company_id: DEFAULT_COMPANY.into(),
            environment_id: DEFAULT_ENVIRONMENT.into(),
            config,
        }
    }

    /// Reads a configuration file (`-` for stdin).
    ///
    /// Either `{"companyId", "environmentId", "driverKey"?, "config": {...}}`
    /// or a bare provider configuration object.
    pub fn read(path: &Path) -> Result<Self, String> {
        let text = read_text(path)?;
        Self::parse(&text).map_err(|error| format!("{}: {error}", path.display()))
    }

    /// Parses the text of a configuration file.
    pub fn parse(text: &str) -> Result<Self, String> {
        let value: Value = serde_json::from_str(text).map_err(|error| format!("not valid JSON ({error})"))?;
        let Value::Object(mut object) = value else {
            return Err("the configuration must be a JSON object".into());
        };
        let Some(config) = object.remove("config") else {
            return Ok(Self::for_config(Value::Object(object)));
        };
        let text_field =
            |object: &serde_json::Map<String, Value>, key: &str| -> Result<Option<String>, String> {
                match object.get(key) {
                    None => Ok(None),
                    Some(Value::String(text)) if !text.trim().is_empty() => Ok(Some(text.clone())),
                    Some(_) => Err(format!("`{key}` must be a non-empty string")),
                }
            };
        Ok(Self {
            driver_key: text_field(&object, "driverKey")?,
            company_id: text_field(&object, "companyId")?.unwrap_or_else(|| DEFAULT_COMPANY.into()),
            environment_id: text_field(&object, "environmentId")?
                .unwrap_or_else(|| DEFAULT_ENVIRONMENT.into()),
            config,
        })
    }

    /// The hook parameters for this environment.
    pub fn environment(&self, manifest_driver_key: &str) -> EnvironmentParams {
        EnvironmentParams {
            driver_key: self.driver_key.as_deref().unwrap_or(manifest_driver_key).into(),
            company_id: self.company_id.as_str().into(),
            environment_id: self.environment_id.as_str().into(),
            config_json: self.config.to_string().into(),
        }
    }
}

/// Reads a whole file, or stdin for `-`.
pub fn read_text(path: &Path) -> Result<String, String> {
    if path == Path::new("-") {
        let mut text = String::new();
        std::io::stdin().read_to_string(&mut text).map_err(|error| format!("cannot read stdin: {error}"))?;
        Ok(text)
    } else {
        std::fs::read_to_string(path).map_err(|error| format!("cannot read {}: {error}", path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_both_file_shapes_and_rejects_bad_ones() {
        let bare = HarnessConfig::parse(r#"{"shape":"s-1vcpu-1gb"}"#).unwrap();
        assert_eq!(bare.config, json!({"shape": "s-1vcpu-1gb"}));
        assert_eq!(bare.company_id, DEFAULT_COMPANY);
        let full =
            HarnessConfig::parse(r#"{"companyId":"c","environmentId":"e","config":{"shape":"x"}}"#).unwrap();
        assert_eq!((full.company_id.as_str(), full.environment_id.as_str()), ("c", "e"));
        for bad in ["[]", "nope", r#"{"companyId":5,"config":{}}"#] {
            let error = HarnessConfig::parse(bad).unwrap_err();
            assert!(!error.contains('\n'), "{error}");
        }
    }
}
