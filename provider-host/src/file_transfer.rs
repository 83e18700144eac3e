//! Files to move into or out of a lease, and what moved, in std types: what
//! an embedder builds and reads through [`Host::sync`](crate::Host::sync).
//! The host turns them into the provider's FFI types ([`SyncParams`],
//! [`SyncResult`]) at the boundary.

use provider_abi::{
    LeaseParams, PostUploadCommand, SyncDirection, SyncMapping, SyncOperation, SyncParams, SyncResult,
};
use std::time::Duration;

/// What `sync` moves, one way: operations in order, every mapping checked
/// before the first file moves.
///
/// ```
/// # use provider_host::{FileTransfer, PathMapping, SyncDirection, TransferOperation};
/// let upload = FileTransfer::new(SyncDirection::In).operation(
///     TransferOperation::new("input")
///         .mapping(PathMapping::directory("/tmp/input", "/paperclip-workspace/input"))
///         .then("ls input"),
/// );
/// assert_eq!(upload.operations[0].mappings[0].kind, "directory");
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FileTransfer {
    /// Which way the files move.
    pub direction: SyncDirection,
    /// The operations, in order.
    pub operations: Vec<TransferOperation>,
}

impl FileTransfer {
    /// A transfer `direction`, with no operation yet.
    pub fn new(direction: SyncDirection) -> Self {
        FileTransfer { direction, operations: Vec::new() }
    }

    /// Appends `operation`.
    pub fn operation(mut self, operation: TransferOperation) -> Self {
        self.operations.push(operation);
        self
    }

    /// The provider's parameters for this transfer on `lease`.
    pub(crate) fn into_params(self, lease: LeaseParams) -> SyncParams {
        SyncParams {
            lease,
            direction: self.direction,
            operations: self.operations.into_iter().map(TransferOperation::into_ffi).collect(),
        }
    }
}

/// A group of mappings reported together under `id`, and (inbound) the
/// commands run after them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TransferOperation {
    /// The caller's name for the operation, echoed in the outcome.
    pub id: String,
    /// What to move, in order.
    pub mappings: Vec<PathMapping>,
    /// Inbound only: commands run after the mappings, stopping at the first failure.
    pub post_upload_commands: Vec<PostUpload>,
}

impl TransferOperation {
    /// An operation named `id`, moving nothing yet.
    pub fn new(id: impl Into<String>) -> Self {
        TransferOperation { id: id.into(), ..Default::default() }
    }

    /// Appends `mapping`.
    pub fn mapping(mut self, mapping: PathMapping) -> Self {
        self.mappings.push(mapping);
        self
    }

    /// Appends the post-upload command line `command`, run in the workspace
    /// with the configuration's deadline.
    pub fn then(mut self, command: impl Into<String>) -> Self {
        self.post_upload_commands.push(PostUpload { command: command.into(), cwd: None, timeout: None });
        self
    }

    fn into_ffi(self) -> SyncOperation {
        SyncOperation {
            id: self.id.into(),
            mappings: self.mappings.into_iter().map(PathMapping::into_ffi).collect(),
            post_upload_commands: self.post_upload_commands.into_iter().map(PostUpload::into_ffi).collect(),
        }
    }
}

/// One file or directory to move.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PathMapping {
    /// `file` or `directory` (the provider refuses anything else).
    pub kind: String,
    /// Where the bytes come from: a host path inbound, a lease path outbound.
    pub source: String,
    /// Where they go: a lease path inbound, a host path outbound.
    pub target: String,
    /// The target's permission bits (0..=0o777); the provider's default when `None`.
    pub mode: Option<u32>,
    /// Globs of paths (relative to a directory source) left out.
    pub exclude: Vec<String>,
    /// Follow symbolic links in the source (refused for inbound directories).
    pub follow_symlinks: bool,
}

impl PathMapping {
    /// The file `source` to `target`.
    pub fn file(source: impl Into<String>, target: impl Into<String>) -> Self {
        PathMapping {
            kind: "file".into(),
            source: source.into(),
            target: target.into(),
            ..Default::default()
        }
    }

    /// The directory `source` to `target`.
    pub fn directory(source: impl Into<String>, target: impl Into<String>) -> Self {
        PathMapping { kind: "directory".into(), ..PathMapping::file(source, target) }
    }

    fn into_ffi(self) -> SyncMapping {
        SyncMapping {
            kind: self.kind.into(),
            source_path: self.source.into(),
            target_path: self.target.into(),
            mode: self.mode.into(),
            exclude: self.exclude.into_iter().map(Into::into).collect(),
            follow_symlinks: self.follow_symlinks,
        }
    }
}

