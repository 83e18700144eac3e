//! Validation of a whole sync call before any side effect: every mapping of
//! every operation becomes a [`Step`], or the call fails with the first
//! problem and nothing was sent or written.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use globset::GlobSet;
use provider_abi::{PostUploadCommand, SyncDirection, SyncMapping, SyncParams};

use super::archive::{self, SourceEntry};
use super::paths::{host_path, sandbox_path};
use crate::config::MAX_TIMEOUT_MS;
use crate::error::Error;

/// Default mode of a directory moved inbound.
pub const DEFAULT_DIRECTORY_MODE: u32 = 0o755;
/// Default mode of a file moved outbound.
pub const DEFAULT_OUTBOUND_FILE_MODE: u32 = 0o600;

/// One checked mapping.
#[derive(Debug)]
pub enum Step {
    /// A host file into the lease.
    InFile {
        /// The host file.
        source: PathBuf,
        /// Its size when checked.
        len: u64,
        /// The normalised sandbox path.
        target: String,
        /// The mode to apply.
        mode: u32,
    },
    /// A host directory into the lease.
    InDirectory {
        /// The host directory.
        source: PathBuf,
        /// What the walk found (links checked, excludes applied).
        entries: Vec<SourceEntry>,
        /// The normalised sandbox path.
        target: String,
        /// The mode of the target directory.
        mode: u32,
    },
    /// A lease file to the host.
    OutFile {
        /// The normalised sandbox path.
        source: String,
        /// The host file.
        target: PathBuf,
        /// The mode to apply before the rename.
        mode: u32,
    },
    /// A lease directory to the host.
    OutDirectory {
        /// The normalised sandbox path.
        source: String,
        /// The host directory.
        target: PathBuf,
        /// The mode of the target directory, if requested.
        mode: Option<u32>,
        /// Paths left out of extraction.
        exclude: GlobSet,
        /// Archive with `tar -h`.
        follow_symlinks: bool,
    },
}

/// A checked post-upload command.
#[derive(Debug, Clone)]
pub struct Command {
    /// The command line, verbatim.
    pub command: String,
    /// The normalised sandbox working directory.
    pub cwd: String,
    /// Its deadline, if given.
    pub timeout_ms: Option<u64>,
}

/// A checked operation.
#[derive(Debug)]
pub struct Operation {
    /// The caller's id.
    pub id: String,
    /// Its mappings.
    pub steps: Vec<Step>,
    /// Its post-upload commands.
    pub commands: Vec<Command>,
}

/// Checks every mapping and command of `params`; see the module docs.
pub fn plan(params: &SyncParams) -> Result<Vec<Operation>, Error> {
    let direction = params.direction;
    params
        .operations
        .iter()
        .map(|operation| {
            if direction == SyncDirection::Out && !operation.post_upload_commands.is_empty() {
                return Err(Error::invalid_input(
                    "CreateOS outbound transfers cannot run post-upload commands.",
                ));
            }
            Ok(Operation {
                id: operation.id.to_string(),
                steps: operation
                    .mappings
                    .iter()
                    .map(|mapping| step(mapping, direction))
                    .collect::<Result<_, _>>()?,
                commands: operation.post_upload_commands.iter().map(command).collect::<Result<_, _>>()?,
            })
        })
        .collect()
}

fn command(command: &PostUploadCommand) -> Result<Command, Error> {
    let timeout_ms = command.timeout_ms.into_option();
    if timeout_ms.is_some_and(|ms| !(1..=MAX_TIMEOUT_MS).contains(&ms)) {
        return Err(Error::invalid_input(format!(
            "CreateOS post-upload command timeoutMs must be between 1 and {MAX_TIMEOUT_MS}."
        )));
    }
    if command.command.contains('\0') {
        return Err(Error::invalid_input("CreateOS post-upload command contains a NUL byte."));
    }
    let cwd = match command.cwd.as_ref().into_option() {
        Some(cwd) => sandbox_path(cwd)?,
        None => crate::metadata::REMOTE_CWD.to_owned(),
    };
    Ok(Command { command: command.command.to_string(), cwd, timeout_ms })
}

fn step(mapping: &SyncMapping, direction: SyncDirection) -> Result<Step, Error> {
    let requested = mapping.mode.into_option();
    if requested.is_some_and(|mode| mode > 0o777) {
        return Err(Error::invalid_input("CreateOS transfer mode must be an integer between 0 and 0o777."));
    }
    let directory = match mapping.kind.as_str() {
        "file" => false,
        "directory" => true,
        _ => return Err(Error::invalid_input("CreateOS transfer kind must be \"file\" or \"directory\".")),
    };
    match (direction, directory) {
        (SyncDirection::In, false) => {
            let source = host_path(&mapping.source_path)?;
            let target = sandbox_path(&mapping.target_path)?;
            let link = fs::symlink_metadata(&source).map_err(Error::host_read)?;
            if link.file_type().is_symlink() && !mapping.follow_symlinks {
                return Err(Error::invalid_input(
                    "CreateOS transfer source is a symbolic link; set followSymlinks to follow it.",
                ));
            }
            let meta = fs::metadata(&source).map_err(Error::host_read)?;
            if !meta.is_file() {
                return Err(Error::invalid_input("CreateOS transfer source is not a regular file."));
            }
            let mode = requested.unwrap_or(meta.permissions().mode() & 0o777);
            Ok(Step::InFile { source, len: meta.len(), target, mode })
        }
        (SyncDirection::In, true) => {
            if mapping.follow_symlinks {
                return Err(Error::invalid_input(
                    "CreateOS inbound directory transfers cannot follow symbolic links.",
                ));
            }
            let source = host_path(&mapping.source_path)?;
            let target = sandbox_path(&mapping.target_path)?;
            let meta = fs::symlink_metadata(&source).map_err(Error::host_read)?;
            if !meta.is_dir() {
                return Err(Error::invalid_input("CreateOS transfer source is not a directory."));
            }
            let exclude = archive::excludes(&mapping.exclude)?;
            let entries = archive::walk(&source, &exclude)?;
            Ok(Step::InDirectory {
                source,
                entries,
                target,
                mode: requested.unwrap_or(DEFAULT_DIRECTORY_MODE),
            })
        }
        (SyncDirection::Out, false) => {
            let source = sandbox_path(&mapping.source_path)?;
            let target = host_path(&mapping.target_path)?;
            if fs::symlink_metadata(&target).is_ok_and(|meta| meta.is_dir()) {
                return Err(Error::invalid_input("CreateOS transfer target is a directory."));
            }
            Ok(Step::OutFile { source, target, mode: requested.unwrap_or(DEFAULT_OUTBOUND_FILE_MODE) })
        }
        (SyncDirection::Out, true) => {
            let source = sandbox_path(&mapping.source_path)?;
            let target = host_path(&mapping.target_path)?;
            match fs::symlink_metadata(&target) {
                Ok(meta) if meta.file_type().is_symlink() => {
                    return Err(Error::invalid_input(
                        "CreateOS transfer destination may not be a symbolic link.",
                    ))
                }
                Ok(meta) if !meta.is_dir() => {
                    return Err(Error::invalid_input("CreateOS transfer destination is not a directory."))
                }
                _ => {}
            }
            Ok(Step::OutDirectory {
                source,
                target,
                mode: requested,
                exclude: archive::excludes(&mapping.exclude)?,
                follow_symlinks: mapping.follow_symlinks,
            })
        }
    }
}
