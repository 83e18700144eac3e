//! The hook commands, for scripting: `acquire`, `resume`, `release`,
//! `destroy`, `probe`, `exec`, `sync`. They read and print lease JSON (see
//! [`host_harness::lease_file`]) and record every lease in the ledger.

use super::{read_config, Failure, Session};
use host_harness::{lease_file, render};
use provider_abi::{ByteSource, Lease, OutputStream, SyncDirection};
use provider_host::{
    host::{HeldLease, Host, Released},
    store::Owner,
    wait, FileTransfer, PathMapping, RemoteCommand, TransferOperation,
};
use std::{
    fs::File,
    io::{ErrorKind, IsTerminal, Read, Write},
    os::fd::AsFd,
    path::{Path, PathBuf},
    time::Duration,
};

/// The run id the hook commands pass.
const RUN_ID: &str = "harness-cli";

/// `--config FILE`, required.
#[derive(clap::Args)]
pub struct ConfigArg {
    /// Harness configuration (JSON), `-` for stdin: {"companyId", "environmentId", "config": {...}}
    /// or a bare provider configuration.
    #[arg(long, value_name = "FILE")]
    pub config: PathBuf,
}

/// `--config FILE --lease FILE`.
#[derive(clap::Args)]
pub struct LeaseArgs {
    #[command(flatten)]
    pub config: ConfigArg,
    /// Lease JSON as printed by `acquire`: {"providerLeaseId", "metadata", "expired"}.
    #[arg(long, value_name = "FILE")]
    pub lease: PathBuf,
}

fn host<'s>(session: &'s Session, config: &Path) -> Result<Host<'s>, Failure> {
    let config = read_config(config, &session.provider)?;
    Ok(Host::new(&session.provider, session.ledger.as_ref(), &config, Owner::Command, RUN_ID))
}

/// The host of the configuration of `args`, and the lease of `args` it holds.
fn held<'s>(session: &'s Session, args: &LeaseArgs) -> Result<(Host<'s>, HeldLease), Failure> {
    let host = host(session, &args.config.config)?;
    let held = host.hold(lease_file::read(&args.lease).map_err(Failure::Usage)?)?;
    Ok((host, held))
}

fn print_lease(session: &Session, lease: &Lease) {
    let json = lease_file::to_json(lease);
    session.out.value(&json, || json.to_string());
}

/// `acquire`: prints the new lease.
pub fn acquire(session: &Session, config: &Path) -> Result<(), Failure> {
    let held = wait(host(session, config)?.acquire())?;
    print_lease(session, &held.lease);
    Ok(())
}

/// `resume`: prints the resumed lease, or an expired one (acquire anew).
pub fn resume(session: &Session, args: &LeaseArgs) -> Result<(), Failure> {
    let (host, held) = held(session, args)?;
    print_lease(session, &wait(host.resume(&held))?);
    Ok(())
}

/// `release` (`destroy` false) and `destroy`: prints the lease to keep, which
/// is expired unless the lease was paused for reuse.
pub fn release(session: &Session, args: &LeaseArgs, destroy: bool) -> Result<(), Failure> {
    let (host, held) = held(session, args)?;
    if destroy {
        wait(host.destroy(&held))?;
    }
    let kept = !destroy && wait(host.release(&held))? == Released::Kept;
    let expired = Lease { provider_lease_id: None.into(), expired: true, ..held.lease.clone() };
    print_lease(session, if kept { &held.lease } else { &expired });
    Ok(())
}

/// `probe`: exit 1 unless the probe ran a command and cleaned up.
pub fn probe(session: &Session, config: &Path) -> Result<(), Failure> {
    let report = wait(host(session, config)?.probe())?;
    let json = serde_json::json!({
        "ok": report.ok,
        "message": report.message.as_str(),
        "metadata": render::json_field(&report.metadata_json),
    });
    session.out.value(&json, || format!("{}: {}", if report.ok { "ok" } else { "FAILED" }, report.message));
    super::passed(report.ok)
}

/// `exec` options.
#[derive(clap::Args)]
pub struct ExecArgs {
    /// Feed FILE to the command's standard input (`-`: ours). Without it,
    /// our own standard input is forwarded when it is not a terminal.
    #[arg(long, value_name = "FILE")]
    stdin: Option<PathBuf>,
    /// Set an environment variable for the command (repeatable); names
    /// must match ^[A-Za-z_][A-Za-z0-9_]*$.
    #[arg(long = "env", value_name = "K=V", value_parser = parse_env)]
    env: Vec<(String, String)>,
    /// Working directory of the command (relative: inside the workspace).
    #[arg(long, value_name = "DIR")]
    cwd: Option<String>,
    /// Deadline of the command, e.g. 30s, 2m, 1h30m (default: the configuration's).
    #[arg(long, value_name = "DURATION", value_parser = super::duration_at_least(Duration::from_millis(1), "timeout", "30s, 2m or 1h30m"))]
    timeout: Option<Duration>,
}

