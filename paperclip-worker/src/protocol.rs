//! Paperclip's environment-driver messages (`PluginEnvironment*Params` and
//! `*Result` of `@paperclipai/plugin-sdk`'s `protocol` module), and their
//! translation to and from the host's types.
//!
//! Fields Paperclip sends that the host has no use for (`issueId`,
//! `workspaceMode`, `bypassSession`...) are accepted and ignored.

use provider_abi::{ByteSource, Hook, Lease, ProbeReport, SyncDirection, ValidationReport, Workspace};
use provider_host::{
    CommandOutcome, FileTransfer, PathMapping, RemoteCommand, TransferOperation, TransferOutcome,
};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::{collections::BTreeMap, time::Duration};

/// Every optional method of the protocol (`HOST_TO_WORKER_OPTIONAL_METHODS`):
/// one a worker does not serve is answered "method not implemented".
pub const OPTIONAL_METHODS: [&str; 36] = [
    "validateConfig",
    "configChanged",
    "onEvent",
    "runJob",
    "handleWebhook",
    "handleApiRequest",
    "getData",
    "performAction",
    "executeTool",
    "detectExternalObjects",
    "resolveExternalObject",
    "refreshExternalObjects",
    "environmentValidateConfig",
    "environmentProbe",
    "environmentAcquireLease",
    "environmentResumeLease",
    "environmentReleaseLease",
    "environmentDestroyLease",
    "environmentRealizeWorkspace",
    "environmentExecute",
    "environmentRunnerIngressEndpoint",
    "environmentSyncIn",
    "environmentSyncOut",
    "environmentStartInteractiveSetup",
    "environmentGetInteractiveSetup",
    "environmentCaptureTemplate",
    "environmentCancelInteractiveSetup",
    "environmentDeleteTemplate",
    "loginPtyOpen",
    "loginPtyInput",
    "loginPtyStop",
    "loginPtyClose",
    "duplexChannelOpen",
    "duplexChannelWrite",
    "duplexChannelStop",
    "duplexChannelClose",
];

/// The environment methods this worker serves, each with the provider hook
/// it needs.
pub const ENVIRONMENT_METHODS: [(&str, Hook); 10] = [
    ("environmentValidateConfig", Hook::ValidateConfig),
    ("environmentProbe", Hook::Probe),
    ("environmentAcquireLease", Hook::AcquireLease),
    ("environmentResumeLease", Hook::ResumeLease),
    ("environmentReleaseLease", Hook::ReleaseLease),
    ("environmentDestroyLease", Hook::DestroyLease),
    ("environmentRealizeWorkspace", Hook::RealizeWorkspace),
    ("environmentExecute", Hook::Execute),
    ("environmentSyncIn", Hook::SyncFiles),
    ("environmentSyncOut", Hook::SyncFiles),
];

/// Which way `method` (`environmentSyncIn` or `environmentSyncOut`) moves
/// files.
pub fn sync_direction(method: &str) -> SyncDirection {
    if method == "environmentSyncIn" {
        SyncDirection::In
    } else {
        SyncDirection::Out
    }
}

/// What every environment call names (`PluginEnvironmentDriverBaseParams`).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Environment {
    /// The driver the call is for.
    pub driver_key: String,
    /// The company acting.
    pub company_id: String,
    /// The environment acted in.
    pub environment_id: String,
    /// The driver's configuration, secrets resolved by the server.
    #[serde(default)]
    pub config: Map<String, Value>,
}

/// `environmentValidateConfig`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ValidateParams {
    /// The driver the configuration is for.
    pub driver_key: String,
    /// The configuration; secret properties hold references, not values.
    #[serde(default)]
    pub config: Map<String, Value>,
}

/// `environmentAcquireLease`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AcquireParams {
    /// The environment.
    #[serde(flatten)]
    pub env: Environment,
    /// The run the lease is for.
    pub run_id: String,
}

/// `environmentResumeLease`, `environmentReleaseLease`, `environmentDestroyLease`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LeaseIdParams {
    /// The environment.
    #[serde(flatten)]
    pub env: Environment,
    /// The lease (null: nothing to release).
    pub provider_lease_id: Option<String>,
    /// The lease's metadata as Paperclip kept it.
    #[serde(default)]
    pub lease_metadata: Option<Map<String, Value>>,
}

/// A lease as Paperclip passes it (`PluginEnvironmentLease`).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PaperclipLease {
    /// Its id.
    pub provider_lease_id: Option<String>,
    /// Its metadata.
    #[serde(default)]
    pub metadata: Option<Map<String, Value>>,
}

