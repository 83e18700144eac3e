//! The built `paperclip-worker serve` on its own: framing, ids, notifications,
//! errors and oversize lines on real pipes, against the CreateOS simulator.
//! (`paperclip-test/` drives the same binary through Paperclip's own worker
//! manager.)

use createos_sim::{SimConfig, Simulator};
use provider_host::LeaseStore;
use serde_json::{json, Value};
use std::{
    io::{BufRead, BufReader, Write},
    path::Path,
    process::{Child, ChildStdin, ChildStdout, Command, Stdio},
};

struct Worker {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    /// Notifications read while waiting for answers.
    notifications: Vec<Value>,
}

impl Worker {
    fn start(ledger: &Path) -> Worker {
        let mut child = Command::new(env!("CARGO_BIN_EXE_paperclip-worker"))
            .args(["serve", "--plugin"])
            .arg(e2e::library("createos_provider"))
            .arg("--ledger")
            .arg(ledger)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the worker");
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Worker { child, stdin, stdout, notifications: Vec::new() }
    }

    fn send_line(&mut self, line: &[u8]) {
        self.stdin.write_all(line).unwrap();
        self.stdin.write_all(b"\n").unwrap();
        self.stdin.flush().unwrap();
    }

    /// The next answer (a message with an id, or an error with a null id),
    /// keeping the notifications before it.
    fn answer(&mut self) -> Value {
        loop {
            let mut line = String::new();
            assert!(self.stdout.read_line(&mut line).unwrap() > 0, "the worker closed stdout");
            let message: Value = serde_json::from_str(&line).expect("one JSON object a line");
            assert_eq!(message["jsonrpc"], "2.0", "{message}");
            if message.get("id").is_some() {
                return message;
            }
            self.notifications.push(message);
        }
    }

    fn call(&mut self, id: Value, method: &str, params: Value) -> Value {
        let request = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params,
            "paperclipInvocation": {"id": format!("inv-{id}"), "scope": {"companyId": "acme"}}});
        self.send_line(request.to_string().as_bytes());
        let answer = self.answer();
        assert_eq!(answer["id"], id, "{answer}");
        answer
    }
}

fn env(sim: &Simulator) -> Value {
    json!({"driverKey": "createos", "companyId": "acme", "environmentId": "env-1", "config": sim.provider_config(true)})
}

fn with(base: &Value, extra: Value) -> Value {
    let mut merged = base.clone();
    for (key, value) in extra.as_object().unwrap() {
        merged[key] = value.clone();
    }
    merged
}

