//! Lease metadata: what the provider stores with a lease, its binding, and
//! the ownership check every lease hook starts with. Never holds the API key.
//!
//! # The binding: lease records are tamper-evident
//!
//! A lease record (the sandbox id plus this metadata) is untrusted input: it
//! travels through files, databases and other processes, and whoever can
//! edit it could otherwise point `providerLeaseId` at another tenant's
//! sandbox on the same account, or change the marker, company or shape. So
//! the provider binds the record's identity with a MAC when it hands the
//! lease out (`acquire_lease`; `resume_lease` returns the same bound record),
//! and every hook that takes a lease verifies it before it sends anything:
//! they all start with `lease::Context::own`, which calls
//! [`LeaseMetadata::owned`], so a hook added later gets the check too.
//!
//! - **What is bound**: every metadata field (provider, API origin, company,
//!   environment, remote cwd, marker, shape, rootfs, region, reuseLease) and
//!   the sandbox id, which travels beside the metadata as `providerLeaseId`.
//!   The account is bound by the key itself. [`LeaseMetadata::canonical`]
//!   destructures the struct exhaustively, so a field added later cannot be
//!   left out of the MAC without a compile error. Fields the struct does not
//!   know are refused (`deny_unknown_fields`): an added field is tampering.
//! - **Canonical form**: a domain string, then each field as a presence byte,
//!   its length as 8 big-endian bytes and its bytes. Boundaries cannot shift
//!   (`"ab"+"c"` and `"a"+"bc"` differ) and `None` differs from `Some("")`.
//!   The MAC covers the parsed fields, not the JSON text, so a host that
//!   re-serialises the metadata (key order, whitespace) keeps it valid.
//! - **The key**: `HMAC-SHA256(key = apiKey, "createos lease binding v1")`,
//!   and the tag is `HMAC-SHA256(that key, canonical form)`, stored as
//!   `"binding": "<base64url, no padding>"`. It is compared in constant time
//!   (`Mac::verify_slice`). Why the API key: it is the one secret the
//!   provider already has that a lease holder does not; it identifies the
//!   account, so a record of another account fails for free; and it needs no
//!   new ABI field or host secret (the host should not have to manage keys
//!   of a provider's own). Anyone holding the API key could forge a binding,
//!   but could equally call CreateOS directly: the binding protects against
//!   holders of the *record*, not of the key.
//! - **Key rotation**: a lease acquired under the old key does not verify
//!   under the new one ([`Error::LeaseNotVerified`]: "does not verify under
//!   this API key ... destroy it with the configuration it was acquired
//!   with"). Destroy (or release) such leases with the old configuration
//!   before the old key is revoked; after that, the sandbox id in the record
//!   is what to delete through CreateOS itself.
//! - **Records from before the binding** ([`Error::LeaseUnbound`]) are
//!   refused by every hook, destroy included. An unbound record cannot be
//!   told from a forged one (removing the binding is the easiest forgery),
//!   and honouring it for destroy would let any record holder delete any
//!   sandbox of the account, which is the attack the binding exists to stop.
//!   The message says to destroy it with the provider version that acquired
//!   it (the host can load that version side by side).

use crate::{config::ProviderConfig, error::Error};
use base64::{engine::general_purpose::URL_SAFE_NO_PAD, Engine};
use hmac::{Hmac, Mac};
use provider_abi::EnvironmentParams;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::Sha256;

/// The provider name stored in every lease.
pub const PROVIDER: &str = "createos";
/// The workspace directory inside every sandbox.
pub const REMOTE_CWD: &str = "/paperclip-workspace";
/// Where the lease's marker file lives inside the sandbox.
pub const MARKER_PATH: &str = "/paperclip-workspace/.paperclip-runtime/.paperclip-createos-lease";
/// The directory holding the marker.
pub const RUNTIME_DIR: &str = "/paperclip-workspace/.paperclip-runtime";