/// A call on a lease (`environmentRealizeWorkspace`, `environmentExecute`,
/// `environmentSyncIn`, `environmentSyncOut`).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OnLease<T> {
    /// The environment.
    #[serde(flatten)]
    pub env: Environment,
    /// The lease.
    pub lease: PaperclipLease,
    /// The call's own parameters.
    #[serde(flatten)]
    pub call: T,
}

/// `environmentRealizeWorkspace`'s own parameters (the provider decides
/// where the workspace is; Paperclip's wishes are not needed for that).
#[derive(Debug, Clone, Deserialize)]
pub struct Realize {}

/// `environmentExecute`'s own parameters.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Execute {
    /// The program.
    pub command: String,
    /// Its arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// Its working directory.
    #[serde(default)]
    pub cwd: Option<String>,
    /// Its environment variables.
    #[serde(default)]
    pub env: Option<BTreeMap<String, String>>,
    /// Its standard input, as text.
    #[serde(default)]
    pub stdin: Option<String>,
    /// Its deadline.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
}

/// `environmentSyncIn` and `environmentSyncOut`'s own parameters.
#[derive(Debug, Clone, Deserialize)]
pub struct Sync {
    /// The operations, in order.
    pub operations: Vec<Operation>,
}

/// One sync operation (`PluginSyncOperation`).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Operation {
    /// Its id, echoed in the result.
    pub operation_id: String,
    /// Its files.
    pub files: Vec<Mapping>,
    /// Commands after an inbound operation's files.
    #[serde(default)]
    pub post_upload_commands: Vec<PostUpload>,
}

/// One file mapping (`PluginSyncFileMapping`).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Mapping {
    /// Where the bytes come from.
    pub source_path: String,
    /// Where they go.
    pub target_path: String,
    /// `file` or `directory`.
    pub kind: String,
    /// The mode of what lands.
    #[serde(default)]
    pub mode: Option<u32>,
    /// Globs left out of a directory.
    #[serde(default)]
    pub exclude: Vec<String>,
    /// Whether links are followed.
    #[serde(default)]
    pub follow_symlinks: bool,
}

/// A command after an upload (`PluginPostUploadCommand`).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PostUpload {
    /// The shell command.
    pub command: String,
    /// Its working directory.
    #[serde(default)]
    pub cwd: Option<String>,
    /// Its deadline.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
}

/// Reads `params` as `T`, or says in one line what is wrong with them.
pub fn params<T: for<'de> Deserialize<'de>>(method: &str, params: Value) -> Result<T, crate::rpc::RpcError> {
    serde_json::from_value(params).map_err(|error| crate::rpc::RpcError::invalid_params(method, error))
}

/// The key under which a lease's metadata carries the provider's own, whole.
///
/// Paperclip keeps a lease's metadata merged with keys of its own
/// (`pluginId`, `driver`...) and passes that back; a provider that binds its
/// metadata refuses added keys as tampering. So the metadata Paperclip gets
/// is the provider's, its keys at the top for Paperclip to read, plus the
/// provider's again under this key, which the worker takes back exactly.
pub const PROVIDER_METADATA: &str = "providerHostLease";

/// A lease for the host: its id and the provider's metadata (taken from
/// under [`PROVIDER_METADATA`] when Paperclip's metadata has it).
pub fn lease(id: Option<String>, metadata: Option<Map<String, Value>>) -> Lease {
    let metadata = metadata.map(|mut metadata| match metadata.remove(PROVIDER_METADATA) {
        Some(Value::Object(provider)) => provider,
        _ => metadata,
    });
    Lease {
        provider_lease_id: id.map(Into::into).into(),
        metadata_json: metadata
            .map(|metadata| Value::Object(metadata).to_string())
            .unwrap_or_default()
            .into(),
        expires_at: None.into(),
        expired: false,
    }
}

/// A JSON object from a hook's JSON text (empty when there is none).
fn object(text: &str) -> Value {
    match serde_json::from_str::<Value>(text) {
        Ok(value @ Value::Object(_)) => value,
        _ => json!({}),
    }
}

/// A lease as Paperclip takes it (`PluginEnvironmentLease`): an expired one
/// has no id; its metadata is the provider's, once more under
/// [`PROVIDER_METADATA`].
pub fn lease_result(lease: &Lease) -> Value {
    let id = match lease.expired {
        true => None,
        false => lease.provider_lease_id.as_ref().map(|id| id.to_string()).into_option(),
    };
    let provider = object(&lease.metadata_json);
    let mut metadata = provider.clone();
    if let (Value::Object(metadata), false) = (&mut metadata, provider.as_object().is_some_and(Map::is_empty))
    {
        metadata.insert(PROVIDER_METADATA.into(), provider);
    }
    let mut result = json!({"providerLeaseId": id, "metadata": metadata});
    if let Some(expires_at) = lease.expires_at.as_ref().into_option() {
        result["expiresAt"] = json!(expires_at.as_str());
    }
    result
}

