use std::time::Duration;

use serde_json::json;

use crate::common::*;

#[test]
fn transitions_and_conflicts() {
    let _g = shared();
    let mut cfg = fast_config();
    cfg.create_delay = Duration::from_millis(150);
    cfg.pause_delay = Duration::from_millis(150);
    cfg.resume_delay = Duration::from_millis(150);
    let api = Api::start(cfg);
    let (s, v) = api.post("/sandboxes", json!({"shape": "s-2vcpu-4gb", "region": "fra"}));
    assert_eq!(s, 200);
    assert_eq!(v["status"], "success");
    let id = v["data"]["id"].as_str().unwrap().to_string();
    assert_eq!(api.status(&id), "creating");
    // pause while creating: a transition is under way
    assert_eq!(api.post(&format!("/sandboxes/{id}/pause"), json!({})).0, 409);
    api.wait_status(&id, "running");
    let (_, g) = api.get(&format!("/sandboxes/{id}"));
    assert_eq!(g["data"]["id"], id.as_str());
    // resume from running: wrong state
    assert_eq!(api.post(&format!("/sandboxes/{id}/resume"), json!({})).0, 409);

    let (s, v) = api.post(&format!("/sandboxes/{id}/pause"), json!({}));
    assert_eq!((s, v["data"]["status"].as_str()), (200, Some("pausing")));
    assert_eq!(api.status(&id), "pausing");
    assert_eq!(api.post(&format!("/sandboxes/{id}/pause"), json!({})).0, 409);
    assert_eq!(api.post(&format!("/sandboxes/{id}/resume"), json!({})).0, 409);
    api.wait_status(&id, "paused");
    assert_eq!(api.post(&format!("/sandboxes/{id}/pause"), json!({})).0, 409);
    // exec needs a running sandbox
    let (s, _) = api.post(&format!("/sandboxes/{id}/exec"), json!({"cmd": "/bin/true", "args": []}));
    assert_eq!(s, 409);

    let (s, v) = api.post(&format!("/sandboxes/{id}/resume"), json!({}));
    assert_eq!((s, v["data"]["status"].as_str()), (200, Some("resuming")));
    assert_eq!(api.post(&format!("/sandboxes/{id}/resume"), json!({})).0, 409);
    api.wait_status(&id, "running");

    let (s, v) = api.delete(&format!("/sandboxes/{id}"));
    assert_eq!((s, v["data"]["id"].as_str()), (200, Some(id.as_str())));
    assert_eq!(api.get(&format!("/sandboxes/{id}")).0, 404);
    assert_eq!(api.delete(&format!("/sandboxes/{id}")).0, 404);
    assert_eq!(api.post(&format!("/sandboxes/{id}/resume"), json!({})).0, 404);
    let l = api.sim.ledger();
    assert!(l.leaked().is_empty());
    assert_eq!(l.sandboxes[0].shape, "s-2vcpu-4gb");
    assert_eq!(l.sandboxes[0].status, "destroyed");
    assert_eq!(l.count("POST", "/v1/sandboxes/*/pause"), 4);
    let phases: Vec<&str> = l.transitions.iter().map(|t| t.to.as_str()).collect();
    assert_eq!(phases, ["running", "paused", "running"], "create, pause, resume");
    for t in &l.transitions {
        assert_eq!(t.sandbox_id, id);
        assert!(t.completed_at - t.began_at >= Duration::from_millis(150), "{t:?}");
    }
    assert!(l.requests.windows(2).all(|w| w[0].received_at <= w[1].received_at), "sequential requests");
    assert!(api.sim.live_sandboxes().is_empty());
}

#[test]
fn auth_validation_and_envelopes() {
    let _g = shared();
    let api = Api::start(fast_config());
    let url = format!("{}/sandboxes", api.base);
    let r = api.client.post(&url).json(&json!({"shape": "s-1vcpu-1gb"})).send().unwrap();
    assert_eq!(r.status().as_u16(), 401);
    let r = api
        .client
        .post(&url)
        .header("X-Api-Key", "sim-dev-key-wrong")
        .json(&json!({"shape": "s-1vcpu-1gb"}))
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 401);
    let body = r.text().unwrap();
    assert!(body.contains("\"status\":\"error\""), "{body}");
    assert!(!body.contains("sim-dev-key"), "the key must not be echoed");
    assert!(api.sim.live_sandboxes().is_empty());

    assert_eq!(api.post("/sandboxes", json!({"shape": "s-3vcpu-1gb"})).0, 400);
    assert_eq!(api.post("/sandboxes", json!({})).0, 400);
    assert_eq!(api.get("/sandboxes/bad.id").0, 400);
    assert_eq!(api.get(&format!("/sandboxes/{}", "a".repeat(201))).0, 400);
    assert_eq!(api.get("/sandboxes/nope").0, 404);
    let id = api.create_running();
    let (s, v) = api.post(
        &format!("/sandboxes/{id}/processes"),
        json!({"cmd": "/bin/true", "args": [], "env": {"A": "1"}}),
    );
    assert_eq!(s, 400);
    assert_eq!(v["status"], "error");
    assert_eq!(api.get(&format!("/sandboxes/{id}/processes/nope/connect")).0, 404);
    assert_eq!(api.sim.ledger().count_status(401), 2);
    assert_eq!(api.sim.ledger().leaked().len(), 1);
}

#[test]
fn non_loopback_listen_is_refused() {
    let cfg = createos_sim::SimConfig {
        listen: "0.0.0.0:0".parse().unwrap(),
        ..createos_sim::SimConfig::default()
    };
    assert!(createos_sim::Simulator::start(cfg).is_err());
}
