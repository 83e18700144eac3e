//! The lease semantics of createos-api.md, one test per behaviour, through
//! the loaded CreateOS provider against the simulator, with the simulator's
//! ledger checked after each.

use crate::support::{lease_id, Bed, COMPANY};
use createos_sim::{FaultKind, FaultRule, FaultTrigger, RateLimit, SimConfig};
use provider_abi::CreationRecorder;
use provider_abi::{ErrorKind, LeaseParams, Provider};
use provider_host::wait;
use serde_json::{json, Value};
use std::time::Duration;

const SEED_MESSAGE: &str = "CreateOS process cleanup is unconfirmed; destroy this lease before reusing it.";

fn reuse() -> Value {
    json!({"reuseLease": true})
}

/// A creation slower than the first poll: the preparation `exec` sent as
/// that poll is refused (409, the sandbox is `creating`), the state is
/// polled as usual and the preparation sent again once `running`.
#[test]
fn acquire_polls_the_state_when_its_preparation_came_too_early() {
    let bed = Bed::with(SimConfig { create_delay: Duration::from_millis(700), ..SimConfig::default() });
    let config = bed.config(json!({}));
    let lease = bed.acquire(&config);
    assert_eq!(bed.status(&lease_id(&lease)), "running");
    let ledger = bed.ledger();
    let execs: Vec<u16> =
        ledger.requests.iter().filter(|r| r.path.ends_with("/exec")).map(|r| r.status).collect();
    assert_eq!(execs, [409, 200], "refused while creating, then run once running");
    assert!(ledger.count("GET", "/v1/sandboxes/*") >= 1, "the state was polled in between");
    let marker = bed.command(
        &config,
        &lease,
        "/bin/cat",
        &["/paperclip-workspace/.paperclip-runtime/.paperclip-createos-lease"],
    );
    let metadata: Value = serde_json::from_str(&lease.metadata_json).unwrap();
    assert_eq!(bed.execute(&marker).0.unwrap().stdout, metadata["marker"].as_str().unwrap());
}

#[test]
fn acquire_creates_a_running_sandbox_with_its_marker_and_no_key_in_metadata() {
    let bed = Bed::new();
    let config = bed.config(json!({}));
    let lease = bed.acquire(&config);
    let id = lease_id(&lease);
    assert!(!lease.expired);
    assert_eq!(bed.status(&id), "running");
    let metadata: Value = serde_json::from_str(&lease.metadata_json).unwrap();
    assert_eq!(metadata["provider"], "createos");
    assert_eq!(metadata["companyId"], COMPANY);
    assert_eq!(metadata["remoteCwd"], "/paperclip-workspace");
    assert_eq!(metadata["apiUrl"], bed.sim.url());
    assert!(!lease.metadata_json.contains(bed.sim.api_key()), "metadata never holds the key");
    let ledger = bed.ledger();
    assert_eq!(ledger.count("POST", "/v1/sandboxes"), 1);
    // No read at once after the creation (its reply says `creating`): the
    // first poll at the schedule (250 ms with no history) is the workspace
    // preparation itself, which finds the sandbox (50 ms) running: no state
    // read at all.
    assert_eq!(ledger.count("GET", "/v1/sandboxes/*"), 0, "no state read");
    assert_eq!(ledger.count("POST", "/v1/sandboxes/*/exec"), 1, "mkdir -p of the workspace and the marker");
    assert_eq!(ledger.count("PUT", "/v1/sandboxes/*/files"), 0, "the marker is written by that exec");
    assert_eq!(ledger.requests.len(), 2);
    // The marker is in place, byte for byte.
    let marker = bed.command(
        &config,
        &lease,
        "/bin/cat",
        &["/paperclip-workspace/.paperclip-runtime/.paperclip-createos-lease"],
    );
    assert_eq!(bed.execute(&marker).0.unwrap().stdout, metadata["marker"].as_str().unwrap());
}

