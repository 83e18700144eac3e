//! FFI-safe parameters and results of the hooks.
//!
//! Every type here is part of the frozen ABI 2.x layout: changing a field is a
//! major version bump (see [`crate::module`] for how inputs grow). JSON values
//! cross as JSON text (`*_json` fields).

use crate::version::AbiVersion;
use abi_stable::{
    std_types::{ROption, RString, RVec},
    StableAbi,
};

/// Who the host is; passed to `setup`.
#[repr(C)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(StableAbi, Clone, Debug, Default, PartialEq, Eq)]
pub struct SetupParams {
    /// The host's name, for provider logs.
    pub host_name: RString,
    /// The host's version.
    pub host_version: RString,
}

impl SetupParams {
    /// A host named `host_name` at version `host_version`.
    pub fn new(host_name: impl Into<RString>, host_version: impl Into<RString>) -> Self {
        SetupParams { host_name: host_name.into(), host_version: host_version.into() }
    }
}

/// The provider's identity and capabilities.
#[repr(C)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(StableAbi, Clone, Debug, PartialEq, Eq)]
pub struct Manifest {
    /// Stable identifier, e.g. `createos`.
    pub id: RString,
    /// The provider's own version (semver).
    pub version: RString,
    /// Human-readable name.
    pub display_name: RString,
    /// The environment driver this provider serves (the `driverKey`).
    pub driver_key: RString,
    /// The ABI version the provider was built against (set by the export layer).
    pub abi_version: AbiVersion,
    /// Names of the hooks the provider implements (see [`crate::Hook::name`]).
    pub hooks: RVec<RString>,
    /// JSON schema of the provider configuration.
    pub config_schema_json: RString,
}

/// Health of a loaded provider.
#[repr(C)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(StableAbi, Clone, Debug, PartialEq, Eq)]
pub struct HealthReport {
    /// `ok`, `degraded` or `error`.
    pub status: RString,
    /// A one-line explanation.
    pub message: RString,
}

/// The environment a hook acts for: who asks and with which configuration.
#[repr(C)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(StableAbi, Clone, Debug, Default, PartialEq, Eq)]
pub struct EnvironmentParams {
    /// The environment driver, e.g. `createos`.
    pub driver_key: RString,
    /// The company owning the environment.
    pub company_id: RString,
    /// The environment.
    pub environment_id: RString,
    /// The provider configuration as a JSON object.
    pub config_json: RString,
    /// Inputs added by later minor versions, as a JSON object (empty: none).
    /// A provider ignores keys it does not know.
    pub extensions_json: RString,
}

/// The outcome of `validate_config`.
#[repr(C)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(StableAbi, Clone, Debug, PartialEq, Eq)]
pub struct ValidationReport {
    /// True when the configuration can be used.
    pub ok: bool,
    /// The normalised configuration (without secrets) when `ok`.
    pub normalized_config_json: ROption<RString>,
    /// Every problem found, one line each.
    pub errors: RVec<RString>,
    /// Non-fatal remarks (unknown keys...).
    pub warnings: RVec<RString>,
}

/// The outcome of `probe`: can this environment run work?
#[repr(C)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(StableAbi, Clone, Debug, PartialEq, Eq)]
pub struct ProbeReport {
    /// True when a real command ran and cleanup was confirmed.
    pub ok: bool,
    /// A one-line summary.
    pub message: RString,
    /// Details as a JSON object.
    pub metadata_json: RString,
}

/// Parameters of `acquire_lease`.
#[repr(C)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(StableAbi, Clone, Debug, Default, PartialEq, Eq)]
pub struct AcquireParams {
    /// The environment.
    pub env: EnvironmentParams,
    /// The run the lease is for.
    pub run_id: RString,
    /// An expiry the host would like (RFC 3339), if any.
    pub requested_expires_at: ROption<RString>,
}

