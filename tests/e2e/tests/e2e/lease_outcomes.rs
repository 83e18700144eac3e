//! What the lease hooks report about the remote side: a creation the API
//! refused, one whose outcome is unknown and one never sent; a cleanup delete
//! repeated while its failure may be passing, then reported; a marker read,
//! a state read and a probe command that failed. Through the loaded CreateOS
//! provider against the simulator.

use crate::support::Bed;
use createos_sim::{FaultKind, FaultRule, FaultTrigger, RateLimit};
use provider_abi::CreationRecorder;
use provider_abi::{ErrorKind, Lease, LeaseParams, Provider, ProviderError};
use provider_host::wait;
use serde_json::{json, Value};
use std::time::Duration;

const MARKER_PATH: &str = "/paperclip-workspace/.paperclip-runtime/.paperclip-createos-lease";
const CREATE: &str = "POST /v1/sandboxes";
const DELETE: &str = "DELETE /v1/sandboxes/*";

/// A bed holding one lease, acquired under the config with `extra` keys.
struct Leased {
    bed: Bed,
    config: Value,
    lease: Lease,
    params: LeaseParams,
}

fn leased(extra: Value) -> Leased {
    let bed = Bed::new();
    let config = bed.config(extra);
    let lease = bed.acquire(&config);
    let params = bed.lease_params(&config, &lease);
    Leased { bed, config, lease, params }
}

/// Makes `route` fail with `kind` on the calls `trigger` picks.
fn fault(bed: &Bed, route: &str, trigger: FaultTrigger, kind: FaultKind) {
    bed.sim.add_fault(FaultRule::new(route, trigger, kind));
}

/// Asserts that `error` is of `kind` and carries HTTP `status`.
fn assert_status(error: &ProviderError, kind: ErrorKind, status: u16) {
    assert_eq!((error.kind, error.status()), (kind, Some(status)), "{error}");
}

/// The error of an acquisition whose creation the API answers with `status`.
fn acquire_answered(status: u16) -> ProviderError {
    let bed = Bed::new();
    fault(&bed, CREATE, FaultTrigger::nth(1), FaultKind::Status(status));
    wait(bed.provider.acquire_lease(bed.acquire_params(&bed.config(json!({}))), CreationRecorder::discard()))
        .unwrap_err()
}

/// A creation the API refused (4xx) created nothing: the refusal itself is
/// reported, never "creation unconfirmed" (which asks the host to hunt for
/// a sandbox nobody can name).
#[test]
fn a_refused_creation_is_reported_as_the_refusal() {
    let bed = Bed::new();
    let mut config = bed.config(json!({}));
    config["apiKey"] = "not-the-key".into();
    let error = wait(bed.provider.acquire_lease(bed.acquire_params(&config), CreationRecorder::discard()))
        .unwrap_err();
    assert_status(&error, ErrorKind::UNAUTHORIZED, 401);
    for status in [400, 422] {
        assert_status(&acquire_answered(status), ErrorKind::API, status);
    }
}

/// A server error in reply to the creation says nothing of whether the
/// sandbox exists: creation unconfirmed.
#[test]
fn a_creation_answered_with_a_server_error_is_unconfirmed() {
    for status in [500, 503] {
        let error = acquire_answered(status);
        assert_eq!(error.kind, ErrorKind::CREATION_UNCONFIRMED, "{status}: {error}");
    }
}

/// A creation whose deadline passed while it waited for the request budget
/// (a 429 paused every request to the account for a minute) was never
/// sent: it is reported as such, not as "creation unconfirmed".
#[test]
fn a_creation_never_sent_is_not_unconfirmed() {
    let bed = Bed::new();
    let config = bed.config(json!({"timeoutMs": 1_000}));
    // One request a minute: the first acquisition's creation is accepted,
    // its workspace preparation answered 429 with a Retry-After of about a
    // minute, which the provider's pacer honours from then on.
    bed.sim.set_rate_limit(Some(RateLimit::sliding_window(1, Duration::from_secs(60))));
    wait(bed.provider.acquire_lease(bed.acquire_params(&config), CreationRecorder::discard())).unwrap_err();
    assert_eq!(bed.ledger().count_status(429), 1);
    let error = wait(bed.provider.acquire_lease(bed.acquire_params(&config), CreationRecorder::discard()))
        .unwrap_err();
    assert_eq!(error.kind, ErrorKind::TIMEOUT, "{error}");
    assert!(error.message.contains("was not sent"), "{error}");
    assert_eq!(bed.ledger().count("POST", "/v1/sandboxes"), 1, "the second creation was never sent");
}

