use std::time::{Duration, Instant};

use createos_sim::{FaultKind, FaultProfile, FaultRule, FaultTrigger};
use serde_json::json;

use crate::common::*;

const CREATE: &str = "POST /v1/sandboxes";

fn shape() -> serde_json::Value {
    json!({"shape": "s-1vcpu-1gb"})
}

#[test]
fn status_fault_does_not_act_and_skips_bad_keys() {
    let _g = shared();
    let api = Api::start(fast_config());
    api.sim.add_fault(FaultRule::new(CREATE, FaultTrigger::nth(2), FaultKind::Status(503)));
    let bad = api
        .client
        .post(format!("{}/sandboxes", api.base))
        .header("X-Api-Key", "wrong")
        .json(&shape())
        .send()
        .unwrap();
    assert_eq!(bad.status().as_u16(), 401, "a bad key neither counts nor fires");
    assert_eq!(api.post("/sandboxes", shape()).0, 200);
    assert_eq!(api.post("/sandboxes", shape()).0, 503);
    assert_eq!(api.post("/sandboxes", shape()).0, 200);
    assert_eq!(api.sim.live_sandboxes().len(), 2);
    api.sim.add_fault(
        FaultRule::new("GET /v1/sandboxes/*", FaultTrigger::from_nth(1), FaultKind::Status(429)).times(2),
    );
    let r = api.req(reqwest::Method::GET, "/sandboxes/x").send().unwrap();
    assert_eq!(r.status().as_u16(), 429);
    assert!(r.headers().contains_key("retry-after"));
    assert_eq!(api.get("/sandboxes/x").0, 429);
    assert_eq!(api.get("/sandboxes/x").0, 404);
    for code in [500, 502, 404, 409, 410] {
        api.sim.clear_faults();
        api.sim.add_fault(FaultRule::new("* /v1/**", FaultTrigger::nth(1), FaultKind::Status(code)));
        assert_eq!(api.get("/sandboxes/x").0, code);
    }
}

#[test]
fn drop_after_action_leaks_a_sandbox() {
    let _g = shared();
    let api = Api::start(fast_config());
    api.sim.add_fault(FaultRule::new(CREATE, FaultTrigger::nth(1), FaultKind::DropAfterAction));
    let r = api.req(reqwest::Method::POST, "/sandboxes").json(&shape()).send();
    assert!(r.is_err(), "expected a network error, got {r:?}");
    assert_eq!(api.sim.live_sandboxes().len(), 1);
    let l = api.sim.ledger();
    assert_eq!(l.leaked().len(), 1);
    assert_eq!(l.count_status(0), 1);
}

#[test]
fn delay_malformed_and_wrong_id() {
    let _g = shared();
    let api = Api::start(fast_config());
    let id = api.create_running();
    let get = "GET /v1/sandboxes/*";
    api.sim.add_fault(FaultRule::new(
        get,
        FaultTrigger::nth(1),
        FaultKind::Delay(Duration::from_millis(300)),
    ));
    let t = Instant::now();
    assert_eq!(api.get(&format!("/sandboxes/{id}")).0, 200);
    assert!(t.elapsed() >= Duration::from_millis(300));

    api.sim.add_fault(FaultRule::new(
        "POST /v1/sandboxes/*/pause",
        FaultTrigger::nth(1),
        FaultKind::MalformedJson,
    ));
    let r = api.req(reqwest::Method::POST, &format!("/sandboxes/{id}/pause")).send().unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert!(serde_json::from_slice::<serde_json::Value>(&r.bytes().unwrap()).is_err());
    api.wait_status(&id, "paused"); // it acted

    api.sim.add_fault(FaultRule::new(get, FaultTrigger::nth(1), FaultKind::WrongId));
    let (s, v) = api.get(&format!("/sandboxes/{id}"));
    assert_eq!(s, 200);
    assert_ne!(v["data"]["id"], id.as_str());
    assert_eq!(v["data"]["status"], "paused");
}

