//! Lease records are tamper-evident: two companies on
//! one CreateOS account, and records altered the ways a lease holder could.
//! Every hook that takes a lease refuses an altered record in one line
//! before any request, and company B's sandbox stays untouched and usable.

use crate::support::{lease_id, Bed, COMPANY};
use provider_abi::CreationRecorder;
use provider_abi::{ErrorKind, ExecuteParams, Lease, LeaseParams, Provider};
use provider_host::wait;
use serde_json::{json, Value};

const COMPANY_B: &str = "company-b";
const NOT_VERIFIED: &str = "CreateOS lease record does not verify under this API key (altered, or acquired with another key); destroy it with the configuration it was acquired with.";
const UNBOUND: &str = "CreateOS lease record has no binding (acquired by an older provider); destroy it with the provider version and configuration it was acquired with.";
const NOT_OURS: &str = "CreateOS lease does not belong to this environment.";

/// Two tenants on one account: company A's and company B's leases.
struct Tenants {
    bed: Bed,
    config: Value,
    a: Lease,
    b: Lease,
}

impl Tenants {
    fn new() -> Self {
        let bed = Bed::new();
        let config = bed.config(json!({"reuseLease": true}));
        let a = bed.acquire(&config);
        let mut params = bed.acquire_params(&config);
        params.env.company_id = COMPANY_B.into();
        let b = wait(bed.provider.acquire_lease(params.clone(), CreationRecorder::discard()))
            .expect("acquire company B's lease");
        Self { bed, config, a, b }
    }

    /// Company A's parameters (A's environment and configuration) for `lease`.
    fn as_a(&self, lease: &Lease) -> LeaseParams {
        self.bed.lease_params(&self.config, lease)
    }

    /// Company B's parameters for `lease`.
    fn as_b(&self, lease: &Lease) -> LeaseParams {
        let mut params = self.bed.lease_params(&self.config, lease);
        params.env.company_id = COMPANY_B.into();
        params
    }

    /// Runs `echo` through `params`, returning its output.
    fn echo(&self, params: &LeaseParams, word: &str) -> String {
        let command = echo(params, word);
        let (result, _) = self.bed.execute(&command);
        let result = result.expect("the command runs");
        assert_eq!(result.exit_code.into_option(), Some(0));
        result.stdout.to_string()
    }
}

fn echo(params: &LeaseParams, word: &str) -> ExecuteParams {
    ExecuteParams {
        lease: params.clone(),
        command: "/bin/echo".into(),
        args: vec![word.into()].into(),
        ..Default::default()
    }
}

/// `lease`'s metadata with `change` applied.
fn edited(lease: &Lease, change: impl Fn(&mut Value)) -> Lease {
    let mut metadata: Value = serde_json::from_str(&lease.metadata_json).unwrap();
    change(&mut metadata);
    Lease { metadata_json: metadata.to_string().into(), ..lease.clone() }
}

/// Every hook that takes a lease, called with `params`: each must fail.
fn every_hook(bed: &Bed, params: &LeaseParams) -> Vec<(&'static str, provider_abi::ProviderError)> {
    let provider = &bed.provider;
    vec![
        ("execute", bed.execute(&echo(params, "x")).0.map(|_| ()).unwrap_err()),
        ("resume", wait(provider.resume_lease(params.clone())).map(|_| ()).unwrap_err()),
        ("release", wait(provider.release_lease(params.clone())).unwrap_err()),
        ("destroy", wait(provider.destroy_lease(params.clone())).unwrap_err()),
        ("realize", provider.realize_workspace(params).map(|_| ()).unwrap_err()),
        ("inspect", wait(provider.inspect_lease(params.clone())).map(|_| ()).unwrap_err()),
    ]
}