/// A cleanup delete that succeeds is sent once.
#[test]
fn a_release_that_deletes_sends_one_delete() {
    let Leased { bed, params, .. } = leased(json!({}));
    wait(bed.provider.release_lease(params.clone())).unwrap();
    let ledger = bed.ledger();
    assert_eq!(ledger.count("DELETE", "/v1/sandboxes/*"), 1);
    assert!(ledger.leaked().is_empty());
}

/// A delete failing with a transient error is sent again after 250 ms, then
/// 500 ms, three times in all; then its failure is reported.
#[test]
fn a_failing_delete_is_sent_three_times_with_growing_pauses_then_reported() {
    let Leased { bed, params, .. } = leased(json!({}));
    fault(&bed, DELETE, FaultTrigger::from_nth(1), FaultKind::Status(503));
    assert_status(&wait(bed.provider.release_lease(params.clone())).unwrap_err(), ErrorKind::API, 503);
    let ledger = bed.ledger();
    let deletes: Vec<_> =
        ledger.requests.iter().filter(|r| r.method == "DELETE").map(|r| r.received_at).collect();
    assert_eq!(deletes.len(), 3, "three attempts");
    assert!(deletes[1] - deletes[0] >= Duration::from_millis(250), "{:?}", deletes[1] - deletes[0]);
    assert!(deletes[2] - deletes[1] >= Duration::from_millis(500), "{:?}", deletes[2] - deletes[1]);
    assert_eq!(ledger.leaked().len(), 1);
}

/// A delete whose first two attempts fail transiently is confirmed by the third.
#[test]
fn a_delete_that_fails_twice_is_confirmed_by_its_third_attempt() {
    let Leased { bed, params, .. } = leased(json!({}));
    bed.sim.add_fault(FaultRule::new(DELETE, FaultTrigger::from_nth(1), FaultKind::Status(503)).times(2));
    wait(bed.provider.release_lease(params.clone())).unwrap();
    let ledger = bed.ledger();
    assert_eq!(ledger.count("DELETE", "/v1/sandboxes/*"), 3);
    assert!(ledger.leaked().is_empty());
}

/// A delete is not sent again when its pause would reach past the
/// deadline: the failure the API reported is the one reported, not a
/// timeout of a request that could not be sent in time.
#[test]
fn a_delete_is_not_repeated_past_its_deadline() {
    // Only the release runs under the short deadline: an acquire under it
    // measured the machine's speed, not the rule.
    let Leased { bed, lease, .. } = leased(json!({}));
    let params = bed.lease_params(&bed.config(json!({"timeoutMs": 700})), &lease);
    fault(&bed, DELETE, FaultTrigger::from_nth(1), FaultKind::Status(503));
    // The second attempt's reply comes too late to beat the deadline (as on
    // a loaded machine): the 503 is reported, not that timeout.
    fault(&bed, DELETE, FaultTrigger::nth(2), FaultKind::Delay(Duration::from_secs(1)));
    assert_status(&wait(bed.provider.release_lease(params.clone())).unwrap_err(), ErrorKind::API, 503);
    // 250 ms after the first attempt, the second; 500 ms more would pass the
    // 700 ms deadline.
    assert!(bed.ledger().count("DELETE", "/v1/sandboxes/*") <= 2);
}

/// A malformed reply to a delete leaves its outcome unknown, so the delete
/// is sent again (and a sandbox already gone counts as deleted); a delete
/// the API refuses (403) is not repeated.
#[test]
fn a_delete_with_an_unreadable_reply_is_repeated_and_a_refused_one_is_not() {
    let Leased { bed, params, .. } = leased(json!({}));
    fault(&bed, DELETE, FaultTrigger::nth(1), FaultKind::MalformedJson);
    wait(bed.provider.release_lease(params.clone())).unwrap();
    let ledger = bed.ledger();
    assert_eq!(ledger.count("DELETE", "/v1/sandboxes/*"), 2);
    assert!(ledger.leaked().is_empty());

    let Leased { bed, params, .. } = leased(json!({}));
    fault(&bed, DELETE, FaultTrigger::from_nth(1), FaultKind::Status(403));
    assert_status(
        &wait(bed.provider.release_lease(params.clone())).unwrap_err(),
        ErrorKind::UNAUTHORIZED,
        403,
    );
    assert_eq!(bed.ledger().count("DELETE", "/v1/sandboxes/*"), 1);
}

