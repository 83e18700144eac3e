//! The `sync_files` hook: files between the host and a lease, either way.
//!
//! # Order of events
//!
//! 1. Ownership check, then every mapping and command of every operation is
//!    checked ([`plan`]): sandbox paths lexically confined to the workspace,
//!    host paths absolute, modes, timeouts, the inbound directories walked
//!    (no host link may leave its source). Any failure sends no request and
//!    writes nothing, even when earlier mappings were valid.
//! 2. The sync registers on its lease like a command
//!    ([`crate::registry::Registry::start_command`]): refused while the lease is closing or
//!    unconfirmed, cancelled by release or shutdown.
//! 3. Each mapping stages through a scratch file
//!    `/tmp/paperclip-createos-transfer-<uuid>` in the sandbox, moved with
//!    `PUT`/`GET /files` streamed from or to disk (never the process journal,
//!    never base64, never the whole file in memory); one `exec` command
//!    re-checks the sandbox path with `realpath` right before it is used
//!    ([`paths::guard`]) and does the sandbox side:
//!    - inbound file: `mkdir -p` the parent, `chmod`, `mv -f` into place;
//!    - inbound directory: a tar of the walk (the `tar` crate) extracted under
//!      the target, whose mode is then set;
//!    - outbound file: hard-linked (else copied) to scratch, downloaded into a temporary file
//!      beside the host target, its mode set, then renamed over the target;
//!    - outbound directory: `tar -c` (`-h` only with `followSymlinks`) to
//!      scratch, downloaded into a temporary file, validated whole
//!      ([`archive::validate`]), then extracted ([`archive::extract`]).
//!
//!    The scratch file is removed afterwards in every case (by the inbound
//!    command itself, else with `rm -f`, errors ignored).
//! 4. Inbound, each post-upload command then runs (`bash -lc COMMAND`
//!    verbatim, through [`crate::execute`]) in its working directory, checked
//!    in the sandbox the same way; the first failure stops the rest.

mod archive;
mod paths;
mod plan;

use std::fs;
use std::io::{BufWriter, Seek};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use provider_abi::{ExecuteParams, SyncOperationResult, SyncParams, SyncResult};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::client::{CallOptions, CreateosClient};
use crate::error::Error;
use crate::lease::{Context, OwnedLease};
use crate::pacer::Priority;
use crate::script::quote;
pub use archive::MAX_EXTRACTED_BYTES;
use plan::{Operation, Step};

/// Prefix of the scratch file in the sandbox; a random UUID follows.
pub const SCRATCH_PREFIX: &str = "/tmp/paperclip-createos-transfer-";
/// The fresh deadline of scratch removal after a failure or cancellation.
pub const CLEANUP_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest archive downloaded: the extraction limit plus tar's own headers.
const MAX_ARCHIVE_DOWNLOAD: u64 = MAX_EXTRACTED_BYTES + (1 << 30);

/// `sync_files`: files into the lease or out of it, as `params.direction`
/// says; see the module docs.
pub async fn sync(ctx: &Context, params: &SyncParams) -> Result<SyncResult, Error> {
    let lease = ctx.own_required(&params.lease)?;
    let operations = plan::plan(params)?;
    let client = ctx.client(&lease.config)?;
    let (cancel, _guard) = ctx.registry.start_command(&lease.scope, &ctx.shutdown)?;
    let transfer = Transfer {
        ctx,
        params,
        client: &client,
        lease: &lease,
        cancel,
        timeout: Duration::from_millis(lease.config.timeout_ms),
    };
    let mut results = Vec::with_capacity(operations.len());
    for operation in &operations {
        results.push(transfer.operation(operation).await?);
    }
    // `_guard` drops on the way out: only then, with every scratch file
    // removed, may a waiting release go on.
    Ok(SyncResult { operations: results.into() })
}

struct Transfer<'a> {
    ctx: &'a Context,
    params: &'a SyncParams,
    client: &'a CreateosClient,
    lease: &'a OwnedLease,
    cancel: CancellationToken,
    timeout: Duration,
}

