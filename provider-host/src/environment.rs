//! The environment a host acts for: who is asking (company, environment),
//! which provider, with what configuration, and where its API lives.

use provider_abi::EnvironmentParams;
use serde_json::Value;

/// The environment a host acts for, sent with every hook.
#[derive(Debug, Clone, PartialEq)]
pub struct Environment {
    /// The provider's driver key; the manifest's when `None`.
    pub driver_key: Option<String>,
    /// The company id sent with every hook.
    pub company_id: String,
    /// The environment id sent with every hook.
    pub environment_id: String,
    /// The provider configuration.
    pub config: Value,
    /// True when the API the provider talks to lives in this process (an
    /// API served in process, for tests or offline runs): its sandboxes are
    /// gone with the process, and the ledger says so for a later sweep.
    pub api_in_process: bool,
}

impl Environment {
    /// The environment `environment_id` of `company_id`, with the provider
    /// configuration `config` and the manifest's driver key.
    pub fn new(company_id: impl Into<String>, environment_id: impl Into<String>, config: Value) -> Self {
        Self {
            driver_key: None,
            company_id: company_id.into(),
            environment_id: environment_id.into(),
            config,
            api_in_process: false,
        }
    }

    /// The hook parameters for this environment; `manifest_driver_key` is
    /// the provider's, used when the environment names none.
    pub fn params(&self, manifest_driver_key: &str) -> EnvironmentParams {
        EnvironmentParams {
            driver_key: self.driver_key.as_deref().unwrap_or(manifest_driver_key).into(),
            company_id: self.company_id.as_str().into(),
            environment_id: self.environment_id.as_str().into(),
            config_json: self.config.to_string().into(),
            extensions_json: Default::default(),
        }
    }
}
