//! The host's policy for sandbox providers, for any platform to embed.
//!
//! Provider-agnostic: it knows hooks and error kinds, never a provider's
//! configuration keys. [`host`] calls each lease hook as a host should
//! (ledger records before and after, the fallback for unconfirmed leases);
//! [`store`] is what it records into, with [`ledger`] (SQLite) the embedded
//! default and [`pg_ledger`] (PostgreSQL) a fleet's, whose hosts keep a
//! [`heartbeat`]; [`sweep`] destroys what a crashed run left; [`hosted`] holds any
//! provider (loaded, or plugged in by the embedder behind a trait object);
//! [`provider_set`] keeps versions side by side with hot swap and drain;
//! [`handover`] tells a newly active version which leases it must refuse
//! to reuse; [`async_host`] is the tokio facade; [`lock`] and [`providers`] pin and
//! install provider libraries, loading [`staging`]'s private copies; [`secrets`] keeps secrets out of the ledger;
//! [`request`] is the environment a host acts for.

pub mod async_host;
pub mod budget;
pub mod handover;
pub mod heartbeat;
pub mod host;
pub mod hosted;
pub mod ledger;
pub mod lock;
pub mod pg_ledger;
pub mod provider_set;
pub mod providers;
pub mod request;
pub mod secrets;
pub mod staging;
pub mod store;
pub mod sweep;

/// A hook error as JSON (`kind`, `message`, `httpStatus`, `operation`): the
/// shape sweep reports and command output share.
pub fn error_json(error: &provider_abi::ProviderError) -> serde_json::Value {
    serde_json::json!({
        "kind": error.kind.to_string(),
        "message": error.message.as_str(),
        "httpStatus": error.status(),
        "operation": error.operation(),
    })
}
