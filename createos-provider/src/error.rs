//! The provider's error type.
//!
//! Every error has an [`ErrorKind`] (the ABI's) the host can branch on, an
//! optional HTTP status and operation label, and a one-line, user-facing
//! message (its `Display`). Messages keep the reference wording word for
//! word, because users search for them.
//!
//! Secrets: no constructor takes the API key, a response body, or a
//! transport error's text, so none of them can reach a message.

/// What kind of failure an [`Error`] is; the host branches on this, never on
/// message text. A lease that belongs elsewhere or whose record does not
/// verify is `NOT_THIS_ENVIRONMENT`; a 401 or 403 is `UNAUTHORIZED`.
pub use provider_abi::ErrorKind;

/// Fixed operation labels used in API, connection, timeout and protocol
/// errors (see `createos-api.md`).
pub mod op {
    /// `PUT`/`GET /files`.
    pub const FILE_TRANSFER: &str = "file transfer";
    /// `GET .../connect`.
    pub const OUTPUT_CONNECTION: &str = "output connection";
    /// `POST .../processes`.
    pub const PROCESS_CREATION: &str = "process creation";
    /// `DELETE .../processes/{pid}`.
    pub const PROCESS_CLEANUP: &str = "process cleanup";
    /// `POST .../exec`.
    pub const WORKSPACE_COMMAND: &str = "workspace command";
    /// Create, read, delete, pause, resume a sandbox.
    pub const SANDBOX_LIFECYCLE: &str = "sandbox lifecycle";
}

/// The desired end state of a sandbox transition; its CreateOS state name
/// (`running` / `paused`) is its `Display` and `as_ref`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, strum::Display, strum::AsRefStr)]
#[strum(serialize_all = "lowercase")]
pub enum SandboxTarget {
    /// `running`.
    Running,
    /// `paused`.
    Paused,
}