/// A lease on a remote sandbox, as returned by `acquire_lease` and `resume_lease`.
#[repr(C)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(StableAbi, Clone, Debug, Default, PartialEq, Eq)]
pub struct Lease {
    /// The remote resource id; `None` when the lease has expired.
    pub provider_lease_id: ROption<RString>,
    /// Provider-owned metadata (JSON object) the host stores and hands back.
    pub metadata_json: RString,
    /// When the lease expires (RFC 3339), if the provider guarantees one.
    pub expires_at: ROption<RString>,
    /// True when the lease is gone and a new one must be acquired.
    pub expired: bool,
}

/// Parameters of the hooks that act on an existing lease.
#[repr(C)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(StableAbi, Clone, Debug, Default, PartialEq, Eq)]
pub struct LeaseParams {
    /// The environment.
    pub env: EnvironmentParams,
    /// The run acting on the lease.
    pub run_id: RString,
    /// The remote resource id.
    pub provider_lease_id: ROption<RString>,
    /// The metadata the provider returned with the lease.
    pub metadata_json: RString,
}

impl LeaseParams {
    /// The parameters of a hook acting on `lease` (its id and metadata) in
    /// `env`, for run `run_id`.
    pub fn new(env: EnvironmentParams, run_id: impl Into<RString>, lease: &Lease) -> Self {
        let (provider_lease_id, metadata_json) =
            (lease.provider_lease_id.clone(), lease.metadata_json.clone());
        LeaseParams { env, run_id: run_id.into(), provider_lease_id, metadata_json }
    }
}

/// Where work runs inside a lease.
#[repr(C)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(StableAbi, Clone, Debug, PartialEq, Eq)]
pub struct Workspace {
    /// The working directory inside the sandbox.
    pub cwd: RString,
    /// Details as a JSON object.
    pub metadata_json: RString,
}

/// What `inspect_lease` reports about a lease, without changing it.
#[repr(C)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(StableAbi, Clone, Debug, PartialEq, Eq)]
pub struct LeaseStatus {
    /// True while the remote resource exists.
    pub exists: bool,
    /// The remote state (`running`, `paused`...), empty when gone.
    pub state: RString,
    /// True when the provider would refuse to reuse the lease (cleanup unconfirmed).
    pub unconfirmed: bool,
}

/// One environment variable for `execute`.
#[repr(C)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(StableAbi, Clone, Debug, PartialEq, Eq)]
pub struct EnvVar {
    /// The variable name.
    pub name: RString,
    /// Its value.
    pub value: RString,
}

/// Parameters of `execute`.
#[repr(C)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(StableAbi, Clone, Debug, Default, PartialEq, Eq)]
pub struct ExecuteParams {
    /// The lease to run in.
    pub lease: LeaseParams,
    /// The program.
    pub command: RString,
    /// Its arguments, passed verbatim.
    pub args: RVec<RString>,
    /// Working directory; the workspace when `None`.
    pub cwd: ROption<RString>,
    /// Extra environment variables.
    pub env: RVec<EnvVar>,
    /// Deadline in milliseconds; the configuration's when `None`.
    pub timeout_ms: ROption<u64>,
}

/// The outcome of `execute`.
#[repr(C)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(StableAbi, Clone, Debug, Default, PartialEq, Eq)]
pub struct ExecuteResult {
    /// The exit code; `None` after a timeout or a signal.
    pub exit_code: ROption<i32>,
    /// The signal that ended the command, if any.
    pub signal: ROption<RString>,
    /// True when the command ran out of time.
    pub timed_out: bool,
    /// Standard output (its tail when truncated).
    pub stdout: RString,
    /// Standard error (its tail when truncated).
    pub stderr: RString,
    /// Details as a JSON object (`outputTruncated`...).
    pub metadata_json: RString,
}

/// What `release_lease` did with the lease.
#[repr(C)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(StableAbi, Copy, Clone, Debug, PartialEq, Eq)]
pub struct ReleaseReport {
    /// True when the lease was kept (paused) and may be resumed; false when
    /// its remote resource was deleted and a new lease must be acquired.
    pub kept: bool,
}
