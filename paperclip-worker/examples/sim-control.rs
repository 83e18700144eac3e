//! The CreateOS simulator for the Node test (`paperclip-test/`), driven one
//! JSON object a line on stdin until its end.
//!
//! It prints `{"url", "apiKey"}` first, then answers each command with one line:
//! `{"addFault": RULE}` (the simulator's fault rule JSON) → `{"id"}`;
//! `{"clearFaults": true}` → `{}`; `{"liveSandboxes": true}` → `{"live": [ids]}`;
//! `{"count": "METHOD /v1/path/pattern"}` → `{"count"}` (requests served so far).
//! Run it with `cargo run -p paperclip-worker --example sim-control`.

use createos_sim::{FaultRule, SimConfig, Simulator};
use serde_json::{json, Value};
use std::io::{BufRead, Write};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let sim = Simulator::start(SimConfig { rate_limit: None, ..SimConfig::default() })?;
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{}", json!({"url": sim.url(), "apiKey": sim.api_key()}))?;
    stdout.flush()?;
    for line in std::io::stdin().lock().lines() {
        let command: Value = serde_json::from_str(&line?)?;
        let answer = if let Some(rule) = command.get("addFault") {
            let rule: FaultRule = serde_json::from_value(rule.clone())?;
            json!({"id": sim.add_fault(rule).0})
        } else if command.get("clearFaults").is_some() {
            sim.clear_faults();
            json!({})
        } else if command.get("liveSandboxes").is_some() {
            json!({"live": sim.live_sandboxes()})
        } else if let Some(route) = command.get("count").and_then(Value::as_str) {
            let (method, path) = route.split_once(' ').ok_or("count: \"METHOD /path\"")?;
            json!({"count": sim.ledger().count(method, path)})
        } else {
            json!({"error": format!("unknown command {command}")})
        };
        writeln!(stdout, "{answer}")?;
        stdout.flush()?;
    }
    Ok(())
}
