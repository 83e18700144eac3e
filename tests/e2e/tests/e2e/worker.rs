//! The out-of-process worker baseline answers hooks like the loaded library.

use e2e::worker::Worker;
use provider_abi::Provider;
use provider_host::loader::LoadedProvider;
use serde_json::json;
use std::path::Path;

#[test]
fn the_worker_answers_health_like_the_loaded_provider() {
    let library = e2e::library("createos_provider");
    let expected = LoadedProvider::load(&library).unwrap().health().unwrap();
    let mut worker = Worker::spawn(Path::new(env!("CARGO_BIN_EXE_provider-worker")), &library).unwrap();
    let reply = worker.health().unwrap();
    assert_eq!(
        reply,
        json!({"ok": {"status": expected.status.as_str(), "message": expected.message.as_str()}})
    );
    assert_eq!(worker.call(&json!({"hook": "nope"})).unwrap()["error"]["kind"], "unsupported");
}
