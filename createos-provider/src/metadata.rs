//! Lease metadata: what the provider stores with a lease, and the ownership
//! check every lease hook starts with. Never holds the API key.

use crate::{config::ProviderConfig, error::Error};
use provider_abi::EnvironmentParams;
use serde::{Deserialize, Serialize};

/// The provider name stored in every lease.
pub const PROVIDER: &str = "createos";
/// The workspace directory inside every sandbox.
pub const REMOTE_CWD: &str = "/paperclip-workspace";
/// Where the lease's marker file lives inside the sandbox.
pub const MARKER_PATH: &str = "/paperclip-workspace/.paperclip-runtime/.paperclip-createos-lease";
/// The directory holding the marker.
pub const RUNTIME_DIR: &str = "/paperclip-workspace/.paperclip-runtime";

/// The lease metadata, as JSON (camelCase) in `Lease::metadata_json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LeaseMetadata {
    /// Always `createos`.
    pub provider: String,
    /// The API origin the sandbox lives on.
    pub api_url: String,
    /// The owning company.
    pub company_id: String,
    /// The owning environment.
    pub environment_id: String,
    /// The workspace directory.
    pub remote_cwd: String,
    /// A random UUID written into the sandbox, read back on resume.
    pub marker: String,
    /// The shape the sandbox was created with.
    pub shape: String,
    /// The root filesystem it was created with.
    pub rootfs: Option<String>,
    /// The region it was created in.
    pub region: Option<String>,
    /// Whether release pauses (true) or deletes (false).
    pub reuse_lease: bool,
}

impl LeaseMetadata {
    /// Metadata for a new lease of `env` under `config`.
    pub fn new(env: &EnvironmentParams, config: &ProviderConfig) -> Self {
        Self {
            provider: PROVIDER.into(),
            api_url: config.origin(),
            company_id: env.company_id.to_string(),
            environment_id: env.environment_id.to_string(),
            remote_cwd: REMOTE_CWD.into(),
            marker: uuid::Uuid::new_v4().to_string(),
            shape: config.shape.clone(),
            rootfs: config.rootfs.clone(),
            region: config.region.clone(),
            reuse_lease: config.reuse_lease,
        }
    }

    /// The metadata as JSON text.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("lease metadata serialises")
    }

    /// Parses the metadata of a lease and checks that it belongs to `env`
    /// under `config`: same provider, company, environment and API origin.
    /// Anything else, malformed metadata included, is "not this environment".
    pub fn owned(text: &str, env: &EnvironmentParams, config: &ProviderConfig) -> Result<Self, Error> {
        let metadata: LeaseMetadata = serde_json::from_str(text).map_err(|_| Error::NotThisEnvironment)?;
        let owned = metadata.provider == PROVIDER
            && metadata.company_id == env.company_id.as_str()
            && metadata.environment_id == env.environment_id.as_str()
            && metadata.api_url == config.origin();
        if owned {
            Ok(metadata)
        } else {
            Err(Error::NotThisEnvironment)
        }
    }

    /// True when the configuration asks for another kind of sandbox.
    pub fn config_changed(&self, config: &ProviderConfig) -> bool {
        self.shape != config.shape || self.rootfs != config.rootfs || self.region != config.region
    }

    /// True when the marker is a well-formed UUID.
    pub fn marker_is_well_formed(&self) -> bool {
        uuid::Uuid::parse_str(&self.marker).is_ok_and(|uuid| uuid.hyphenated().to_string() == self.marker)
    }
}
