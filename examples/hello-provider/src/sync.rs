//! File sync (`sync_files`): copying files and directories between host
//! paths and a lease's workspace, in either direction.
//!
//! Every mapping of every operation is checked before the first byte moves
//! (a lease-side path must lie inside the workspace), so a bad request
//! changes nothing. A real provider uploads and downloads through its
//! service instead of copying; the checks stay.

use crate::provider::invalid;
use provider_abi::{ProviderError, SyncDirection, SyncMapping, SyncOperationResult, SyncParams};
use std::{
    io,
    path::{Component, Path, PathBuf},
};

/// One checked mapping: where the bytes come from and go.
#[derive(Debug)]
pub struct Copy {
    source: PathBuf,
    target: PathBuf,
    directory: bool,
    mode: Option<u32>,
    follow_symlinks: bool,
}

/// A lease-side path (a sync path, a working directory) as a path inside
/// `workspace`: relative paths are taken from the workspace; `..` is
/// refused, so the result cannot escape it.
pub fn in_workspace(workspace: &Path, path: &str) -> Result<PathBuf, ProviderError> {
    let path = Path::new(path);
    let relative = path.strip_prefix(workspace).unwrap_or(path);
    if relative.is_absolute() || relative.components().any(|part| matches!(part, Component::ParentDir)) {
        return Err(invalid("Hello paths in the lease must lie inside its workspace.".into()));
    }
    Ok(workspace.join(relative))
}

/// Checks every mapping of `params` against the lease's `workspace`.
pub fn plan(params: &SyncParams, workspace: &Path) -> Result<Vec<Vec<Copy>>, ProviderError> {
    let check = |mapping: &SyncMapping| {
        let directory = match mapping.kind.as_str() {
            "file" => false,
            "directory" => true,
            other => return Err(invalid(format!("Unknown sync mapping kind {other:?}."))),
        };
        if !mapping.exclude.is_empty() {
            // A feature of the hook this provider does not offer: the request
            // is refused as a whole (the hook itself is supported).
            return Err(invalid("Hello sync does not support exclude patterns.".into()));
        }
        if mapping.mode.into_option().is_some_and(|mode| mode > 0o777) {
            return Err(invalid("A sync mode is permission bits, 0 to 0o777.".into()));
        }
        let (source, target) = match params.direction {
            SyncDirection::In => {
                if directory && mapping.follow_symlinks {
                    return Err(invalid("Inbound directories are copied without following links.".into()));
                }
                (PathBuf::from(mapping.source_path.as_str()), in_workspace(workspace, &mapping.target_path)?)
            }
            SyncDirection::Out => {
                (in_workspace(workspace, &mapping.source_path)?, PathBuf::from(mapping.target_path.as_str()))
            }
        };
        Ok(Copy {
            source,
            target,
            directory,
            mode: mapping.mode.into_option(),
            follow_symlinks: mapping.follow_symlinks,
        })
    };
    params.operations.iter().map(|operation| operation.mappings.iter().map(check).collect()).collect()
}

/// Copies one checked mapping, adding what it wrote to `result`.
pub fn copy(mapping: &Copy, result: &mut SyncOperationResult) -> io::Result<()> {
    copy_path(&mapping.source, &mapping.target, mapping, result)
}

fn copy_path(
    source: &Path,
    target: &Path,
    mapping: &Copy,
    result: &mut SyncOperationResult,
) -> io::Result<()> {
    let kind =
        if mapping.follow_symlinks { std::fs::metadata(source)? } else { std::fs::symlink_metadata(source)? };
    if kind.is_symlink() {
        // Not followed: a link could point anywhere on the machine.
        return Ok(());
    }
    if kind.is_dir() != mapping.directory && source == mapping.source {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "the source is not of the mapping's kind"));
    }
    if kind.is_dir() {
        std::fs::create_dir_all(target)?;
        for entry in std::fs::read_dir(source)? {
            let entry = entry?;
            copy_path(&entry.path(), &target.join(entry.file_name()), mapping, result)?;
        }
        return Ok(());
    }
    if let Some(parent) = target.parent() {
        std::fs::create_dir_all(parent)?;
    }
    result.bytes_transferred += std::fs::copy(source, target)?;
    result.files_transferred += 1;
    if let Some(mode) = mapping.mode {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(target, std::fs::Permissions::from_mode(mode))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use provider_abi::{ErrorKind, LeaseParams};

    #[test]
    fn a_lease_path_outside_the_workspace_is_refused_before_anything_moves() {
        let workspace = Path::new("/leases/hello-1/workspace");
        assert_eq!(in_workspace(workspace, "a/b").unwrap(), workspace.join("a/b"));
        assert_eq!(in_workspace(workspace, "/leases/hello-1/workspace/a").unwrap(), workspace.join("a"));
        for escaping in ["../x", "/etc/passwd", "/leases/hello-1/workspace/../released"] {
            assert_eq!(
                in_workspace(workspace, escaping).unwrap_err().kind,
                ErrorKind::INVALID_INPUT,
                "{escaping}"
            );
        }
        let params =
            SyncParams::single(LeaseParams::default(), SyncDirection::In, "in", "file", "/tmp/a", "../a");
        assert!(plan(&params, workspace).is_err());
    }
}