/// Parses `--env K=V`, refusing a name the provider would refuse, before any
/// request.
pub fn parse_env(text: &str) -> Result<(String, String), String> {
    let (name, value) =
        text.split_once('=').ok_or_else(|| format!("`{text}` is not K=V: give the variable a value"))?;
    let mut chars = name.chars();
    let valid = chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !valid {
        return Err(format!("`{name}` is not a variable name: names must match ^[A-Za-z_][A-Za-z0-9_]*$"));
    }
    Ok((name.to_owned(), value.to_owned()))
}

/// Bytes of the command's input read before its provider call, to tell an
/// empty input from none.
const FIRST_PIECE: usize = 64 << 10;

/// The command's stdin: `--stdin FILE`, else our own stdin when it is
/// neither a terminal nor already read for `--config -`/`--lease -`; `None`
/// when there is none, or ours is empty. The source the provider pulls from
/// as it sends the input on holds the first piece, read already, and the rest.
fn command_stdin(options: &ExecArgs, stdin_taken: bool) -> Result<Option<ByteSource>, Failure> {
    let ours = || {
        let fd = std::io::stdin().as_fd().try_clone_to_owned();
        fd.map(File::from).map_err(|error| Failure::Usage(format!("cannot read stdin: {error}")))
    };
    let mut rest = match options.stdin.as_deref() {
        Some(path) if path == Path::new("-") => ours()?,
        Some(path) => File::open(path)
            .map_err(|error| Failure::Usage(format!("cannot read {}: {error}", path.display())))?,
        None if stdin_taken || std::io::stdin().is_terminal() => return Ok(None),
        None => ours()?,
    };
    let mut first = Vec::with_capacity(FIRST_PIECE);
    (&mut rest)
        .take(FIRST_PIECE as u64)
        .read_to_end(&mut first)
        .map_err(|error| Failure::Usage(format!("cannot read the command's input: {error}")))?;
    let given = !first.is_empty() || options.stdin.is_some();
    Ok(given.then(|| ByteSource::from_reader(std::io::Cursor::new(first).chain(rest))))
}

/// `exec`'s exit code when its output's reader went away: a shell's for a
/// command killed by SIGPIPE (128 + 13).
const BROKEN_PIPE_EXIT: u8 = 141;

/// `exec`: runs `command` in the lease, streaming its output byte for byte
/// to our stdout and stderr, and exits with its exit code (124 on timeout,
/// 125 when it ended without one). A broken output pipe ends the user's
/// interest: the command is stopped (its tree terminated) and `exec` exits
/// [`BROKEN_PIPE_EXIT`].
pub fn exec(
    session: &Session,
    args: &LeaseArgs,
    options: &ExecArgs,
    command: &[String],
) -> Result<(), Failure> {
    let stdin_taken = args.config.config == Path::new("-") || args.lease == Path::new("-");
    if stdin_taken && options.stdin.as_deref() == Some(Path::new("-")) {
        return Err(Failure::Usage(
            "--stdin - cannot share stdin with --config - or --lease -; give the command's input as a file"
                .into(),
        ));
    }
    let (host, held) = held(session, args)?;
    let (program, args) = command.split_first().ok_or_else(|| Failure::Usage("no command given".into()))?;
    let stdin = command_stdin(options, stdin_taken)?.unwrap_or_else(ByteSource::empty);
    let command = RemoteCommand {
        program: program.clone(),
        args: args.to_vec(),
        cwd: options.cwd.clone(),
        env: options.env.clone(),
        timeout: options.timeout,
    };
    let mut closed = false;
    let result = std::thread::scope(|scope| {
        let mut live = |stream: OutputStream, chunk: &[u8]| {
            if closed {
                return;
            }
            let written = match stream {
                OutputStream::Stdout => std::io::stdout().write_all(chunk),
                OutputStream::Stderr => std::io::stderr().write_all(chunk),
            };
            if written.is_err_and(|error| error.kind() == ErrorKind::BrokenPipe) {
                // Nobody reads the output any more: stop the command as an
                // interruption does (the shutdown waits for its cleanup, so
                // it runs beside this callback, not in it).
                closed = true;
                scope.spawn(|| super::stop(&session.provider));
            }
        };
        wait(host.execute(&held, command, stdin, &mut live))
    });
    if closed {
        return Err(Failure::Exit(BROKEN_PIPE_EXIT));
    }
    let result = result?;
    if std::io::stdout().flush().is_err_and(|error| error.kind() == ErrorKind::BrokenPipe) {
        return Err(Failure::Exit(BROKEN_PIPE_EXIT));
    }
    if result.timed_out {
        tracing::warn!("the command timed out");
    }
    match (result.exit_code, result.timed_out) {
        (Some(0), _) => Ok(()),
        (Some(code), _) => Err(Failure::Exit(u8::try_from(code).unwrap_or(1))),
        (None, true) => Err(Failure::Exit(124)),
        (None, false) => Err(Failure::Exit(125)),
    }
}