/// A provider error. `Display` is the user-facing one-line message. The
/// `&'static str` of a variant is its fixed operation label ([`op`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// Invalid provider configuration (one line, may list several problems).
    #[error("{0}")]
    InvalidConfig(String),
    /// Invalid input to a hook.
    #[error("{0}")]
    InvalidInput(String),
    /// The lease is not ours.
    #[error("CreateOS lease does not belong to this environment.")]
    NotThisEnvironment,
    /// The lease is this provider's, acquired for another company,
    /// environment or API origin, which it names (plain values only, else
    /// "(not shown)").
    #[error(
        "CreateOS lease does not belong to this environment. It was acquired for company {company}, environment {environment} at {api_url}: use a configuration with those (companyId, environmentId, apiUrl)."
    )]
    AcquiredElsewhere {
        /// The lease's company.
        company: String,
        /// The lease's environment.
        environment: String,
        /// The lease's API origin.
        api_url: String,
    },
    /// The lease record's binding does not verify under the configured API
    /// key: the record was altered (its sandbox id, marker, company, an added
    /// field...), or it was acquired under another key (another account, or
    /// the key was rotated). See `metadata.rs`.
    #[error(
        "CreateOS lease record does not verify under this API key (altered, or acquired with another key); destroy it with the configuration it was acquired with."
    )]
    LeaseNotVerified,
    /// The lease record carries no binding: it was acquired by a provider
    /// from before lease records were bound, or the binding was removed.
    #[error(
        "CreateOS lease record has no binding (acquired by an older provider); destroy it with the provider version and configuration it was acquired with."
    )]
    LeaseUnbound,
    /// A concurrent release is running.
    #[error("CreateOS lease cleanup is already in progress.")]
    CleanupInProgress,
    /// The lease's process cleanup is unconfirmed.
    #[error("CreateOS process cleanup is unconfirmed; destroy this lease before reusing it.")]
    CleanupUnconfirmed,
    /// The host could not record a created sandbox (its write-ahead record
    /// failed), so the sandbox was deleted again before anything else.
    #[error("CreateOS sandbox {sandbox} was deleted because the host could not record it: {reason}")]
    NotRecorded {
        /// The sandbox that was deleted.
        sandbox: String,
        /// The host's one-line reason.
        reason: String,
    },
    /// The host refused to record that a creation request was about to
    /// leave, so it was not sent; the host's error is returned as it is.
    #[error("{}", .0.message)]
    HostRefused(provider_abi::ProviderError),
    /// The sandbox named could not be deleted after a failed acquire or a
    /// probe: it may still exist.
    #[error("CreateOS cleanup is unconfirmed for sandbox {0}.")]
    SandboxCleanupUnconfirmed(String),
    /// A pause whose outcome cannot be confirmed (the sandbox vanished
    /// mid-pause, or the transition failed or ended in an unknown state),
    /// and why.
    #[error("CreateOS sandbox pause could not be confirmed; destroy this lease before reusing it. ({0})")]
    PauseUnconfirmed(Box<Error>),
    /// A workspace command (`mkdir -p`...) exited with this non-zero code.
    #[error("CreateOS workspace command failed with exit code {0}.")]
    WorkspaceCommandFailed(i64),
    /// The reply to `POST /sandboxes` was lost: a sandbox may exist that
    /// the provider cannot name.
    #[error(
        "CreateOS sandbox creation could not be confirmed; a sandbox may exist that this provider cannot name."
    )]
    SandboxCreationUnconfirmed,
    /// The reply to `POST /processes` was lost: a process may run that the
    /// provider cannot terminate.
    #[error("CreateOS process creation could not be confirmed; destroy the lease before reusing it.")]
    ProcessCreationUnconfirmed,
    /// A non-2xx reply (operation, HTTP status). The body was never read. A
    /// rejected key, and a command sent to a paused or deleted sandbox, say
    /// what to do.
    #[error("{}", api_message(.0, *.1))]
    Api(&'static str, u16),
    /// A sandbox transition ended in a state (a CreateOS state name) from
    /// which the desired one cannot be reached.
    #[error("CreateOS sandbox did not reach {desired}.")]
    DidNotReach {
        /// The desired state.
        desired: SandboxTarget,
        /// The state the sandbox was last seen in.
        state: String,
    },
    /// 2xx with a malformed reply.
    #[error("CreateOS returned a malformed {0} response.")]
    Protocol(&'static str),
    /// No HTTP answer.
    #[error("CreateOS {0} request failed: connection error.")]
    Connection(&'static str),
    /// No connection to the API origin (scheme, host, port) could be made
    /// (refused, no such host, TLS handshake failed, connect timeout): the
    /// request was never written, so nothing happened remotely.
    #[error("CreateOS {0} was not sent: cannot connect to {1}.")]
    Unreachable(&'static str, String),
    /// The deadline passed while the request waited for the request budget:
    /// nothing was sent, so nothing happened remotely.
    #[error("CreateOS {0} was not sent: the request budget had no room before the deadline.")]
    NotSent(&'static str),
    /// The deadline passed.
    #[error("CreateOS {0} timed out.")]
    Timeout(&'static str),
    /// The caller cancelled a command.
    #[error("CreateOS command was cancelled.")]
    Cancelled,
    /// Internal error.
    #[error("{0}")]
    Internal(String),
    /// The process tree of a timed-out, cancelled or failed command could not
    /// be confirmed terminated; the lease is marked unconfirmed.
    #[error("CreateOS command cleanup failed; process termination is unconfirmed.")]
    CommandCleanupUnconfirmed,
    /// The output stream said the output the provider still needed was
    /// evicted from the journal (`output_offset_expired`).
    #[error("CreateOS command output was evicted before it could be read.")]
    OutputEvicted,
    /// The output stream reported an error other than eviction.
    #[error("CreateOS output connection reported an error.")]
    OutputStreamError,
    /// A file-sync command in the sandbox (staging, moving, archiving,
    /// extracting) exited non-zero.
    #[error("CreateOS transfer command failed.")]
    TransferFailed,
    /// A sync path resolved (in the sandbox, through its links) outside the
    /// workspace, or a host source holds a link leaving it.
    #[error("CreateOS transfer path escapes the workspace.")]
    PathEscapes,
    /// A downloaded archive holds an entry that could land outside its
    /// destination, or more than the extraction limit.
    #[error("CreateOS archive contains unsafe entries or exceeds the extraction limit.")]
    UnsafeArchive,
    /// Reading or writing a host file during sync failed.
    #[error("CreateOS transfer could not {action} a host file: {reason}.")]
    HostIo {
        /// `read` or `write`.
        action: &'static str,
        /// The I/O error kind.
        reason: String,
    },
    /// A post-upload command failed with this exit code (`None`: it timed
    /// out or had no exit code).
    #[error("CreateOS post-upload command failed{}.", .0.map(|code| format!(" with exit code {code}")).unwrap_or_default())]
    PostUploadFailed(Option<i32>),
}

impl Error {
    /// The kind the host branches on.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::InvalidConfig(_) => ErrorKind::INVALID_CONFIG,
            Error::InvalidInput(_) | Error::PathEscapes | Error::HostIo { .. } => ErrorKind::INVALID_INPUT,
            Error::NotThisEnvironment
            | Error::AcquiredElsewhere { .. }
            | Error::LeaseNotVerified
            | Error::LeaseUnbound => ErrorKind::NOT_THIS_ENVIRONMENT,
            Error::CleanupInProgress => ErrorKind::CLEANUP_IN_PROGRESS,
            Error::CleanupUnconfirmed
            | Error::SandboxCleanupUnconfirmed(_)
            | Error::PauseUnconfirmed(_)
            | Error::CommandCleanupUnconfirmed => ErrorKind::CLEANUP_UNCONFIRMED,
            Error::SandboxCreationUnconfirmed | Error::ProcessCreationUnconfirmed => {
                ErrorKind::CREATION_UNCONFIRMED
            }
            Error::Api(_, 401 | 403) => ErrorKind::UNAUTHORIZED,
            Error::Api(..)
            | Error::DidNotReach { .. }
            | Error::WorkspaceCommandFailed(_)
            | Error::OutputEvicted
            | Error::OutputStreamError
            | Error::TransferFailed
            | Error::PostUploadFailed(_) => ErrorKind::API,
            Error::Protocol(_) | Error::UnsafeArchive => ErrorKind::PROTOCOL,
            Error::Connection(_) | Error::Unreachable(..) => ErrorKind::CONNECTION,
            Error::Timeout(_) | Error::NotSent(_) => ErrorKind::TIMEOUT,
            Error::Cancelled => ErrorKind::CANCELLED,
            // The host's own error crosses back unchanged (`to_abi`).
            Error::Internal(_) | Error::NotRecorded { .. } | Error::HostRefused(_) => ErrorKind::INTERNAL,
        }
    }

    /// The HTTP status of an API error.
    pub fn http_status(&self) -> Option<u16> {
        match self {
            Error::Api(_, status) => Some(*status),
            _ => None,
        }
    }

    /// The fixed operation label, if the error came from a CreateOS call.
    pub fn operation(&self) -> Option<&'static str> {
        match self {
            Error::Api(operation, _)
            | Error::Protocol(operation)
            | Error::Connection(operation)
            | Error::Unreachable(operation, _)
            | Error::Timeout(operation)
            | Error::NotSent(operation) => Some(operation),
            Error::DidNotReach { .. } => Some(op::SANDBOX_LIFECYCLE),
            Error::WorkspaceCommandFailed(_) | Error::TransferFailed => Some(op::WORKSPACE_COMMAND),
            Error::PauseUnconfirmed(cause) => cause.operation(),
            Error::CommandCleanupUnconfirmed => Some(op::PROCESS_CLEANUP),
            Error::OutputEvicted | Error::OutputStreamError => Some(op::OUTPUT_CONNECTION),
            Error::UnsafeArchive => Some(op::FILE_TRANSFER),
            _ => None,
        }
    }

    /// `InvalidConfig` with a one-line message.
    pub fn invalid_config(message: impl Into<String>) -> Self {
        Error::InvalidConfig(one_line(message.into()))
    }

    /// `InvalidInput` with a one-line message.
    pub fn invalid_input(message: impl Into<String>) -> Self {
        Error::InvalidInput(one_line(message.into()))
    }

    /// A host file could not be read; only the I/O error's kind is kept,
    /// never a path or remote text.
    pub fn host_read(error: std::io::Error) -> Self {
        Error::HostIo { action: "read", reason: error.kind().to_string() }
    }

    /// A host file could not be written (see [`Error::host_read`]).
    pub fn host_write(error: std::io::Error) -> Self {
        Error::HostIo { action: "write", reason: error.kind().to_string() }
    }

    /// `Internal` with a one-line message.
    pub fn internal(message: impl Into<String>) -> Self {
        Error::Internal(one_line(message.into()))
    }

    /// An HTTP 404 from CreateOS (the resource does not exist).
    pub fn is_not_found(&self) -> bool {
        matches!(self, Error::Api(_, 404))
    }

    /// A transition ended because the sandbox is `destroyed` or `failed`
    /// (for resume: the lease has expired).
    pub fn is_terminal_state(&self) -> bool {
        matches!(self, Error::DidNotReach { state, .. } if state == "destroyed" || state == "failed")
    }

    /// No connection to the API could be made: the request was never written.
    pub fn is_unreachable(&self) -> bool {
        matches!(self, Error::Unreachable(..))
    }

    /// The request was never sent (its deadline passed in the pacer queue,
    /// or the host refused to record that it was leaving).
    pub fn is_not_sent(&self) -> bool {
        matches!(self, Error::NotSent(_) | Error::HostRefused(_))
    }

    /// Transient failures: 5xx, 429, connection errors. Never an expiry.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Api(_, status) => *status >= 500 || *status == 429,
            Error::Connection(_) | Error::Unreachable(..) => true,
            _ => false,
        }
    }
}