#[test]
fn altered_lease_records_are_refused_by_every_hook_before_any_request() {
    let tenants = Tenants::new();
    let (a, b) = (&tenants.a, &tenants.b);
    let b_id = lease_id(b);
    let b_marker = serde_json::from_str::<Value>(&b.metadata_json).unwrap()["marker"].clone();
    let with_b_id =
        |lease: &Lease| Lease { provider_lease_id: Some(b_id.as_str().into()).into(), ..lease.clone() };
    let other_key = {
        let mut config = tenants.config.clone();
        config["apiKey"] = json!("another-account-key");
        config
    };
    type Case = (&'static str, LeaseParams, &'static str);
    let cases: Vec<Case> = vec![
        // The reproduction: A's record, B's sandbox id, A's configuration.
        ("A's record with B's sandbox id", tenants.as_a(&with_b_id(a)), NOT_VERIFIED),
        (
            "A's record with B's sandbox id and marker",
            tenants.as_a(&with_b_id(&edited(a, |m| m["marker"] = b_marker.clone()))),
            NOT_VERIFIED,
        ),
        (
            "B's record relabelled as company A's",
            tenants.as_a(&edited(b, |m| m["companyId"] = json!(COMPANY))),
            NOT_VERIFIED,
        ),
        (
            "B's record with another marker",
            tenants.as_b(&edited(b, |m| m["marker"] = json!("00000000-0000-4000-8000-000000000000"))),
            NOT_VERIFIED,
        ),
        (
            "B's record with an added field",
            tenants.as_b(&edited(b, |m| m["sandboxId"] = json!(b_id))),
            NOT_VERIFIED,
        ),
        (
            "B's record with reuseLease flipped",
            tenants.as_b(&edited(b, |m| m["reuseLease"] = json!(false))),
            NOT_VERIFIED,
        ),
        (
            "B's record with another shape",
            tenants.as_b(&edited(b, |m| m["shape"] = json!("s-2vcpu-4gb"))),
            NOT_VERIFIED,
        ),
        (
            "B's record with a forged binding",
            tenants.as_b(&edited(b, |m| m["binding"] = json!("A".repeat(43)))),
            NOT_VERIFIED,
        ),
        (
            "B's record under another account's key",
            {
                let mut params = tenants.bed.lease_params(&other_key, b);
                params.env.company_id = COMPANY_B.into();
                params
            },
            NOT_VERIFIED,
        ),
        (
            "B's record stripped of its binding",
            tenants.as_b(&edited(b, |m| {
                m.as_object_mut().unwrap().remove("binding");
            })),
            UNBOUND,
        ),
        ("B's genuine record in A's environment", tenants.as_a(b), NOT_OURS),
    ];
    // A genuine record of another environment says whose it is and what to use.
    let elsewhere = every_hook(&tenants.bed, &tenants.as_a(b));
    for (hook, error) in &elsewhere {
        let says = format!("It was acquired for company `{COMPANY_B}`, environment");
        assert!(error.message.contains(&says) && error.message.contains("companyId"), "{hook}: {error}");
    }
    for (case, params, message) in &cases {
        let before = tenants.bed.ledger().requests.len();
        for (hook, error) in every_hook(&tenants.bed, params) {
            assert_eq!(error.kind, ErrorKind::NOT_THIS_ENVIRONMENT, "{case}: {hook}: {error}");
            assert!(error.message.starts_with(*message), "{case}: {hook}: {error}");
            assert!(!error.message.contains(tenants.bed.sim.api_key()), "{case}: {hook}");
            assert!(!error.message.contains(&b_id), "{case}: {hook}");
        }
        assert_eq!(tenants.bed.ledger().requests.len(), before, "{case}: no request was sent");
    }
    // B's sandbox was never touched: still running, still B's, still usable.
    assert_eq!(tenants.bed.status(&b_id), "running");
    let b_params = tenants.as_b(b);
    assert_eq!(tenants.echo(&b_params, "b-still-here").trim(), "b-still-here");
    assert!(wait(tenants.bed.provider.resume_lease(b_params.clone())).is_ok_and(|lease| !lease.expired));
    assert_eq!(tenants.echo(&tenants.as_a(a), "a-still-here").trim(), "a-still-here");
}

#[test]
fn acquire_and_resume_hand_out_bound_records_that_survive_reserialisation() {
    let tenants = Tenants::new();
    let (bed, config, lease) = (&tenants.bed, &tenants.config, &tenants.a);
    let metadata: Value = serde_json::from_str(&lease.metadata_json).unwrap();
    let binding = metadata["binding"].as_str().expect("acquire binds the record");
    assert_eq!(binding.len(), 43, "an HMAC-SHA256 tag in base64url");
    assert!(!lease.metadata_json.contains(bed.sim.api_key()));
    // A host that stores the metadata as a JSON value re-serialises it (key
    // order, whitespace): the binding covers the fields, not the text.
    let reserialised =
        Lease { metadata_json: serde_json::to_string_pretty(&metadata).unwrap().into(), ..lease.clone() };
    let params = bed.lease_params(config, &reserialised);
    wait(bed.provider.release_lease(params.clone())).expect("a pause");
    assert_eq!(bed.status(&lease_id(lease)), "paused");
    let resumed = wait(bed.provider.resume_lease(params.clone())).expect("a resume");
    assert!(!resumed.expired);
    let resumed_metadata: Value = serde_json::from_str(&resumed.metadata_json).unwrap();
    assert_eq!(resumed_metadata, metadata, "resume hands back the same bound record");
    assert_eq!(tenants.echo(&bed.lease_params(config, &resumed), "resumed").trim(), "resumed");
}

/// Key rotation: a lease acquired under the old key is refused under the
/// new one with a message naming the way out, which works.
#[test]
fn a_lease_of_a_rotated_key_is_refused_and_destroyed_with_its_own_configuration() {
    let tenants = Tenants::new();
    let (bed, lease) = (&tenants.bed, &tenants.a);
    let mut rotated = tenants.config.clone();
    rotated["apiKey"] = json!("the-new-key");
    let before = bed.ledger().requests.len();
    let error = wait(bed.provider.destroy_lease(bed.lease_params(&rotated, lease))).unwrap_err();
    assert_eq!((error.kind, error.message.as_str()), (ErrorKind::NOT_THIS_ENVIRONMENT, NOT_VERIFIED));
    assert_eq!(bed.ledger().requests.len(), before);
    wait(bed.provider.destroy_lease(tenants.as_a(lease)))
        .expect("destroyed with the configuration it was acquired with");
    assert_eq!(bed.status(&lease_id(lease)), "destroyed");
    assert_eq!(tenants.echo(&tenants.as_b(&tenants.b), "b").trim(), "b");
}

/// A record from before bindings existed (no `binding` field) is refused by
/// every hook, destroy included: it cannot be told from a record whose
/// binding was removed to point it at another sandbox.
#[test]
fn an_unbound_record_from_an_older_provider_is_refused_even_for_destroy() {
    let tenants = Tenants::new();
    let bed = &tenants.bed;
    let unbound = edited(&tenants.a, |m| {
        m.as_object_mut().unwrap().remove("binding");
    });
    let before = bed.ledger().requests.len();
    for (hook, error) in every_hook(bed, &tenants.as_a(&unbound)) {
        assert_eq!(
            (error.kind, error.message.as_str()),
            (ErrorKind::NOT_THIS_ENVIRONMENT, UNBOUND),
            "{hook}"
        );
    }
    assert_eq!(bed.ledger().requests.len(), before);
    assert_eq!(bed.status(&lease_id(&tenants.a)), "running");
}