#[test]
fn acquire_refuses_a_requested_expiry_before_any_request() {
    let bed = Bed::new();
    let config = bed.config(json!({}));
    let mut params = bed.acquire_params(&config);
    params.requested_expires_at = Some("2030-01-01T00:00:00Z".into()).into();
    let error = wait(bed.provider.acquire_lease(params.clone(), CreationRecorder::discard())).unwrap_err();
    assert_eq!(error.kind, ErrorKind::INVALID_INPUT);
    assert!(bed.ledger().requests.is_empty());
}

#[test]
fn a_failed_acquire_deletes_its_sandbox() {
    let bed = Bed::new();
    bed.sim.add_fault(FaultRule::new(
        "POST /v1/sandboxes/*/exec",
        FaultTrigger::from_nth(1),
        FaultKind::Status(500),
    ));
    let error = wait(
        bed.provider.acquire_lease(bed.acquire_params(&bed.config(json!({}))), CreationRecorder::discard()),
    )
    .unwrap_err();
    assert_eq!((error.kind, error.status()), (ErrorKind::API, Some(500)));
    assert_eq!(error.operation(), Some("workspace command"));
    let ledger = bed.ledger();
    assert_eq!(ledger.sandboxes.len(), 1);
    assert!(ledger.leaked().is_empty(), "the sandbox was deleted");
}

#[test]
fn a_failed_acquire_whose_delete_fails_says_cleanup_is_unconfirmed_for_the_sandbox() {
    let bed = Bed::new();
    for route in ["POST /v1/sandboxes/*/exec", "DELETE /v1/sandboxes/*"] {
        bed.sim.add_fault(FaultRule::new(route, FaultTrigger::from_nth(1), FaultKind::Status(500)));
    }
    let error = wait(
        bed.provider.acquire_lease(bed.acquire_params(&bed.config(json!({}))), CreationRecorder::discard()),
    )
    .unwrap_err();
    let id = &bed.ledger().sandboxes[0].id;
    assert_eq!(error.kind, ErrorKind::CLEANUP_UNCONFIRMED);
    assert!(error.message.contains(&format!("cleanup is unconfirmed for sandbox {id}")), "{error}");
}

#[test]
fn a_lost_create_reply_is_creation_unconfirmed() {
    let bed = Bed::new();
    bed.sim.add_fault(FaultRule::new("POST /v1/sandboxes", FaultTrigger::nth(1), FaultKind::DropAfterAction));
    let error = wait(
        bed.provider.acquire_lease(bed.acquire_params(&bed.config(json!({}))), CreationRecorder::discard()),
    )
    .unwrap_err();
    assert_eq!(error.kind, ErrorKind::CREATION_UNCONFIRMED, "{error}");
    assert_eq!(bed.ledger().count("POST", "/v1/sandboxes"), 1, "creation is never retried");
}

#[test]
fn another_environments_lease_is_refused_without_a_request() {
    let bed = Bed::new();
    let config = bed.config(json!({}));
    let lease = bed.acquire(&config);
    let before = bed.ledger().requests.len();
    let strangers: [fn(&mut LeaseParams); 3] = [
        |params| params.env.company_id = "other-company".into(),
        |params| params.env.environment_id = "other-environment".into(),
        |params| params.metadata_json = params.metadata_json.replace("createos", "other").into(),
    ];
    for change in strangers {
        let mut params = bed.lease_params(&config, &lease);
        change(&mut params);
        let errors = [
            wait(bed.provider.resume_lease(params.clone())).map(|_| ()).unwrap_err(),
            wait(bed.provider.release_lease(params.clone())).unwrap_err(),
            wait(bed.provider.destroy_lease(params.clone())).unwrap_err(),
            bed.provider.realize_workspace(&params).map(|_| ()).unwrap_err(),
        ];
        for error in errors {
            assert_eq!(error.kind, ErrorKind::NOT_THIS_ENVIRONMENT);
            assert!(
                error.message.starts_with("CreateOS lease does not belong to this environment."),
                "{error:?}"
            );
        }
    }
    assert_eq!(bed.ledger().requests.len(), before, "no request was sent");
}