/// The label the binding key is derived with from the API key; a new
/// canonical form gets a new label.
const BINDING_KEY_LABEL: &[u8] = b"createos lease binding v1";
/// The first field of every canonical form.
const CANONICAL_DOMAIN: &str = "createos lease record v1";

type HmacSha256 = Hmac<Sha256>;

/// The lease metadata, as JSON (camelCase) in `Lease::metadata_json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LeaseMetadata {
    /// Always `createos`.
    pub provider: String,
    /// The API origin the sandbox lives on.
    pub api_url: String,
    /// The owning company.
    pub company_id: String,
    /// The owning environment.
    pub environment_id: String,
    /// The workspace directory.
    pub remote_cwd: String,
    /// A random UUID written into the sandbox, read back on resume.
    pub marker: String,
    /// The shape the sandbox was created with.
    pub shape: String,
    /// The root filesystem it was created with.
    pub rootfs: Option<String>,
    /// The region it was created in.
    pub region: Option<String>,
    /// Whether release pauses (true) or deletes (false).
    pub reuse_lease: bool,
    /// The MAC binding every field above and the sandbox id (base64url, no
    /// padding); `None` until [`LeaseMetadata::bind`], and on records from
    /// before lease records were bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub binding: Option<String>,
}

impl LeaseMetadata {
    /// Metadata for a new lease of `env` under `config`, not yet bound (the
    /// sandbox id is not known before the sandbox exists).
    pub fn new(env: &EnvironmentParams, config: &ProviderConfig) -> Self {
        Self {
            provider: PROVIDER.into(),
            api_url: config.origin(),
            company_id: env.company_id.to_string(),
            environment_id: env.environment_id.to_string(),
            remote_cwd: REMOTE_CWD.into(),
            marker: uuid::Uuid::new_v4().to_string(),
            shape: config.shape.clone(),
            rootfs: config.rootfs.clone(),
            region: config.region.clone(),
            reuse_lease: config.reuse_lease,
            binding: None,
        }
    }

    /// The metadata bound to sandbox `sandbox_id` under `config`'s API key.
    pub fn bind(mut self, sandbox_id: &str, config: &ProviderConfig) -> Self {
        let tag = self.mac(sandbox_id, config).finalize().into_bytes();
        self.binding = Some(URL_SAFE_NO_PAD.encode(tag));
        self
    }

