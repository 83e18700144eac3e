//! Errors that cross the boundary as data.

use abi_stable::{std_types::RString, StableAbi};
use std::fmt;

/// What went wrong, as a code a host can branch on without reading text.
///
/// A newtype over `u16` rather than a Rust enum so that a newer provider may
/// return a kind an older host does not know without undefined behaviour;
/// such a kind displays as `unknown(N)`.
#[repr(transparent)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(StableAbi, Copy, Clone, PartialEq, Eq, Hash)]
pub struct ErrorKind(pub u16);

macro_rules! error_kinds {
    ($($(#[$doc:meta])* $name:ident = $code:literal, $label:literal;)*) => {
        impl ErrorKind {
            $($(#[$doc])* pub const $name: ErrorKind = ErrorKind($code);)*

            /// Every kind this version of the ABI defines.
            pub const ALL: &'static [ErrorKind] = &[$(ErrorKind::$name),*];

            /// A stable snake_case name, for logs and JSON output.
            pub fn name(self) -> &'static str {
                match self.0 {
                    $($code => $label,)*
                    _ => "unknown",
                }
            }
        }
    };
}

error_kinds! {
    /// The provider configuration is invalid.
    INVALID_CONFIG = 1, "invalid_config";
    /// A hook argument is invalid (bad lease metadata, variable name, expiry...).
    INVALID_INPUT = 2, "invalid_input";
    /// The lease belongs to another provider, company, environment or API.
    NOT_THIS_ENVIRONMENT = 3, "not_this_environment";
    /// Another release or destroy of the same lease is running.
    CLEANUP_IN_PROGRESS = 4, "cleanup_in_progress";
    /// Process cleanup on the lease could not be confirmed: destroy it, never reuse it.
    CLEANUP_UNCONFIRMED = 5, "cleanup_unconfirmed";
    /// A remote resource may or may not have been created.
    CREATION_UNCONFIRMED = 6, "creation_unconfirmed";
    /// The remote API answered with an error status (see `http_status`, `operation`).
    API = 7, "api";
    /// The remote API answered something malformed.
    PROTOCOL = 8, "protocol";
    /// The remote API could not be reached.
    CONNECTION = 9, "connection";
    /// The operation's deadline passed.
    TIMEOUT = 10, "timeout";
    /// The operation was cancelled (release or shutdown).
    CANCELLED = 11, "cancelled";
    /// The provider does not implement this hook.
    UNSUPPORTED = 12, "unsupported";
    /// A bug: a panic inside a hook, a broken invariant.
    INTERNAL = 13, "internal";
    /// The remote API rejected the credentials (HTTP 401/403): fix the key, do not retry.
    UNAUTHORIZED = 14, "unauthorized";
}

impl fmt::Debug for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            "unknown" => write!(f, "unknown({})", self.0),
            name => f.write_str(name),
        }
    }
}

/// An error returned by a hook: a kind, an optional HTTP status and
/// operation label, and a one-line message.
#[repr(C)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(StableAbi, Clone, PartialEq, Eq)]
pub struct ProviderError {
    /// What went wrong.
    pub kind: ErrorKind,
    /// The remote API's HTTP status, 0 when there is none.
    pub http_status: u16,
    /// The fixed label of the remote operation (`process creation`...), or empty.
    pub operation: RString,
    /// The human-readable message. Never holds secrets or response bodies.
    pub message: RString,
}

impl ProviderError {
    /// An error of `kind` with `message`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self { kind, http_status: 0, operation: RString::new(), message: RString::from(message.into()) }
    }

    /// An API error: the remote answered `status` to `operation`.
    pub fn api(status: u16, operation: &str, message: impl Into<String>) -> Self {
        Self { http_status: status, operation: operation.into(), ..Self::new(ErrorKind::API, message) }
    }

    /// Attaches an HTTP status and operation label to any kind.
    pub fn with_http(mut self, status: Option<u16>, operation: Option<&str>) -> Self {
        self.http_status = status.unwrap_or(0);
        self.operation = operation.unwrap_or_default().into();
        self
    }

    /// The hook is not implemented.
    pub fn unsupported(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::UNSUPPORTED, message)
    }

    /// An internal error.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::INTERNAL, message)
    }

    /// The HTTP status, if the remote answered one.
    pub fn status(&self) -> Option<u16> {
        (self.http_status != 0).then_some(self.http_status)
    }

    /// The operation label, if any.
    pub fn operation(&self) -> Option<&str> {
        (!self.operation.is_empty()).then_some(self.operation.as_str())
    }
}

impl fmt::Debug for ProviderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut debug = f.debug_struct("ProviderError");
        debug.field("kind", &self.kind);
        if let Some(status) = self.status() {
            debug.field("http_status", &status);
        }
        if let Some(operation) = self.operation() {
            debug.field("operation", &operation);
        }
        debug.field("message", &self.message.as_str()).finish()
    }
}

impl fmt::Display for ProviderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ProviderError {}

/// What every hook returns.
pub type HookResult<T> = Result<T, ProviderError>;