#[test]
fn release_with_reuse_pauses_and_resume_brings_the_same_sandbox_back() {
    let bed = Bed::new();
    let config = bed.config(reuse());
    let lease = bed.acquire(&config);
    let id = lease_id(&lease);
    wait(bed.provider.release_lease(bed.lease_params(&config, &lease))).unwrap();
    assert_eq!(bed.status(&id), "paused");
    let resumed = wait(bed.provider.resume_lease(bed.lease_params(&config, &lease))).unwrap();
    assert!(!resumed.expired);
    assert_eq!(lease_id(&resumed), id);
    assert_eq!(bed.status(&id), "running");
    let ledger = bed.ledger();
    assert_eq!(ledger.count("POST", "/v1/sandboxes/*/pause"), 1);
    assert_eq!(ledger.count("POST", "/v1/sandboxes/*/resume"), 1);
    assert_eq!(ledger.count("GET", "/v1/sandboxes/*/files"), 1, "the marker was read back");
}

#[test]
fn release_without_reuse_deletes_the_sandbox() {
    let bed = Bed::new();
    let config = bed.config(json!({}));
    let lease = bed.acquire(&config);
    wait(bed.provider.release_lease(bed.lease_params(&config, &lease))).unwrap();
    let ledger = bed.ledger();
    assert!(ledger.leaked().is_empty());
    assert_eq!(ledger.count("POST", "/v1/sandboxes/*/pause"), 0);
}

#[test]
fn destroy_deletes_even_a_reusable_lease_and_a_second_destroy_tolerates_404() {
    let bed = Bed::new();
    let config = bed.config(reuse());
    let lease = bed.acquire(&config);
    wait(bed.provider.destroy_lease(bed.lease_params(&config, &lease))).unwrap();
    assert!(bed.ledger().leaked().is_empty());
    wait(bed.provider.destroy_lease(bed.lease_params(&config, &lease))).unwrap();
}

#[test]
fn resume_expires_a_deleted_sandbox() {
    let bed = Bed::new();
    let config = bed.config(reuse());
    let lease = bed.acquire(&config);
    wait(bed.provider.destroy_lease(bed.lease_params(&config, &lease))).unwrap();
    let resumed = wait(bed.provider.resume_lease(bed.lease_params(&config, &lease))).unwrap();
    assert!(resumed.expired);
    assert!(resumed.provider_lease_id.is_none());
}

/// A changed configuration expires the lease; the marker cannot be changed
/// in the record (the binding refuses it, see `binding.rs`).
#[test]
fn resume_expires_on_changed_configuration_without_a_request() {
    let bed = Bed::new();
    let config = bed.config(reuse());
    let lease = bed.acquire(&config);
    let before = bed.ledger().requests.len();
    let changed = [json!({"shape": "s-2vcpu-4gb"}), json!({"rootfs": "debian"}), json!({"region": "eu"})];
    for change in changed {
        let mut other = config.clone();
        for (key, value) in change.as_object().unwrap() {
            other[key] = value.clone();
        }
        let mut params = bed.lease_params(&config, &lease);
        params.env.config_json = other.to_string().into();
        assert!(wait(bed.provider.resume_lease(params.clone())).unwrap().expired, "{other}");
    }
    assert_eq!(bed.ledger().requests.len(), before);
    assert_eq!(bed.ledger().leaked().len(), 1, "expiry deletes nothing");
}

/// Acquires a reusable lease, runs `script` in it (it must succeed), and
/// asserts that resume then expires the lease.
fn resume_expires_after(script: &str) -> Bed {
    let bed = Bed::new();
    let config = bed.config(reuse());
    let lease = bed.acquire(&config);
    let (result, _) = bed.execute(&bed.command(&config, &lease, "/bin/sh", &["-c", script]));
    assert_eq!(result.unwrap().exit_code.into_option(), Some(0));
    assert!(wait(bed.provider.resume_lease(bed.lease_params(&config, &lease))).unwrap().expired);
    bed
}