/// `PluginEnvironmentValidationResult`. `normalized` is the provider's
/// normalised configuration with its secret properties as Paperclip sent
/// them (references, which the server stores).
pub fn validation_result(report: &ValidationReport, normalized: Option<Value>) -> Value {
    let mut result = json!({
        "ok": report.ok,
        "errors": report.errors.iter().map(|error| error.as_str()).collect::<Vec<_>>(),
        "warnings": report.warnings.iter().map(|warning| warning.as_str()).collect::<Vec<_>>(),
    });
    if let Some(normalized) = normalized {
        result["normalizedConfig"] = normalized;
    }
    result
}

/// `PluginEnvironmentProbeResult`.
pub fn probe_result(report: &ProbeReport) -> Value {
    json!({"ok": report.ok, "summary": report.message.as_str(), "metadata": object(&report.metadata_json)})
}

/// `PluginEnvironmentRealizeWorkspaceResult`.
pub fn workspace_result(workspace: &Workspace) -> Value {
    json!({"cwd": workspace.cwd.as_str(), "metadata": object(&workspace.metadata_json)})
}

/// The host's command, and its standard input.
pub fn execute_params(execute: Execute) -> (RemoteCommand, ByteSource) {
    let stdin = match execute.stdin {
        Some(stdin) => ByteSource::from_bytes(stdin.into_bytes()),
        None => ByteSource::empty(),
    };
    let command = RemoteCommand {
        program: execute.command,
        args: execute.args,
        cwd: execute.cwd,
        env: execute.env.unwrap_or_default().into_iter().collect(),
        timeout: execute.timeout_ms.map(Duration::from_millis),
    };
    (command, stdin)
}

/// `PluginEnvironmentExecuteResult`.
pub fn execute_result(outcome: &CommandOutcome) -> Value {
    let metadata = match &outcome.metadata {
        metadata @ Value::Object(_) => metadata.clone(),
        _ => json!({}),
    };
    json!({
        "exitCode": outcome.exit_code,
        "signal": outcome.signal,
        "timedOut": outcome.timed_out,
        "stdout": outcome.stdout,
        "stderr": outcome.stderr,
        "metadata": metadata,
    })
}

/// The host's transfer of a sync call `method` (`environmentSyncIn` or
/// `environmentSyncOut`).
pub fn file_transfer(method: &str, sync: Sync) -> FileTransfer {
    FileTransfer {
        direction: sync_direction(method),
        operations: sync
            .operations
            .into_iter()
            .map(|operation| TransferOperation {
                id: operation.operation_id,
                mappings: operation
                    .files
                    .into_iter()
                    .map(|file| PathMapping {
                        kind: file.kind,
                        source: file.source_path,
                        target: file.target_path,
                        mode: file.mode,
                        exclude: file.exclude,
                        follow_symlinks: file.follow_symlinks,
                    })
                    .collect(),
                post_upload_commands: operation
                    .post_upload_commands
                    .into_iter()
                    .map(|command| provider_host::PostUpload {
                        command: command.command,
                        cwd: command.cwd,
                        timeout: command.timeout_ms.map(Duration::from_millis),
                    })
                    .collect(),
            })
            .collect(),
    }
}

/// `PluginEnvironmentSyncResult`.
pub fn sync_result(outcome: &TransferOutcome) -> Value {
    let operations: Vec<Value> = outcome
        .operations
        .iter()
        .map(|moved| {
            json!({
                "operationId": moved.id,
                "filesTransferred": moved.files,
                "bytesTransferred": moved.bytes,
            })
        })
        .collect();
    json!({ "operations": operations })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_providers_metadata_comes_back_exactly_whatever_paperclip_adds() {
        let from_provider = Lease {
            provider_lease_id: Some("sb-1".into()).into(),
            metadata_json: json!({"marker": "m", "binding": "b"}).to_string().into(),
            ..Default::default()
        };
        let handed = lease_result(&from_provider);
        assert_eq!(handed["metadata"]["marker"], "m", "Paperclip reads the provider's keys");
        let mut kept = handed["metadata"].as_object().unwrap().clone();
        kept.insert("pluginId".into(), json!("provider-host.createos"));
        kept.insert("sandboxProviderPlugin".into(), json!(true));
        let back = lease(Some("sb-1".into()), Some(kept));
        assert_eq!(back.metadata_json, from_provider.metadata_json);
        let plain = lease(Some("sb-1".into()), Some(json!({"marker": "m"}).as_object().unwrap().clone()));
        assert_eq!(plain.metadata_json.as_str(), r#"{"marker":"m"}"#, "metadata from elsewhere as given");
    }
}
