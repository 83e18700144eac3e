//! A command to run in a lease, and how it ended, in std types: what an
//! embedder builds and reads through [`Host::execute`](crate::Host::execute).
//! The host turns them into the provider's FFI types
//! ([`ExecuteParams`], [`ExecuteResult`]) at the boundary.

use provider_abi::{abi_stable::std_types::ROption, EnvVar, ExecuteParams, ExecuteResult, LeaseParams};
use serde_json::Value;
use std::time::Duration;

/// A command to run in a lease: a program and its arguments, passed
/// verbatim (no shell), with an optional working directory, extra
/// environment variables and deadline.
///
/// ```
/// # use provider_host::RemoteCommand;
/// # use std::time::Duration;
/// let command = RemoteCommand::new("/bin/sh").args(["-c", "echo hi"]).timeout(Duration::from_secs(30));
/// assert_eq!(command.args, ["-c", "echo hi"]);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RemoteCommand {
    /// The program.
    pub program: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// The working directory; the lease's workspace when `None`.
    pub cwd: Option<String>,
    /// Extra environment variables, as (name, value).
    pub env: Vec<(String, String)>,
    /// The deadline; the provider configuration's when `None`.
    pub timeout: Option<Duration>,
}

impl RemoteCommand {
    /// `program`, with no arguments.
    pub fn new(program: impl Into<String>) -> Self {
        RemoteCommand { program: program.into(), ..Default::default() }
    }

    /// Appends `args`.
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Runs in `dir` instead of the workspace.
    pub fn cwd(mut self, dir: impl Into<String>) -> Self {
        self.cwd = Some(dir.into());
        self
    }

    /// Adds the environment variable `name` = `value`.
    pub fn env(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.push((name.into(), value.into()));
        self
    }

    /// Ends the command after `timeout`.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// The provider's parameters for running this command in `lease`. A
    /// deadline beyond `u64` milliseconds is `u64::MAX`.
    pub(crate) fn into_params(self, lease: LeaseParams) -> ExecuteParams {
        ExecuteParams {
            lease,
            command: self.program.into(),
            args: self.args.into_iter().map(Into::into).collect(),
            cwd: self.cwd.map(Into::into).into(),
            env: self
                .env
                .into_iter()
                .map(|(name, value)| EnvVar { name: name.into(), value: value.into() })
                .collect(),
            timeout_ms: millis(self.timeout),
        }
    }
}

/// A deadline in the provider's milliseconds; beyond `u64` milliseconds, `u64::MAX`.
pub(crate) fn millis(timeout: Option<Duration>) -> ROption<u64> {
    timeout.map(|timeout| u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX)).into()
}

/// How a command ended.
#[derive(Debug, Clone, PartialEq)]
pub struct CommandOutcome {
    /// The exit code; `None` after a timeout or a signal.
    pub exit_code: Option<i32>,
    /// The signal that ended the command, if any.
    pub signal: Option<String>,
    /// True when the command ran out of time.
    pub timed_out: bool,
    /// Standard output's tail, as the provider kept it (the whole output
    /// went to the output callback as it arrived).
    pub stdout: String,
    /// Standard error's tail, likewise.
    pub stderr: String,
    /// The provider's details (`outputTruncated`...), a JSON object; `null`
    /// when the provider sent none or something that is not JSON.
    pub metadata: Value,
}

impl CommandOutcome {
    /// True when the command exited with code 0.
    pub fn success(&self) -> bool {
        self.exit_code == Some(0)
    }
}

impl From<ExecuteResult> for CommandOutcome {
    fn from(result: ExecuteResult) -> Self {
        CommandOutcome {
            exit_code: result.exit_code.into_option(),
            signal: result.signal.into_option().map(String::from),
            timed_out: result.timed_out,
            stdout: result.stdout.into(),
            stderr: result.stderr.into(),
            metadata: serde_json::from_str(&result.metadata_json).unwrap_or(Value::Null),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use abi_stable::std_types::{RSome, RString};

    #[test]
    fn a_command_becomes_the_providers_parameters_field_by_field() {
        let lease = LeaseParams::default();
        let params = RemoteCommand::new("/bin/sh")
            .args(["-c", "echo $X"])
            .cwd("/tmp")
            .env("X", "1")
            .timeout(Duration::from_millis(1500))
            .into_params(lease.clone());
        assert_eq!(params.lease, lease);
        assert_eq!(params.command, "/bin/sh");
        assert_eq!(params.args.iter().map(RString::as_str).collect::<Vec<_>>(), ["-c", "echo $X"]);
        assert_eq!(params.cwd, RSome("/tmp".into()));
        assert_eq!(params.env.len(), 1);
        assert_eq!((params.env[0].name.as_str(), params.env[0].value.as_str()), ("X", "1"));
        assert_eq!(params.timeout_ms, RSome(1500));
        let bare = RemoteCommand::new("true").into_params(lease);
        assert!(
            bare.args.is_empty() && bare.cwd.is_none() && bare.env.is_empty() && bare.timeout_ms.is_none()
        );
        let endless = RemoteCommand::new("true").timeout(Duration::MAX).into_params(LeaseParams::default());
        assert_eq!(endless.timeout_ms, RSome(u64::MAX));
    }

    #[test]
    fn a_result_reads_as_std_types() {
        let result = ExecuteResult {
            exit_code: RSome(3),
            signal: RSome("SIGTERM".into()),
            timed_out: true,
            stdout: "out".into(),
            stderr: "err".into(),
            metadata_json: r#"{"outputTruncated":true}"#.into(),
        };
        let outcome = CommandOutcome::from(result);
        assert_eq!(outcome.exit_code, Some(3));
        assert_eq!(outcome.signal.as_deref(), Some("SIGTERM"));
        assert!(outcome.timed_out && !outcome.success());
        assert_eq!((outcome.stdout.as_str(), outcome.stderr.as_str()), ("out", "err"));
        assert_eq!(outcome.metadata, serde_json::json!({"outputTruncated": true}));
        let plain = CommandOutcome::from(ExecuteResult { exit_code: RSome(0), ..Default::default() });
        assert!(plain.success());
        assert_eq!(plain.metadata, Value::Null);
    }
}