/// The sandbox's marker file was overwritten (the sandbox is not the one the
/// lease prepared any more): resume expires the lease.
#[test]
fn resume_expires_when_the_marker_does_not_read_back() {
    let bed = resume_expires_after(&format!("printf 00000000-0000-4000-8000-000000000000 > {MARKER_PATH}"));
    assert_eq!(bed.ledger().count("GET", "/v1/sandboxes/*/files"), 1);
}

/// A marker file longer than the lease's marker (its marker with more
/// after it) is not the lease's: resume expires it.
#[test]
fn resume_expires_when_the_marker_reads_back_longer() {
    resume_expires_after(&format!("printf x >> {MARKER_PATH}"));
}

const MARKER_PATH: &str = "/paperclip-workspace/.paperclip-runtime/.paperclip-createos-lease";

#[test]
fn resume_reports_transient_failures_and_deletes_nothing() {
    let bed = Bed::new();
    let config = bed.config(reuse());
    let lease = bed.acquire(&config);
    wait(bed.provider.release_lease(bed.lease_params(&config, &lease))).unwrap();
    bed.sim.add_fault(FaultRule::new(
        "GET /v1/sandboxes/*",
        FaultTrigger::from_nth(1),
        FaultKind::Status(503),
    ));
    let error = wait(bed.provider.resume_lease(bed.lease_params(&config, &lease))).unwrap_err();
    assert_eq!((error.kind, error.status()), (ErrorKind::API, Some(503)));
    let ledger = bed.ledger();
    assert_eq!(ledger.count("DELETE", "/v1/sandboxes/*"), 0);
    assert_eq!(ledger.leaked().len(), 1);
}

#[test]
fn a_second_concurrent_release_is_refused() {
    let bed = Bed::new();
    let config = bed.config(reuse());
    let lease = bed.acquire(&config);
    bed.sim.add_fault(FaultRule::new(
        "POST /v1/sandboxes/*/pause",
        FaultTrigger::nth(1),
        FaultKind::Delay(Duration::from_millis(1500)),
    ));
    let reads_before = bed.ledger().count("GET", "/v1/sandboxes/*");
    std::thread::scope(|scope| {
        let first = scope.spawn(|| wait(bed.provider.release_lease(bed.lease_params(&config, &lease))));
        // The first release has read the state and is now inside its pause.
        bed.wait_for_ledger("the first release's state read", |ledger| {
            ledger.count("GET", "/v1/sandboxes/*") > reads_before
        });
        let error = wait(bed.provider.release_lease(bed.lease_params(&config, &lease))).unwrap_err();
        assert_eq!(error.kind, ErrorKind::CLEANUP_IN_PROGRESS);
        assert_eq!(error.message, "CreateOS lease cleanup is already in progress.");
        first.join().unwrap().expect("the first release pauses");
    });
    assert_eq!(bed.status(&lease_id(&lease)), "paused");
}

/// A pause whose outcome cannot be confirmed (the sandbox vanished
/// mid-pause, the transition ended in `error`, or never finished) poisons
/// the lease: it can only be destroyed, which clears the flag.
#[test]
fn an_unconfirmed_pause_poisons_the_lease_until_destroy() {
    let faults = [FaultKind::ForceStopped, FaultKind::TransitionError, FaultKind::TransitionStuck];
    for fault in faults {
        let bed = Bed::new();
        let config = bed.config(json!({"reuseLease": true, "timeoutMs": 1_500}));
        let lease = bed.acquire(&config);
        let params = bed.lease_params(&config, &lease);
        bed.sim.add_fault(FaultRule::new("POST /v1/sandboxes/*/pause", FaultTrigger::nth(1), fault));
        let error = wait(bed.provider.release_lease(params.clone())).unwrap_err();
        assert_eq!(error.kind, ErrorKind::CLEANUP_UNCONFIRMED, "{fault:?}: {error}");
        assert!(wait(bed.provider.inspect_lease(params.clone())).unwrap().unconfirmed, "{fault:?}");
        // The release rule: a reuse release of an unconfirmed lease fails, pausing nothing.
        let pauses = bed.ledger().count("POST", "/v1/sandboxes/*/pause");
        let error = wait(bed.provider.release_lease(params.clone())).unwrap_err();
        assert_eq!((error.kind, error.message.as_str()), (ErrorKind::CLEANUP_UNCONFIRMED, SEED_MESSAGE));
        let error = wait(bed.provider.resume_lease(params.clone())).unwrap_err();
        assert_eq!((error.kind, error.message.as_str()), (ErrorKind::CLEANUP_UNCONFIRMED, SEED_MESSAGE));
        assert_eq!(bed.ledger().count("POST", "/v1/sandboxes/*/pause"), pauses, "{fault:?}: nothing paused");
        // Destroy deletes and clears the flag.
        wait(bed.provider.destroy_lease(params.clone())).unwrap();
        assert!(bed.ledger().leaked().is_empty(), "{fault:?}");
        assert!(!wait(bed.provider.inspect_lease(params.clone())).unwrap().unconfirmed, "{fault:?}");
    }
}