#[test]
fn cut_stream_then_reconnect() {
    let _g = shared();
    let api = Api::start(fast_config());
    let id = api.create_running();
    let pid = api.spawn(&id, "echo hello");
    api.sim.add_fault(FaultRule::new(
        "GET /v1/sandboxes/*/processes/*/connect",
        FaultTrigger::nth(1),
        FaultKind::CutStream,
    ));
    let r = api.connect(&id, &pid, 0);
    assert_eq!(r.status().as_u16(), 200);
    assert!(r.bytes().is_err(), "the body must end with an error");
    let (frames, clean) = read_frames(api.connect(&id, &pid, 0));
    assert!(clean);
    assert_eq!(data_of(&frames, "stdout"), "hello\n");
}

#[test]
fn force_stopped_mid_pause() {
    let _g = shared();
    let api = Api::start(fast_config());
    let id = api.create_running();
    api.spawn(&id, "exec -a sim-forced-8181 sleep 600");
    assert!(wait_until(Duration::from_secs(5), || pids_with_cmdline("sim-forced-8181").len() == 1));
    api.sim.add_fault(FaultRule::new(
        "POST /v1/sandboxes/*/pause",
        FaultTrigger::nth(1),
        FaultKind::ForceStopped,
    ));
    let (s, v) = api.post(&format!("/sandboxes/{id}/pause"), json!({}));
    assert_eq!((s, v["data"]["status"].as_str()), (200, Some("pausing")));
    assert_eq!(api.get(&format!("/sandboxes/{id}")).0, 404);
    assert!(wait_until(Duration::from_secs(5), || pids_with_cmdline("sim-forced-8181").is_empty()));
    let l = api.sim.ledger();
    assert!(l.sandboxes[0].force_stopped && l.sandboxes[0].deleted);
    // the host-level API does the same
    let other = api.create_running();
    assert!(api.sim.force_stop(&other));
    assert_eq!(api.get(&format!("/sandboxes/{other}")).0, 404);
}

#[test]
fn transition_stuck_and_error() {
    let _g = shared();
    let api = Api::start(fast_config());
    let id = api.create_running();
    api.sim.add_fault(FaultRule::new(
        "POST /v1/sandboxes/*/pause",
        FaultTrigger::nth(1),
        FaultKind::TransitionStuck,
    ));
    assert_eq!(api.post(&format!("/sandboxes/{id}/pause"), json!({})).0, 200);
    // stays pausing well past the configured 20 ms
    assert!(!wait_until(Duration::from_millis(400), || api.status(&id) != "pausing"));
    assert_eq!(api.post(&format!("/sandboxes/{id}/resume"), json!({})).0, 409);
    assert_eq!(api.delete(&format!("/sandboxes/{id}")).0, 200);

    api.sim.add_fault(FaultRule::new(CREATE, FaultTrigger::nth(1), FaultKind::TransitionError));
    let (_, v) = api.post("/sandboxes", shape());
    let id = v["data"]["id"].as_str().unwrap().to_string();
    api.wait_status(&id, "error");
    assert_eq!(api.post(&format!("/sandboxes/{id}/pause"), json!({})).0, 409);
    assert_eq!(api.post(&format!("/sandboxes/{id}/resume"), json!({})).0, 200);
    api.wait_status(&id, "running");
    api.sim.add_fault(FaultRule::new(
        "POST /v1/sandboxes/*/pause",
        FaultTrigger::nth(1),
        FaultKind::TransitionError,
    ));
    assert_eq!(api.post(&format!("/sandboxes/{id}/pause"), json!({})).0, 200);
    api.wait_status(&id, "error");
}

#[test]
fn hostile_profile_is_survivable() {
    let _g = shared();
    let api = Api::start(fast_config());
    api.sim.add_faults(FaultProfile::hostile(42));
    let mut ok = 0;
    for _ in 0..60 {
        if let Ok(r) = api.req(reqwest::Method::GET, "/sandboxes/none").send() {
            if r.status().as_u16() == 404 {
                ok += 1;
            }
        }
    }
    assert!(ok > 30, "{ok}");
    assert!(api.sim.ledger().requests.iter().any(|r| r.status != 404));
}
