//! A simulator plus the loaded CreateOS provider, and shorthands for the
//! hook parameters the tests send.

use createos_sim::{Ledger, SimConfig, Simulator};
use provider_abi::{
    AcquireParams, ByteSink, ByteSource, CreationRecorder, EnvironmentParams, ExecuteParams, ExecuteResult,
    HookResult, Lease, LeaseParams, OutputStream, Provider, SyncDirection, SyncParams, SyncResult,
};
use provider_host::{loader::LoadedProvider, wait};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// The company every test lease belongs to.
pub const COMPANY: &str = "company-1";
/// The environment every test lease belongs to.
pub const ENVIRONMENT: &str = "environment-1";

/// A simulator with the CreateOS provider loaded from its cdylib.
pub struct Bed {
    pub sim: Simulator,
    pub provider: LoadedProvider,
}

impl Default for Bed {
    fn default() -> Self {
        Self::new()
    }
}

impl Bed {
    /// A fresh simulator (no rate limit, quick transitions) and provider.
    pub fn new() -> Self {
        let config = SimConfig { rate_limit: None, ..SimConfig::default() };
        Self::with(config)
    }

    /// A bed over a simulator started with `config`.
    pub fn with(config: SimConfig) -> Self {
        let sim = Simulator::start(config).expect("start the simulator");
        let provider = LoadedProvider::load(crate::library("createos_provider")).expect("load the provider");
        Self { sim, provider }
    }

    /// The provider config for this simulator, with `extra` keys merged in.
    pub fn config(&self, extra: Value) -> Value {
        let mut config = json!({
            "apiUrl": self.sim.url(),
            "apiKey": self.sim.api_key(),
            "shape": "s-1vcpu-1gb",
            "timeoutMs": 10_000,
            "requestsPerMinute": 100_000,
        });
        for (key, value) in extra.as_object().expect("extra config is an object") {
            config[key] = value.clone();
        }
        config
    }

    /// Environment parameters for `config`.
    pub fn env(&self, config: &Value) -> EnvironmentParams {
        EnvironmentParams {
            driver_key: "createos".into(),
            company_id: COMPANY.into(),
            environment_id: ENVIRONMENT.into(),
            config_json: config.to_string().into(),
            extensions_json: Default::default(),
        }
    }

    /// Acquires a lease under `config`.
    pub fn acquire(&self, config: &Value) -> Lease {
        wait(self.provider.acquire_lease(self.acquire_params(config), CreationRecorder::discard()))
            .expect("acquire a lease")
    }

    /// Acquire parameters for `config`.
    pub fn acquire_params(&self, config: &Value) -> AcquireParams {
        AcquireParams { env: self.env(config), run_id: "run-1".into(), requested_expires_at: None.into() }
    }

    /// Parameters acting on `lease` under `config`.
    pub fn lease_params(&self, config: &Value, lease: &Lease) -> LeaseParams {
        LeaseParams {
            env: self.env(config),
            run_id: "run-1".into(),
            provider_lease_id: lease.provider_lease_id.clone(),
            metadata_json: lease.metadata_json.clone(),
        }
    }

    /// Runs `params` without standard input, collecting the chunks the
    /// sink saw (as text, each chunk decoded on its own).
    pub fn execute(
        &self,
        params: &ExecuteParams,
    ) -> (HookResult<ExecuteResult>, Vec<(OutputStream, String)>) {
        let (result, chunks) = self.execute_bytes(params, ByteSource::empty());
        let text =
            chunks.into_iter().map(|(stream, bytes)| (stream, String::from_utf8_lossy(&bytes).into_owned()));
        (result, text.collect())
    }

    /// Runs `params` with `stdin`, collecting the raw chunks the sink saw.
    pub fn execute_bytes(
        &self,
        params: &ExecuteParams,
        stdin: ByteSource,
    ) -> (HookResult<ExecuteResult>, Vec<(OutputStream, Vec<u8>)>) {
        let chunks = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let collected = std::sync::Arc::clone(&chunks);
        let sink = ByteSink::new(move |stream, chunk: &[u8]| {
            collected.lock().unwrap().push((stream, chunk.to_vec()))
        });
        let result = wait(self.provider.execute(params.clone(), stdin, sink));
        let chunks = std::mem::take(&mut *chunks.lock().unwrap());
        (result, chunks)
    }

    /// `sync_files` inbound (host files into the lease) with `params`.
    pub fn sync_in(&self, mut params: SyncParams) -> HookResult<SyncResult> {
        params.direction = SyncDirection::In;
        wait(self.provider.sync_files(params))
    }

    /// `sync_files` outbound (lease files to the host) with `params`.
    pub fn sync_out(&self, mut params: SyncParams) -> HookResult<SyncResult> {
        params.direction = SyncDirection::Out;
        wait(self.provider.sync_files(params))
    }

    /// Runs `future` (a hook's) to its end.
    pub fn wait<T>(&self, future: provider_abi::HookFuture<T>) -> HookResult<T> {
        wait(future)
    }

    /// Execute parameters for `command args...` in `lease`.
    pub fn command(&self, config: &Value, lease: &Lease, command: &str, args: &[&str]) -> ExecuteParams {
        ExecuteParams {
            lease: self.lease_params(config, lease),
            command: command.into(),
            args: args.iter().map(|arg| (*arg).into()).collect(),
            ..Default::default()
        }
    }

    /// The simulator's ledger now.
    pub fn ledger(&self) -> Ledger {
        self.sim.ledger()
    }

    /// The state the simulator reports for sandbox `id`.
    pub fn status(&self, id: &str) -> String {
        let ledger = self.ledger();
        ledger
            .sandboxes
            .iter()
            .find(|record| record.id == id)
            .expect("sandbox is in the ledger")
            .status
            .clone()
    }

    /// Waits (bounded) until `condition` holds on the ledger.
    pub fn wait_for_ledger(&self, what: &str, condition: impl Fn(&Ledger) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !condition(&self.ledger()) {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// The lease's sandbox id.
pub fn lease_id(lease: &Lease) -> String {
    lease.provider_lease_id.as_ref().expect("the lease has an id").to_string()
}