#[test]
fn probe_runs_a_command_and_always_deletes() {
    let bed = Bed::new();
    let config = bed.config(json!({}));
    let report = wait(bed.provider.probe(bed.env(&config), CreationRecorder::discard())).unwrap();
    assert!(report.ok, "{report:?}");
    let ledger = bed.ledger();
    assert_eq!(ledger.sandboxes.len(), 1);
    assert!(ledger.leaked().is_empty());
}

#[test]
fn probe_reports_a_failed_delete() {
    let bed = Bed::new();
    bed.sim.add_fault(FaultRule::new(
        "DELETE /v1/sandboxes/*",
        FaultTrigger::from_nth(1),
        FaultKind::Status(500),
    ));
    let error =
        wait(bed.provider.probe(bed.env(&bed.config(json!({}))), CreationRecorder::discard())).unwrap_err();
    assert_eq!(error.kind, ErrorKind::CLEANUP_UNCONFIRMED, "{error}");
}

#[test]
fn realize_names_the_workspace_without_a_request() {
    let bed = Bed::new();
    let config = bed.config(json!({}));
    let lease = bed.acquire(&config);
    let before = bed.ledger().requests.len();
    let workspace = bed.provider.realize_workspace(&bed.lease_params(&config, &lease)).unwrap();
    assert_eq!(workspace.cwd, "/paperclip-workspace");
    assert_eq!(bed.ledger().requests.len(), before);
}

#[test]
fn forty_leases_at_once_stay_within_the_rate_limit() {
    let limit = RateLimit::sliding_window(3_000, Duration::from_secs(60));
    let bed = Bed::with(SimConfig { rate_limit: Some(limit), ..SimConfig::default() });
    // The rate limit is tested, not the deadline.
    let config =
        bed.config(json!({"requestsPerMinute": 3_000, "timeoutMs": e2e::machine::UNHURRIED_TIMEOUT_MS}));
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..40)
            .map(|_| {
                scope.spawn(|| {
                    let lease = bed.acquire(&config);
                    wait(bed.provider.release_lease(bed.lease_params(&config, &lease))).unwrap();
                })
            })
            .collect();
        workers.into_iter().for_each(|worker| worker.join().unwrap());
    });
    let ledger = bed.ledger();
    assert_eq!(ledger.count_status(429), 0, "no request was refused");
    assert_eq!(ledger.sandboxes.len(), 40);
    assert!(ledger.leaked().is_empty());
}

/// The reference's overload, ten times faster (`e2e::overload`): every
/// lifecycle that starts completes, none times out, no request meets a 429
/// and nothing leaks. How much of the budget the completed work uses is a
/// figure of the machine's speed as much as of the code's: the
/// `lease_economics` benchmark reports it (docs/benchmarks.md).
#[test]
fn twenty_loops_under_overload_finish_their_work() {
    let _machine = e2e::machine::scaled_deadlines();
    let run = e2e::overload::run();
    eprintln!("{}", run.summary());
    assert!(run.failures.is_empty(), "{:?}", run.failures);
    assert_eq!(run.ledger.count_status(429), 0);
    assert!(run.ledger.leaked().is_empty());
    assert!(run.completed > 0, "{}", run.summary());
}