impl Transfer<'_> {
    fn sandbox(&self) -> &str {
        &self.lease.sandbox_id
    }

    fn options(&self) -> CallOptions {
        CallOptions::new(Instant::now() + self.timeout, Priority::InFlight)
    }

    /// Runs `step` unless the sync is cancelled first.
    async fn race<T>(&self, step: impl std::future::Future<Output = Result<T, Error>>) -> Result<T, Error> {
        tokio::select! {
            biased;
            _ = self.cancel.cancelled() => Err(Error::Cancelled),
            result = step => result,
        }
    }

    async fn operation(&self, operation: &Operation) -> Result<SyncOperationResult, Error> {
        let mut result = SyncOperationResult { id: operation.id.as_str().into(), ..Default::default() };
        for step in &operation.steps {
            let scratch = format!("{SCRATCH_PREFIX}{}", uuid::Uuid::new_v4());
            let mut staged = false;
            let moved = self.step(step, &scratch, &mut staged).await;
            if staged {
                self.client.remove_file(self.sandbox(), &scratch, "scratch", CLEANUP_TIMEOUT).await;
            }
            let (files, bytes) = moved?;
            result.files_transferred += files;
            result.bytes_transferred += bytes;
        }
        for command in &operation.commands {
            self.post_upload(command).await?;
        }
        Ok(result)
    }

    /// Moves one mapping; sets `staged` while the scratch file may exist.
    async fn step(&self, step: &Step, scratch: &str, staged: &mut bool) -> Result<(u64, u64), Error> {
        let q_scratch = quote(scratch);
        match step {
            Step::InFile { source, len, target, mode } => {
                let script = format!(
                    "{}mkdir -p -- \"$(dirname -- \"$t\")\" && chmod {mode:o} -- {q_scratch} && mv -f -T -- {q_scratch} \"$t\"",
                    paths::guard("t", target, false)
                );
                self.upload_then(source, *len, scratch, staged, &script).await?;
                Ok((1, *len))
            }
            Step::InDirectory { source, entries, target, mode } => {
                let mut archive = tempfile::NamedTempFile::new().map_err(Error::host_write)?;
                let summary = archive::write(source, entries, archive.as_file_mut())?;
                let len = archive.as_file_mut().stream_position().map_err(Error::host_write)?;
                let script = format!(
                    "{}mkdir -p -- \"$t\" && tar -x --no-same-owner -f {q_scratch} -C \"$t\" && chmod {mode:o} -- \"$t\"",
                    paths::guard("t", target, false)
                );
                self.upload_then(archive.path(), len, scratch, staged, &script).await?;
                Ok((summary.files, summary.bytes))
            }
            Step::OutFile { source, target, mode } => {
                *staged = true;
                let script =
                    format!(
                    "{}[ -d \"$s\" ] && exit {}\n[ -f \"$s\" ] && {{ ln -- \"$s\" {q_scratch} 2>/dev/null || cp -- \"$s\" {q_scratch}; }}",
                    paths::guard("s", source, true),
                    paths::IS_A_DIRECTORY_STATUS,
                );
                self.run_script(&script).await?;
                let parent = paths::created_parent(target)?;
                let temporary = tempfile::Builder::new()
                    .prefix(".paperclip-createos-")
                    .tempfile_in(parent)
                    .map_err(Error::host_write)?;
                let bytes = self.download(scratch, temporary.as_file(), u64::MAX).await?;
                fs::set_permissions(temporary.path(), fs::Permissions::from_mode(*mode))
                    .map_err(Error::host_write)?;
                temporary.persist(target).map_err(|e| Error::host_write(e.error))?;
                Ok((1, bytes))
            }
            Step::OutDirectory { source, target, mode, exclude, follow_symlinks } => {
                *staged = true;
                let dereference = if *follow_symlinks { "-h " } else { "" };
                let script = format!(
                    "{}[ -d \"$s\" ] || exit {}\ntar -c {dereference}-f {q_scratch} -C \"$s\" .",
                    paths::guard("s", source, true),
                    paths::NOT_A_DIRECTORY_STATUS,
                );
                self.run_script(&script).await?;
                let parent = paths::created_parent(target)?;
                let archive = tempfile::tempfile_in(parent).map_err(Error::host_write)?;
                self.download(scratch, &archive, MAX_ARCHIVE_DOWNLOAD).await?;
                // Read from the start, each time through a reference to the file.
                let rewound = || {
                    let mut file = &archive;
                    file.rewind().map_err(Error::host_read)?;
                    Ok::<_, Error>(std::io::BufReader::with_capacity(1 << 20, file))
                };
                archive::validate(rewound()?, MAX_EXTRACTED_BYTES)?;
                match fs::symlink_metadata(target) {
                    Ok(meta) if !meta.is_dir() => {
                        return Err(Error::invalid_input(
                            "CreateOS transfer destination may not be a symbolic link.",
                        ))
                    }
                    Ok(_) => {}
                    Err(_) => fs::create_dir(target).map_err(Error::host_write)?,
                }
                let summary = archive::extract(rewound()?, target, exclude)?;
                if let Some(mode) = mode {
                    fs::set_permissions(target, fs::Permissions::from_mode(*mode))
                        .map_err(Error::host_write)?;
                }
                Ok((summary.files, summary.bytes))
            }
        }
    }

    /// Uploads the host file `source` (`len` bytes) to the scratch file, then
    /// runs the transfer `script` that moves it into place; the scratch file
    /// is removed when the script exits.
    async fn upload_then(
        &self,
        source: &Path,
        len: u64,
        scratch: &str,
        staged: &mut bool,
        script: &str,
    ) -> Result<(), Error> {
        *staged = true;
        self.race(self.client.put_file_from(self.sandbox(), scratch, source, len, self.options())).await?;
        self.run_script(&format!("trap 'rm -f -- {}' EXIT\n{script}", quote(scratch))).await?;
        *staged = false;
        Ok(())
    }

    /// Streams the scratch file into `file`; returns its size.
    async fn download(&self, scratch: &str, file: &fs::File, cap: u64) -> Result<u64, Error> {
        let mut writer = BufWriter::with_capacity(1 << 20, file);
        self.race(self.client.get_file_into(self.sandbox(), scratch, &mut writer, cap, self.options())).await
    }

    /// Runs a transfer script with `bash -c` through `exec`: exit 0 is
    /// success, [`paths::ESCAPE_STATUS`] a path that resolved outside the
    /// workspace, [`paths::IS_A_DIRECTORY_STATUS`] and
    /// [`paths::NOT_A_DIRECTORY_STATUS`] a mapping of the wrong kind, anything
    /// else a failed transfer command. Returns stdout.
    async fn run_script(&self, script: &str) -> Result<String, Error> {
        let args = ["-c".to_owned(), script.to_owned()];
        let ran = self.race(self.client.exec(self.sandbox(), "/bin/bash", &args, self.options())).await?;
        match ran.exit_code {
            0 => Ok(ran.stdout),
            paths::ESCAPE_STATUS => Err(Error::PathEscapes),
            paths::IS_A_DIRECTORY_STATUS => Err(Error::invalid_input(
                "CreateOS transfer source is a directory: sync it with a directory mapping (kind \"directory\").",
            )),
            paths::NOT_A_DIRECTORY_STATUS => Err(Error::invalid_input(
                "CreateOS transfer source is not a directory: sync it with a file mapping (kind \"file\").",
            )),
            _ => Err(Error::TransferFailed),
        }
    }

    /// Runs one post-upload command in its checked working directory.
    async fn post_upload(&self, command: &plan::Command) -> Result<(), Error> {
        let resolved =
            self.run_script(&format!("{}printf '%s' \"$c\"", paths::guard("c", &command.cwd, true))).await?;
        let params = ExecuteParams {
            lease: self.params.lease.clone(),
            command: "/bin/bash".into(),
            args: vec!["-lc".into(), command.command.as_str().into()].into(),
            cwd: Some(resolved.into()).into(),
            env: Default::default(),
            timeout_ms: command.timeout_ms.into(),
        };
        // Not raced: the command registers on the lease itself, so a release
        // cancels it through its own token and it terminates its process
        // tree before returning (dropping it instead would leave the tree
        // unconfirmed).
        let ran = crate::execute::execute_to(self.ctx, &params, None, &mut |_, _| {}).await?;
        match ran.exit_code.into_option() {
            Some(0) => Ok(()),
            exit_code => Err(Error::PostUploadFailed(exit_code)),
        }
    }
}