/// A command line run in the lease after an inbound operation's uploads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PostUpload {
    /// A shell command line, run verbatim.
    pub command: String,
    /// Its working directory in the lease; the workspace when `None`.
    pub cwd: Option<String>,
    /// Its deadline; the configuration's when `None`.
    pub timeout: Option<Duration>,
}

impl PostUpload {
    fn into_ffi(self) -> PostUploadCommand {
        PostUploadCommand {
            command: self.command.into(),
            cwd: self.cwd.map(Into::into).into(),
            timeout_ms: crate::command::millis(self.timeout),
        }
    }
}

/// What a transfer moved, per operation in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TransferOutcome {
    /// One entry per operation.
    pub operations: Vec<OperationMoved>,
}

/// What one operation moved.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OperationMoved {
    /// The operation's `id`.
    pub id: String,
    /// Regular files written at the destination.
    pub files: u64,
    /// Bytes of those files.
    pub bytes: u64,
}

impl TransferOutcome {
    /// Files and bytes moved by every operation together.
    pub fn totals(&self) -> (u64, u64) {
        self.operations
            .iter()
            .fold((0, 0), |(files, bytes), moved| (files + moved.files, bytes + moved.bytes))
    }
}

impl From<SyncResult> for TransferOutcome {
    fn from(result: SyncResult) -> Self {
        TransferOutcome {
            operations: result
                .operations
                .into_iter()
                .map(|moved| OperationMoved {
                    id: moved.id.into(),
                    files: moved.files_transferred,
                    bytes: moved.bytes_transferred,
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use abi_stable::std_types::{RNone, RSome};
    use provider_abi::SyncOperationResult;

    #[test]
    fn a_transfer_becomes_the_providers_parameters_field_by_field() {
        let lease = LeaseParams { run_id: "run-1".into(), ..Default::default() };
        let mut mapping = PathMapping::directory("/host/in", "/lease/in");
        mapping.mode = Some(0o640);
        mapping.exclude = vec!["*.tmp".into()];
        mapping.follow_symlinks = true;
        let mut operation = TransferOperation::new("input").mapping(mapping).then("make");
        operation.post_upload_commands.push(PostUpload {
            command: "test".into(),
            cwd: Some("/lease/in".into()),
            timeout: Some(Duration::from_secs(2)),
        });
        let params = FileTransfer::new(SyncDirection::In)
            .operation(operation)
            .operation(TransferOperation::new("file").mapping(PathMapping::file("/a", "/b")))
            .into_params(lease.clone());
        assert_eq!((params.lease, params.direction), (lease, SyncDirection::In));
        assert_eq!(params.operations.len(), 2);
        let first = &params.operations[0];
        assert_eq!(first.id, "input");
        let mapped = &first.mappings[0];
        assert_eq!(
            (mapped.kind.as_str(), mapped.source_path.as_str(), mapped.target_path.as_str()),
            ("directory", "/host/in", "/lease/in")
        );
        assert_eq!((mapped.mode, mapped.follow_symlinks), (RSome(0o640), true));
        assert_eq!(mapped.exclude.iter().map(|glob| glob.as_str()).collect::<Vec<_>>(), ["*.tmp"]);
        let commands = &first.post_upload_commands;
        assert_eq!(
            (commands[0].command.as_str(), commands[0].cwd.clone(), commands[0].timeout_ms),
            ("make", RNone, RNone)
        );
        assert_eq!(
            (commands[1].cwd.clone(), commands[1].timeout_ms),
            (RSome("/lease/in".into()), RSome(2_000))
        );
        let second = &params.operations[1];
        assert_eq!((second.mappings[0].kind.as_str(), second.mappings[0].mode), ("file", RNone));
        assert!(second.post_upload_commands.is_empty());
    }

    #[test]
    fn an_outcome_reads_as_std_types_with_its_totals() {
        let result = SyncResult {
            operations: vec![
                SyncOperationResult { id: "a".into(), files_transferred: 2, bytes_transferred: 10 },
                SyncOperationResult { id: "b".into(), files_transferred: 1, bytes_transferred: 5 },
            ]
            .into(),
        };
        let outcome = TransferOutcome::from(result);
        assert_eq!(outcome.operations[1], OperationMoved { id: "b".into(), files: 1, bytes: 5 });
        assert_eq!(outcome.totals(), (3, 15));
    }
}
