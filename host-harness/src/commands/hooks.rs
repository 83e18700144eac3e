//! The hook commands, for scripting: `acquire`, `resume`, `release`,
//! `destroy`, `probe`, `exec`. They read and print lease JSON (see
//! [`host_harness::lease_file`]) and record every lease in the ledger.

use super::{read_config, Failure, Session};
use host_harness::{
    host::{Host, Released},
    lease_file,
    ledger::Owner,
    render,
};
use provider_abi::{ExecuteParams, Lease, OutputSink, OutputStream};
use std::{io::Write, path::Path};

/// The run id the hook commands pass.
const RUN_ID: &str = "harness-cli";

fn host<'s>(session: &'s Session, config: &Path) -> Result<Host<'s>, Failure> {
    let config = read_config(config)?;
    Ok(Host::new(&session.provider, &session.ledger, &config, Owner::Command, RUN_ID, false))
}

fn print_lease(session: &Session, lease: &Lease) {
    let json = lease_file::to_json(lease);
    session.out.value(&json, || json.to_string());
}

fn expired(lease: &Lease) -> Lease {
    Lease { provider_lease_id: None.into(), expired: true, ..lease.clone() }
}

/// `acquire`: prints the new lease.
pub fn acquire(session: &Session, config: &Path) -> Result<(), Failure> {
    let held = host(session, config)?.acquire()?;
    print_lease(session, &held.lease);
    Ok(())
}

/// `resume`: prints the resumed lease, or an expired one (acquire anew).
pub fn resume(session: &Session, config: &Path, lease: &Path) -> Result<(), Failure> {
    let host = host(session, config)?;
    let held = host.hold(lease_file::read(lease).map_err(Failure::Usage)?)?;
    let resumed = host.resume(&held)?;
    print_lease(session, &resumed);
    Ok(())
}

/// `release` (`destroy` false) and `destroy`: prints the lease to keep, which
/// is expired unless the lease was paused for reuse.
pub fn release(session: &Session, config: &Path, lease: &Path, destroy: bool) -> Result<(), Failure> {
    let host = host(session, config)?;
    let held = host.hold(lease_file::read(lease).map_err(Failure::Usage)?)?;
    let kept = if destroy {
        host.destroy(&held)?;
        false
    } else {
        host.release(&held)? == Released::Kept
    };
    print_lease(session, &if kept { held.lease } else { expired(&held.lease) });
    Ok(())
}

/// `probe`: exit 1 unless the probe ran a command and cleaned up.
pub fn probe(session: &Session, config: &Path) -> Result<(), Failure> {
    let report = host(session, config)?.probe()?;
    let json = serde_json::json!({
        "ok": report.ok,
        "message": report.message.as_str(),
        "metadata": render::json_field(&report.metadata_json),
    });
    session.out.value(&json, || format!("{}: {}", if report.ok { "ok" } else { "FAILED" }, report.message));
    if report.ok {
        Ok(())
    } else {
        Err(Failure::Hook(None))
    }
}

/// `exec`: runs `command` in the lease, streaming its output to our stdout
/// and stderr, and exits with its exit code (124 on timeout, 125 when it
/// ended without one).
pub fn exec(session: &Session, config: &Path, lease: &Path, command: &[String]) -> Result<(), Failure> {
    let host = host(session, config)?;
    if !host.can_execute() {
        return Err(Failure::Usage("the provider does not implement `execute`".into()));
    }
    let held = host.hold(lease_file::read(lease).map_err(Failure::Usage)?)?;
    let (program, args) = command.split_first().ok_or_else(|| Failure::Usage("no command given".into()))?;
    let params = ExecuteParams {
        command: program.as_str().into(),
        args: args.iter().map(|arg| arg.as_str().into()).collect(),
        ..Default::default()
    };
    let mut live = |stream: OutputStream, chunk: &str| {
        let _ = match stream {
            OutputStream::Stdout => std::io::stdout().write_all(chunk.as_bytes()),
            OutputStream::Stderr => std::io::stderr().write_all(chunk.as_bytes()),
        };
    };
    let result = host.execute(&held, params, &mut OutputSink::new(&mut live))?;
    let _ = std::io::stdout().flush();
    let code = match (result.exit_code.into_option(), result.timed_out) {
        (Some(code), _) => u8::try_from(code).unwrap_or(1),
        (None, true) => 124,
        (None, false) => 125,
    };
    if result.timed_out {
        tracing::warn!("the command timed out");
    }
    if code == 0 {
        Ok(())
    } else {
        Err(Failure::Exit(code))
    }
}