/// What `sync` moves: `--in LOCAL:REMOTE` and `--out REMOTE:LOCAL` pairs
/// (split at the first `:`), the `--exclude` globs and `--mode` of every
/// mapping, and the `--then` commands run after the inbound files.
#[derive(clap::Args)]
pub struct SyncArgs {
    /// A host file or directory to copy into the lease.
    #[arg(long = "in", value_name = "LOCAL:REMOTE")]
    inbound: Vec<String>,
    /// A lease file (or directory, with a trailing `/`) to copy to the host.
    #[arg(long = "out", value_name = "REMOTE:LOCAL")]
    outbound: Vec<String>,
    /// Leave out paths matching this glob (`p`, `p/**`, `**/p`, `**/p/**`).
    #[arg(long, value_name = "GLOB")]
    exclude: Vec<String>,
    /// Mode of every target (octal, e.g. 640).
    #[arg(long, value_name = "OCTAL")]
    mode: Option<String>,
    /// A shell command run in the lease after the inbound files (repeatable;
    /// the first failure stops the rest).
    #[arg(long, value_name = "COMMAND")]
    then: Vec<String>,
}

/// `sync`: copies files into the lease (then runs `--then`), then out of
/// it, printing what each operation moved; exit 1 with one line when a
/// transfer is refused or fails.
pub fn sync(session: &Session, args: &LeaseArgs, request: &SyncArgs) -> Result<(), Failure> {
    if request.inbound.is_empty() && request.outbound.is_empty() {
        return Err(Failure::Usage("give at least one --in LOCAL:REMOTE or --out REMOTE:LOCAL".into()));
    }
    if !request.then.is_empty() && request.inbound.is_empty() {
        return Err(Failure::Usage("--then runs after --in transfers only".into()));
    }
    let mode = request
        .mode
        .as_deref()
        .map(|mode| {
            u32::from_str_radix(mode.trim_start_matches("0o"), 8)
                .map_err(|_| Failure::Usage(format!("--mode {mode:?} is not an octal mode")))
        })
        .transpose()?;
    let inbound = sync_operation(&request.inbound, true, mode, &request.exclude)?;
    let inbound = request.then.iter().fold(inbound, TransferOperation::then);
    let outbound = sync_operation(&request.outbound, false, mode, &request.exclude)?;
    let (host, held) = held(session, args)?;
    let transfers = [(SyncDirection::In, inbound), (SyncDirection::Out, outbound)];
    let mut operations = Vec::new();
    for (direction, operation) in
        transfers.into_iter().filter(|(_, operation)| !operation.mappings.is_empty())
    {
        operations
            .extend(wait(host.sync(&held, FileTransfer::new(direction).operation(operation)))?.operations);
    }
    let json = operations.iter().map(|operation| {
        serde_json::json!({"id": operation.id, "filesTransferred": operation.files, "bytesTransferred": operation.bytes})
    });
    let json = serde_json::json!({"operations": json.collect::<Vec<_>>()});
    session.out.value(&json, || {
        let lines = operations.iter().map(|operation| {
            format!("{}: {} files, {} bytes", operation.id, operation.files, operation.bytes)
        });
        lines.collect::<Vec<_>>().join("\n")
    });
    Ok(())
}

/// Parses `--in`/`--out` pairs into the mappings of one operation (`in` or
/// `out`); local paths are made absolute, an inbound local directory is a
/// directory mapping.
fn sync_operation(
    pairs: &[String],
    inbound: bool,
    mode: Option<u32>,
    exclude: &[String],
) -> Result<TransferOperation, Failure> {
    let (id, shape) = if inbound { ("in", "LOCAL:REMOTE") } else { ("out", "REMOTE:LOCAL") };
    pairs.iter().try_fold(TransferOperation::new(id), |operation, pair| {
        let (first, second) = pair
            .split_once(':')
            .filter(|(a, b)| !a.is_empty() && !b.is_empty())
            .ok_or_else(|| Failure::Usage(format!("{pair:?} is not {shape}")))?;
        let (local, remote) = if inbound { (first, second) } else { (second, first) };
        let local = std::path::absolute(local)
            .map_err(|error| Failure::Usage(format!("{local:?}: {error}")))?
            .to_string_lossy()
            .into_owned();
        let mapping = match inbound {
            true if Path::new(&local).is_dir() => PathMapping::directory(local, remote.to_owned()),
            true => PathMapping::file(local, remote.to_owned()),
            false if remote.ends_with('/') => PathMapping::directory(remote.to_owned(), local),
            false => PathMapping::file(remote.to_owned(), local),
        };
        Ok(operation.mapping(PathMapping { mode, exclude: exclude.to_vec(), ..mapping }))
    })
}