    /// The metadata as JSON text.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("lease metadata serialises")
    }

    /// Parses the metadata of the lease of sandbox `sandbox_id` and checks,
    /// without any request, that it is this provider's, belongs to `env`
    /// under `config` (same company, environment and API origin) and that its
    /// binding verifies under `config`'s API key. In that order:
    ///
    /// - not a JSON object of provider `createos`: [`Error::NotThisEnvironment`];
    /// - an unknown or missing field, a wrong type: [`Error::LeaseNotVerified`]
    ///   (a record of this provider's shape that was altered);
    /// - another company, environment or API origin: [`Error::NotThisEnvironment`];
    /// - no binding: [`Error::LeaseUnbound`];
    /// - a binding that does not verify: [`Error::LeaseNotVerified`].
    pub fn owned(
        text: &str,
        sandbox_id: &str,
        env: &EnvironmentParams,
        config: &ProviderConfig,
    ) -> Result<Self, Error> {
        let value: Value = serde_json::from_str(text).map_err(|_| Error::NotThisEnvironment)?;
        if value.get("provider").and_then(Value::as_str) != Some(PROVIDER) {
            return Err(Error::NotThisEnvironment);
        }
        let metadata: LeaseMetadata = serde_json::from_value(value).map_err(|_| Error::LeaseNotVerified)?;
        let owned = metadata.company_id == env.company_id.as_str()
            && metadata.environment_id == env.environment_id.as_str()
            && metadata.api_url == config.origin();
        if !owned {
            // Read from an unverified record: shown only when short and plain.
            let shown = |value: &str| {
                let plain = !value.is_empty()
                    && value.len() <= 128
                    && value.chars().all(|c| c.is_ascii_alphanumeric() || "-_.:/".contains(c));
                if plain {
                    format!("`{value}`")
                } else {
                    "(not shown)".to_owned()
                }
            };
            return Err(Error::AcquiredElsewhere {
                company: shown(&metadata.company_id),
                environment: shown(&metadata.environment_id),
                api_url: shown(&metadata.api_url),
            });
        }
        let binding = metadata.binding.as_deref().ok_or(Error::LeaseUnbound)?;
        let tag = URL_SAFE_NO_PAD.decode(binding).map_err(|_| Error::LeaseNotVerified)?;
        metadata.mac(sandbox_id, config).verify_slice(&tag).map_err(|_| Error::LeaseNotVerified)?;
        Ok(metadata)
    }

    /// True when the configuration asks for another kind of sandbox.
    pub fn config_changed(&self, config: &ProviderConfig) -> bool {
        self.shape != config.shape || self.rootfs != config.rootfs || self.region != config.region
    }

    /// True when the marker is a well-formed UUID.
    pub fn marker_is_well_formed(&self) -> bool {
        uuid::Uuid::parse_str(&self.marker).is_ok_and(|uuid| uuid.hyphenated().to_string() == self.marker)
    }

    /// The MAC over this record's canonical form, keyed by the binding key
    /// of `config`'s API key, ready to finalize or verify.
    fn mac(&self, sandbox_id: &str, config: &ProviderConfig) -> HmacSha256 {
        let mut derive = HmacSha256::new_from_slice(config.api_key.expose().as_bytes())
            .expect("HMAC takes any key length");
        derive.update(BINDING_KEY_LABEL);
        let key = derive.finalize().into_bytes();
        let mut mac = HmacSha256::new_from_slice(&key).expect("HMAC takes any key length");
        mac.update(&self.canonical(sandbox_id));
        mac
    }

    /// The bytes the binding covers: the domain, then each field as a
    /// presence byte (0 absent, 1 present), its length (8 bytes, big-endian)
    /// and its bytes. The struct is destructured without `..` so that a new
    /// field must be placed here (or explicitly left out) to compile.
    fn canonical(&self, sandbox_id: &str) -> Vec<u8> {
        let LeaseMetadata {
            provider,
            api_url,
            company_id,
            environment_id,
            remote_cwd,
            marker,
            shape,
            rootfs,
            region,
            reuse_lease,
            binding: _,
        } = self;
        let reuse: &str = if *reuse_lease { "true" } else { "false" };
        canonical_form(&[
            Some(provider),
            Some(api_url),
            Some(company_id),
            Some(environment_id),
            Some(sandbox_id),
            Some(remote_cwd),
            Some(marker),
            Some(shape),
            rootfs.as_deref(),
            region.as_deref(),
            Some(reuse),
        ])
    }
}