/// The operations that act inside a sandbox on behalf of a command.
const COMMAND_OPERATIONS: [&str; 3] = [op::PROCESS_CREATION, op::FILE_TRANSFER, op::WORKSPACE_COMMAND];

/// The message of an HTTP error reply.
fn api_message(operation: &str, status: u16) -> String {
    match status {
        401 | 403 => format!("CreateOS rejected the API key (HTTP {status})."),
        409 if COMMAND_OPERATIONS.contains(&operation) => format!(
            "CreateOS sandbox is paused (HTTP 409 on {operation}); resume the lease before running commands in it."
        ),
        404 if COMMAND_OPERATIONS.contains(&operation) => format!(
            "CreateOS sandbox no longer exists (HTTP 404 on {operation}); the lease was destroyed or expired, acquire a new one."
        ),
        _ => format!("CreateOS {operation} failed with HTTP {status}."),
    }
}

/// Messages are one line: control characters become spaces.
fn one_line(message: String) -> String {
    message.replace(char::is_control, " ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_kinds_and_labels() {
        type Case = (Error, &'static str, ErrorKind, Option<u16>, Option<&'static str>);
        let cases: Vec<Case> = vec![
            (
                Error::NotThisEnvironment,
                "CreateOS lease does not belong to this environment.",
                ErrorKind::NOT_THIS_ENVIRONMENT,
                None,
                None,
            ),
            (
                Error::LeaseNotVerified,
                "CreateOS lease record does not verify under this API key (altered, or acquired with another key); destroy it with the configuration it was acquired with.",
                ErrorKind::NOT_THIS_ENVIRONMENT,
                None,
                None,
            ),
            (
                Error::LeaseUnbound,
                "CreateOS lease record has no binding (acquired by an older provider); destroy it with the provider version and configuration it was acquired with.",
                ErrorKind::NOT_THIS_ENVIRONMENT,
                None,
                None,
            ),
            (
                Error::CleanupInProgress,
                "CreateOS lease cleanup is already in progress.",
                ErrorKind::CLEANUP_IN_PROGRESS,
                None,
                None,
            ),
            (
                Error::CleanupUnconfirmed,
                "CreateOS process cleanup is unconfirmed; destroy this lease before reusing it.",
                ErrorKind::CLEANUP_UNCONFIRMED,
                None,
                None,
            ),
            (
                Error::DidNotReach { desired: SandboxTarget::Running, state: "failed".into() },
                "CreateOS sandbox did not reach running.",
                ErrorKind::API,
                None,
                Some("sandbox lifecycle"),
            ),
            (
                Error::DidNotReach { desired: SandboxTarget::Paused, state: "error".into() },
                "CreateOS sandbox did not reach paused.",
                ErrorKind::API,
                None,
                Some("sandbox lifecycle"),
            ),
            (
                Error::Api(op::FILE_TRANSFER, 503),
                "CreateOS file transfer failed with HTTP 503.",
                ErrorKind::API,
                Some(503),
                Some("file transfer"),
            ),
            (
                Error::Connection(op::PROCESS_CREATION),
                "CreateOS process creation request failed: connection error.",
                ErrorKind::CONNECTION,
                None,
                Some("process creation"),
            ),
            (
                Error::Timeout(op::SANDBOX_LIFECYCLE),
                "CreateOS sandbox lifecycle timed out.",
                ErrorKind::TIMEOUT,
                None,
                Some("sandbox lifecycle"),
            ),
            (
                Error::Protocol(op::OUTPUT_CONNECTION),
                "CreateOS returned a malformed output connection response.",
                ErrorKind::PROTOCOL,
                None,
                Some("output connection"),
            ),
            (Error::Cancelled, "CreateOS command was cancelled.", ErrorKind::CANCELLED, None, None),
            (
                Error::Api(op::SANDBOX_LIFECYCLE, 401),
                "CreateOS rejected the API key (HTTP 401).",
                ErrorKind::UNAUTHORIZED,
                Some(401),
                Some("sandbox lifecycle"),
            ),
            (
                Error::Api(op::PROCESS_CREATION, 403),
                "CreateOS rejected the API key (HTTP 403).",
                ErrorKind::UNAUTHORIZED,
                Some(403),
                Some("process creation"),
            ),
            (
                Error::Api(op::PROCESS_CREATION, 409),
                "CreateOS sandbox is paused (HTTP 409 on process creation); resume the lease before running commands in it.",
                ErrorKind::API,
                Some(409),
                Some("process creation"),
            ),
            (
                Error::Api(op::FILE_TRANSFER, 404),
                "CreateOS sandbox no longer exists (HTTP 404 on file transfer); the lease was destroyed or expired, acquire a new one.",
                ErrorKind::API,
                Some(404),
                Some("file transfer"),
            ),
            (
                Error::Api(op::SANDBOX_LIFECYCLE, 409),
                "CreateOS sandbox lifecycle failed with HTTP 409.",
                ErrorKind::API,
                Some(409),
                Some("sandbox lifecycle"),
            ),
        ];
        for (err, message, kind, status, operation) in cases {
            assert_eq!(err.to_string(), message);
            assert_eq!(err.kind(), kind, "{message}");
            assert_eq!(err.http_status(), status, "{message}");
            assert_eq!(err.operation(), operation, "{message}");
        }
    }

    #[test]
    fn helpers() {
        assert!(Error::Api(op::SANDBOX_LIFECYCLE, 404).is_not_found());
        assert!(!Error::Api(op::SANDBOX_LIFECYCLE, 410).is_not_found());
        assert!(Error::DidNotReach { desired: SandboxTarget::Running, state: "destroyed".into() }
            .is_terminal_state());
        assert!(Error::DidNotReach { desired: SandboxTarget::Running, state: "failed".into() }
            .is_terminal_state());
        assert!(!Error::DidNotReach { desired: SandboxTarget::Running, state: "error".into() }
            .is_terminal_state());
        assert!(Error::Api(op::SANDBOX_LIFECYCLE, 502).is_transient());
        assert!(Error::Connection(op::SANDBOX_LIFECYCLE).is_transient());
        assert!(!Error::Api(op::SANDBOX_LIFECYCLE, 404).is_transient());
    }

    #[test]
    fn free_text_messages_are_one_line() {
        let err = Error::invalid_config("a\nb\r\0c");
        assert_eq!(err.to_string(), "a b  c");
        assert_eq!(err.kind(), ErrorKind::INVALID_CONFIG);
    }
}