/// Resume reads the marker back: a marker that is gone expires the lease
/// (the sandbox is not the one the lease prepared); a failure to read it
/// is reported and expires nothing.
#[test]
fn resume_expires_a_lease_whose_marker_is_gone_and_reports_a_failed_read() {
    let Leased { bed, config, lease, params } = leased(json!({"reuseLease": true}));
    fault(&bed, "GET /v1/sandboxes/*/files", FaultTrigger::nth(1), FaultKind::Status(503));
    let error = wait(bed.provider.resume_lease(params.clone())).map(|_| ()).unwrap_err();
    assert_status(&error, ErrorKind::API, 503);
    let (removed, _) = bed.execute(&bed.command(&config, &lease, "/bin/rm", &[MARKER_PATH]));
    assert_eq!(removed.unwrap().exit_code.into_option(), Some(0));
    assert!(wait(bed.provider.resume_lease(params.clone())).unwrap().expired);
    assert_eq!(bed.ledger().count("GET", "/v1/sandboxes/*/files"), 2);
}

/// A lease handed over by another version of the provider as unconfirmed
/// (`import_unconfirmed`) can only be destroyed from then on.
#[test]
fn an_imported_unconfirmed_lease_can_only_be_destroyed() {
    let Leased { bed, params, .. } = leased(json!({"reuseLease": true}));
    assert!(!wait(bed.provider.inspect_lease(params.clone())).unwrap().unconfirmed);
    bed.provider.import_unconfirmed(&params).unwrap();
    bed.provider.import_unconfirmed(&params).unwrap();
    assert!(wait(bed.provider.inspect_lease(params.clone())).unwrap().unconfirmed);
    let errors = [
        wait(bed.provider.release_lease(params.clone())).unwrap_err(),
        wait(bed.provider.resume_lease(params.clone())).map(|_| ()).unwrap_err(),
    ];
    for error in errors {
        assert_eq!(error.kind, ErrorKind::CLEANUP_UNCONFIRMED, "{error}");
    }
    assert_eq!(bed.ledger().count("POST", "/v1/sandboxes/*/pause"), 0);
    wait(bed.provider.destroy_lease(params.clone())).unwrap();
    assert!(bed.ledger().leaked().is_empty());
    assert!(!wait(bed.provider.inspect_lease(params.clone())).unwrap().unconfirmed);
}

/// `inspect_lease` says a sandbox is gone only when the API says so (404):
/// a failed read is reported.
#[test]
fn inspect_reports_a_failed_read_and_only_a_404_as_gone() {
    let Leased { bed, params, .. } = leased(json!({}));
    fault(&bed, "GET /v1/sandboxes/*", FaultTrigger::nth(1), FaultKind::Status(503));
    assert_status(
        &wait(bed.provider.inspect_lease(params.clone())).map(|_| ()).unwrap_err(),
        ErrorKind::API,
        503,
    );
    wait(bed.provider.destroy_lease(params.clone())).unwrap();
    let status = wait(bed.provider.inspect_lease(params.clone())).unwrap();
    assert!(!status.exists && !status.unconfirmed, "{status:?}");
}

/// The probe is ok only when its command both exits 0 and prints the
/// expected line: a command that printed it but failed is not ok.
#[test]
fn a_probe_whose_command_fails_is_not_ok_whatever_it_printed() {
    let bed = Bed::new();
    // The second command is the probe's (the first prepares the workspace).
    fault(&bed, "POST /v1/sandboxes/*/exec", FaultTrigger::nth(2), FaultKind::ExitCode(1));
    let report =
        wait(bed.provider.probe(bed.env(&bed.config(json!({}))), CreationRecorder::discard())).unwrap();
    assert!(!report.ok, "{report:?}");
    assert_eq!(report.message, "CreateOS probe command did not print the expected output.");
    let metadata: Value = serde_json::from_str(&report.metadata_json).unwrap();
    assert_eq!(metadata["exitCode"], 1, "{metadata}");
    assert!(bed.ledger().leaked().is_empty());
}