/// The length-prefixed encoding of `fields` after the domain string: each
/// as a presence byte, then (when present) its length as 8 big-endian bytes
/// and its bytes.
fn canonical_form(fields: &[Option<&str>]) -> Vec<u8> {
    let mut out = Vec::new();
    for field in [Some(CANONICAL_DOMAIN)].iter().chain(fields) {
        match field {
            None => out.push(0),
            Some(text) => {
                out.push(1);
                out.extend_from_slice(&(text.len() as u64).to_be_bytes());
                out.extend_from_slice(text.as_bytes());
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;
    use serde_json::json;

    const KEY: &str = "test-key-0123456789";

    fn config(key: &str) -> ProviderConfig {
        let value = json!({"apiUrl": "https://api.example.test", "apiKey": key, "shape": "s-1vcpu-1gb"});
        ProviderConfig::from_json(&value).unwrap()
    }

    fn env() -> EnvironmentParams {
        EnvironmentParams {
            driver_key: "createos".into(),
            company_id: "company-a".into(),
            environment_id: "env-a".into(),
            config_json: "{}".into(),
            ..Default::default()
        }
    }

    fn bound() -> (LeaseMetadata, String) {
        let metadata = LeaseMetadata::new(&env(), &config(KEY)).bind("sbx-a", &config(KEY));
        let json = metadata.to_json();
        (metadata, json)
    }

    #[test]
    fn field_boundaries_cannot_shift() {
        type Fields<'a> = &'a [Option<&'a str>];
        let cases: [(Fields, Fields); 5] = [
            (&[Some("ab"), Some("c")], &[Some("a"), Some("bc")]),
            (&[Some(""), Some("x")], &[Some("x"), Some("")]),
            (&[None, Some("x")], &[Some(""), Some("x")]),
            (&[Some("a\u{1}\0"), Some("")], &[Some("a"), Some("\0")]),
            (&[Some("ab"), None], &[None, Some("ab")]),
        ];
        for (left, right) in cases {
            assert_ne!(canonical_form(left), canonical_form(right), "{left:?} vs {right:?}");
        }
    }

    #[test]
    fn every_field_and_the_sandbox_id_change_the_canonical_form() {
        let (metadata, _) = bound();
        let original = metadata.canonical("sbx-a");
        let edits: [fn(&mut LeaseMetadata); 10] = [
            |m| m.provider.push('x'),
            |m| m.api_url.push('x'),
            |m| m.company_id.push('x'),
            |m| m.environment_id.push('x'),
            |m| m.remote_cwd.push('x'),
            |m| m.marker.push('x'),
            |m| m.shape.push('x'),
            |m| m.rootfs = Some(String::new()),
            |m| m.region = Some(String::new()),
            |m| m.reuse_lease = !m.reuse_lease,
        ];
        for (number, edit) in edits.iter().enumerate() {
            let mut edited = metadata.clone();
            edit(&mut edited);
            assert_ne!(edited.canonical("sbx-a"), original, "edit {number}");
        }
        assert_ne!(metadata.canonical("sbx-b"), original);
        // Moving a character from the company to the environment is seen.
        let mut shifted = metadata.clone();
        let last = shifted.company_id.pop().unwrap();
        shifted.environment_id.insert(0, last);
        assert_ne!(shifted.canonical("sbx-a"), original);
    }

    #[test]
    fn a_bound_record_verifies_and_never_holds_the_key() {
        let (metadata, json) = bound();
        assert!(!json.contains(KEY));
        let binding = metadata.binding.clone().unwrap();
        assert_eq!(binding.len(), 43, "32 bytes, base64url without padding");
        assert_eq!(LeaseMetadata::owned(&json, "sbx-a", &env(), &config(KEY)).unwrap(), metadata);
        // Re-serialised by a host (another key order, whitespace): still valid.
        let value: Value = serde_json::from_str(&json).unwrap();
        let pretty = serde_json::to_string_pretty(&value).unwrap();
        assert!(LeaseMetadata::owned(&pretty, "sbx-a", &env(), &config(KEY)).is_ok());
        // Binding is deterministic: the same record under the same key.
        let again = LeaseMetadata { binding: None, ..metadata.clone() }.bind("sbx-a", &config(KEY));
        assert_eq!(again.binding, metadata.binding);
    }

    #[test]
    fn altered_records_are_refused_with_one_line_that_echoes_nothing() {
        let (_, json) = bound();
        let original: Value = serde_json::from_str(&json).unwrap();
        let edit = |change: &dyn Fn(&mut Value)| {
            let mut value = original.clone();
            change(&mut value);
            value.to_string()
        };
        type Case = (&'static str, String, &'static str, &'static str, Error);
        let cases: Vec<Case> = vec![
            ("another sandbox id", json.clone(), "sbx-b", KEY, Error::LeaseNotVerified),
            ("another key", json.clone(), "sbx-a", "other-key", Error::LeaseNotVerified),
            (
                "marker",
                edit(&|v| v["marker"] = json!(uuid::Uuid::new_v4().to_string())),
                "sbx-a",
                KEY,
                Error::LeaseNotVerified,
            ),
            ("shape", edit(&|v| v["shape"] = json!("s-8vcpu-16gb")), "sbx-a", KEY, Error::LeaseNotVerified),
            ("reuseLease", edit(&|v| v["reuseLease"] = json!(true)), "sbx-a", KEY, Error::LeaseNotVerified),
            ("rootfs", edit(&|v| v["rootfs"] = json!("")), "sbx-a", KEY, Error::LeaseNotVerified),
            ("added field", edit(&|v| v["extra"] = json!(1)), "sbx-a", KEY, Error::LeaseNotVerified),
            (
                "missing field",
                edit(&|v| {
                    v.as_object_mut().unwrap().remove("remoteCwd");
                }),
                "sbx-a",
                KEY,
                Error::LeaseNotVerified,
            ),
            ("binding garbage", edit(&|v| v["binding"] = json!("!!")), "sbx-a", KEY, Error::LeaseNotVerified),
            (
                "binding truncated",
                edit(&|v| v["binding"] = json!("AAAA")),
                "sbx-a",
                KEY,
                Error::LeaseNotVerified,
            ),
            (
                "no binding",
                edit(&|v| {
                    v.as_object_mut().unwrap().remove("binding");
                }),
                "sbx-a",
                KEY,
                Error::LeaseUnbound,
            ),
            (
                "company",
                edit(&|v| v["companyId"] = json!("company-b")),
                "sbx-a",
                KEY,
                Error::AcquiredElsewhere {
                    company: "`company-b`".into(),
                    environment: "`env-a`".into(),
                    api_url: "`https://api.example.test`".into(),
                },
            ),
            (
                "a company that is not plain",
                edit(&|v| v["companyId"] = json!(format!("b\n{KEY}"))),
                "sbx-a",
                KEY,
                Error::AcquiredElsewhere {
                    company: "(not shown)".into(),
                    environment: "`env-a`".into(),
                    api_url: "`https://api.example.test`".into(),
                },
            ),
            ("provider", edit(&|v| v["provider"] = json!("other")), "sbx-a", KEY, Error::NotThisEnvironment),
            ("not JSON", "{".into(), "sbx-a", KEY, Error::NotThisEnvironment),
        ];
        for (what, text, sandbox_id, key, expected) in cases {
            let error = LeaseMetadata::owned(&text, sandbox_id, &env(), &config(key)).unwrap_err();
            assert_eq!(error, expected, "{what}");
            assert_eq!(error.kind(), ErrorKind::NOT_THIS_ENVIRONMENT, "{what}");
            let message = error.to_string();
            assert!(!message.contains('\n') && !message.contains(KEY) && !message.contains("sbx-"), "{what}");
        }
    }

    #[test]
    fn a_company_change_that_matches_the_caller_still_fails_the_binding() {
        let (_, json) = bound();
        let mut value: Value = serde_json::from_str(&json).unwrap();
        value["companyId"] = json!("company-b");
        let env_b = EnvironmentParams { company_id: "company-b".into(), ..env() };
        let error = LeaseMetadata::owned(&value.to_string(), "sbx-a", &env_b, &config(KEY)).unwrap_err();
        assert_eq!(error, Error::LeaseNotVerified);
    }

    #[test]
    fn an_unbound_record_from_an_older_provider_parses_but_is_refused() {
        let old = json!({
            "provider": "createos", "apiUrl": "https://api.example.test", "companyId": "company-a",
            "environmentId": "env-a", "remoteCwd": REMOTE_CWD, "marker": uuid::Uuid::new_v4().to_string(),
            "shape": "s-1vcpu-1gb", "rootfs": null, "region": null, "reuseLease": false,
        });
        let error = LeaseMetadata::owned(&old.to_string(), "sbx-a", &env(), &config(KEY)).unwrap_err();
        assert_eq!(error, Error::LeaseUnbound);
    }
}
