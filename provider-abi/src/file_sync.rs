//! FFI-safe parameters and results of the file-sync hook, `sync_files`, in
//! (host → lease) or out (lease → host).

use crate::types::LeaseParams;
use abi_stable::{
    std_types::{ROption, RString, RVec},
    StableAbi,
};

/// One file or directory to move.
#[repr(C)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(StableAbi, Clone, Debug, Default, PartialEq, Eq)]
pub struct SyncMapping {
    /// `file` or `directory`.
    pub kind: RString,
    /// Where the bytes come from: a host path inbound, a lease path outbound.
    pub source_path: RString,
    /// Where they go: a lease path inbound, a host path outbound.
    pub target_path: RString,
    /// The target's permission bits (0..=0o777); the provider's default when `None`.
    pub mode: ROption<u32>,
    /// Globs of paths (relative to a directory source) left out.
    pub exclude: RVec<RString>,
    /// Follow symbolic links in the source (refused for inbound directories).
    pub follow_symlinks: bool,
}

/// A command run in the lease after an inbound operation's uploads.
#[repr(C)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(StableAbi, Clone, Debug, Default, PartialEq, Eq)]
pub struct PostUploadCommand {
    /// A shell command line, run verbatim.
    pub command: RString,
    /// Its working directory in the lease; the workspace when `None`.
    pub cwd: ROption<RString>,
    /// Its deadline in milliseconds; the configuration's when `None`.
    pub timeout_ms: ROption<u64>,
}

/// A group of mappings reported together under `id`.
#[repr(C)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(StableAbi, Clone, Debug, Default, PartialEq, Eq)]
pub struct SyncOperation {
    /// The caller's name for the operation, echoed in the result.
    pub id: RString,
    /// What to move, in order.
    pub mappings: RVec<SyncMapping>,
    /// Inbound only: commands run after the mappings, stopping at the first failure.
    pub post_upload_commands: RVec<PostUploadCommand>,
}

/// Which way `sync_files` moves files.
#[repr(u8)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(StableAbi, Copy, Clone, Debug, Default, PartialEq, Eq, Hash)]
pub enum SyncDirection {
    /// From the host into the lease.
    #[default]
    In,
    /// From the lease to the host.
    Out,
}

/// Parameters of `sync_files`.
#[repr(C)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(StableAbi, Clone, Debug, Default, PartialEq, Eq)]
pub struct SyncParams {
    /// The lease to move files into or out of.
    pub lease: LeaseParams,
    /// Which way the files move.
    pub direction: SyncDirection,
    /// The operations, in order; every mapping is checked before the first moves.
    pub operations: RVec<SyncOperation>,
}

impl SyncParams {
    /// One operation `id` with one mapping of `kind` (`file` or `directory`)
    /// from `source` to `target`, on `lease`; no post-upload commands.
    pub fn single(
        lease: LeaseParams,
        direction: SyncDirection,
        id: &str,
        kind: &str,
        source: &str,
        target: &str,
    ) -> Self {
        SyncParams {
            lease,
            direction,
            operations: vec![SyncOperation {
                id: id.into(),
                mappings: vec![SyncMapping {
                    kind: kind.into(),
                    source_path: source.into(),
                    target_path: target.into(),
                    ..Default::default()
                }]
                .into(),
                post_upload_commands: Default::default(),
            }]
            .into(),
        }
    }
}

/// What one operation moved.
#[repr(C)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(StableAbi, Clone, Debug, Default, PartialEq, Eq)]
pub struct SyncOperationResult {
    /// The operation's `id`.
    pub id: RString,
    /// Regular files written at the destination.
    pub files_transferred: u64,
    /// Bytes of those files.
    pub bytes_transferred: u64,
}

/// The outcome of `sync_files`.
#[repr(C)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(StableAbi, Clone, Debug, Default, PartialEq, Eq)]
pub struct SyncResult {
    /// One entry per operation, in order.
    pub operations: RVec<SyncOperationResult>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_is_one_operation_with_one_mapping_and_no_commands() {
        let lease = LeaseParams { run_id: "run-1".into(), ..Default::default() };
        let params = SyncParams::single(
            lease.clone(),
            SyncDirection::In,
            "input",
            "directory",
            "/host/in",
            "/workspace/in",
        );
        assert_eq!(params.lease, lease);
        let [operation] = params.operations.as_slice() else { panic!("one operation: {params:?}") };
        assert_eq!(operation.id, "input");
        assert!(operation.post_upload_commands.is_empty());
        let [mapping] = operation.mappings.as_slice() else { panic!("one mapping: {operation:?}") };
        assert_eq!(
            (mapping.kind.as_str(), mapping.source_path.as_str(), mapping.target_path.as_str()),
            ("directory", "/host/in", "/workspace/in")
        );
    }
}