#[test]
fn requests_are_answered_by_id_and_bad_lines_get_json_rpc_errors_while_the_worker_lives_on() {
    let dir = tempfile::tempdir().unwrap();
    let mut worker = Worker::start(&dir.path().join("ledger.sqlite3"));

    let init =
        worker.call(json!("init-1"), "initialize", json!({"manifest": {}, "config": {}, "apiVersion": 1}));
    let methods = init["result"]["supportedMethods"].as_array().unwrap();
    assert!(methods.contains(&json!("environmentExecute")) && methods.contains(&json!("environmentSyncOut")));

    worker.send_line(b"{not json");
    assert_eq!(worker.answer()["error"]["code"], -32700);
    worker.send_line(br#"{"jsonrpc":"1.0","id":5,"method":"health"}"#);
    let wrong_version = worker.answer();
    assert_eq!(
        (wrong_version["id"].clone(), wrong_version["error"]["code"].clone()),
        (json!(5), json!(-32600))
    );
    let oversize = format!(
        r#"{{"jsonrpc":"2.0","id":6,"method":"health","params":{{"pad":"{}"}}}}"#,
        "x".repeat(129 << 20)
    );
    worker.send_line(oversize.as_bytes());
    let skipped = worker.answer();
    assert_eq!(
        (skipped["id"].clone(), skipped["error"]["code"].clone()),
        (Value::Null, json!(-32600)),
        "{skipped}"
    );

    assert_eq!(worker.call(json!(7), "noSuchMethod", json!({}))["error"]["code"], -32601);
    assert_eq!(worker.call(json!(8), "environmentCaptureTemplate", json!({}))["error"]["code"], -32004);
    let malformed = worker.call(json!(9), "environmentExecute", json!({"driverKey": "createos"}));
    assert_eq!(malformed["error"]["code"], -32602);
    assert!(malformed["error"]["message"]
        .as_str()
        .unwrap()
        .starts_with("invalid params for environmentExecute: "));

    let health = worker.call(json!(10), "health", json!({}));
    assert_eq!(health["result"]["status"], "ok");
    let shutdown = worker.call(json!(11), "shutdown", json!({}));
    assert_eq!(shutdown["result"], Value::Null);
    assert!(worker.child.wait().unwrap().success());
}

#[test]
fn output_streams_as_execute_log_of_its_invocation_and_provider_logs_become_log_notifications() {
    let sim = Simulator::start(SimConfig { rate_limit: None, ..Default::default() }).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut worker = Worker::start(&dir.path().join("ledger.sqlite3"));
    let env = env(&sim);

    let lease = worker.call(json!(1), "environmentAcquireLease", with(&env, json!({"runId": "run-1"})))
        ["result"]
        .clone();
    assert!(lease["providerLeaseId"].is_string(), "{lease}");
    let logs: Vec<&Value> =
        worker.notifications.iter().filter(|message| message["method"] == "log").collect();
    assert!(
        logs.iter().any(|log| log["params"]["message"] == "CreateOS sandbox created"
            && log["params"]["meta"]["target"] == "createos_provider::lease"),
        "{logs:?}"
    );
    assert!(!serde_json::to_string(&worker.notifications).unwrap().contains(sim.api_key()));

    // A character split across output writes, and bytes that are not UTF-8.
    let script = r"printf 'caf\303'; printf '\251\n'; printf 'bad \377 byte\n' >&2";
    let command = json!({"lease": lease, "command": "/bin/sh", "args": ["-c", script]});
    worker.notifications.clear();
    let result = worker.call(json!("exec-2"), "environmentExecute", with(&env, command))["result"].clone();
    assert_eq!(result["exitCode"], 0, "{result}");
    let chunks = |stream: &str| -> String {
        worker
            .notifications
            .iter()
            .filter(|message| message["method"] == "execute.log" && message["params"]["stream"] == stream)
            .inspect(|message| assert_eq!(message["paperclipInvocationId"], "inv-\"exec-2\""))
            .map(|message| message["params"]["chunk"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(chunks("stdout"), "café\n");
    assert_eq!(chunks("stdout"), result["stdout"].as_str().unwrap());
    assert_eq!(chunks("stderr"), "bad \u{FFFD} byte\n");

    let params =
        with(&env, json!({"providerLeaseId": lease["providerLeaseId"], "leaseMetadata": lease["metadata"]}));
    let destroyed = worker.call(json!(3), "environmentDestroyLease", params);
    assert_eq!(destroyed["result"]["state"], "destroyed", "{destroyed}");
    assert!(sim.live_sandboxes().is_empty());
    drop(worker.stdin);
    assert!(worker.child.wait().unwrap().success(), "the end of stdin stops the worker");
}

#[test]
fn a_ledger_that_cannot_be_written_stops_the_worker_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let blocker = dir.path().join("not-a-directory");
    std::fs::write(&blocker, "a file").unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_paperclip-worker"))
        .args(["serve", "--plugin"])
        .arg(e2e::library("createos_provider"))
        .arg("--ledger")
        .arg(blocker.join("ledger.sqlite3"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.starts_with("paperclip-worker: cannot open the lease ledger: "), "{stderr}");
    assert!(output.stdout.is_empty());
}

#[test]
fn a_lease_the_ledger_never_saw_resumes_with_the_metadata_paperclip_passes_back() {
    let sim = Simulator::start(SimConfig { rate_limit: None, ..Default::default() }).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let env = env(&sim);
    let mut first = Worker::start(&dir.path().join("first.sqlite3"));
    let lease = first.call(json!(1), "environmentAcquireLease", with(&env, json!({"runId": "run-1"})))
        ["result"]
        .clone();
    // Paperclip keeps the lease's metadata merged with keys of its own.
    let mut kept = lease["metadata"].clone();
    kept["pluginId"] = json!("provider-host.createos");
    kept["sandboxProviderPlugin"] = json!(true);
    kept["driver"] = json!("plugin");
    let params = with(&env, json!({"providerLeaseId": lease["providerLeaseId"], "leaseMetadata": kept}));
    let released = first.call(json!(2), "environmentReleaseLease", params.clone());
    assert_eq!(released["result"]["state"], "stopped", "{released}");
    drop(first.stdin);
    assert!(first.child.wait().unwrap().success());

    // Another ledger (a reinstalled package): only Paperclip's metadata is left.
    let mut second = Worker::start(&dir.path().join("second.sqlite3"));
    let resumed = second.call(json!(3), "environmentResumeLease", params.clone());
    assert_eq!(resumed["result"]["providerLeaseId"], lease["providerLeaseId"], "{resumed}");
    let destroyed = second.call(json!(4), "environmentDestroyLease", params);
    assert_eq!(destroyed["result"]["state"], "destroyed", "{destroyed}");
    assert!(sim.live_sandboxes().is_empty());
}

#[test]
fn a_worker_leaves_what_the_provider_learnt_in_the_ledger_for_the_next_one() {
    let sim = Simulator::start(SimConfig { rate_limit: None, ..Default::default() }).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("ledger.sqlite3");
    let mut worker = Worker::start(&ledger);
    let env = env(&sim);
    let lease = worker.call(json!(1), "environmentAcquireLease", with(&env, json!({"runId": "run-1"})))
        ["result"]
        .clone();
    let params =
        with(&env, json!({"providerLeaseId": lease["providerLeaseId"], "leaseMetadata": lease["metadata"]}));
    assert_eq!(worker.call(json!(2), "environmentDestroyLease", params)["result"]["state"], "destroyed");
    drop(worker.stdin);
    assert!(worker.child.wait().unwrap().success());
    // The creation taught the provider when this API's sandboxes run.
    let saved = provider_host::store::sqlite::Ledger::open(&ledger).unwrap().memory("createos").unwrap();
    let keys: Vec<&str> = saved.iter().map(|saved| saved.entry.key.as_str()).collect();
    assert_eq!(keys, [format!("schedule {}", sim.url().trim_end_matches('/'))]);
    assert!(!String::from_utf8_lossy(&saved[0].entry.value).contains(sim.api_key()));
}
