//! The worker: Paperclip's calls served through the host's policy.
//!
//! Each request runs as its own task, so a long `environmentExecute` does not
//! hold up a `health`; answers and notifications go out through one
//! [`Outbox`], a line each. Every lease call goes through
//! [`provider_host::host::Host`] with the configuration that call carries
//! (validated by the provider), so the ledger records each lease before the
//! call that needs it returns, and the seed's fallback applies. Leases are
//! recorded as held by their user (`Owner::Command`): Paperclip keeps every
//! lease it was handed and resumes, releases or destroys it later, through
//! this worker or the next one.
//!
//! Before its first lease call the worker sweeps what workers that are gone
//! left in the ledger (`Scope::Unreturned`): a sandbox whose acquire never
//! returned to Paperclip (still `acquiring` or `creating`: only the dead
//! worker could have named it) is destroyed, or closed without a request when
//! its creation request never left; every lease Paperclip was handed is kept, in
//! whatever state (active, paused, unconfirmed, its release cut short), for
//! Paperclip to resume, release or destroy through this worker, and the
//! ledger's record of it still applies (an unconfirmed lease stays refused).
//! The sweep lends the secrets of that first call's configuration to the
//! rows of the same account.

use crate::{
    errors::rpc_error,
    protocol::{
        self, Environment, Execute, LeaseIdParams, OnLease, PaperclipLease, Realize, Sync, ValidateParams,
    },
    rpc::{self, codes, Incoming, Lines, RpcError, MAX_LINE_BYTES},
    text::{self, Utf8Stream},
};
use provider_abi::{LogLevel, LogRecord, LogSink, OutputStream, ProviderError};
use provider_host::{
    environment,
    host::{HeldLease, Host, Released},
    hosted::HookSupport,
    secrets::SecretFields,
    store::LeaseStore,
    store::{LeaseRecord, Owner},
    sweep::{self, Scope, SweepSecrets},
};
use serde_json::{json, Map, Value};
use std::{sync::Arc, time::Duration};
use tokio::{
    io::{AsyncRead, AsyncWrite, AsyncWriteExt},
    sync::mpsc,
};
use tokio_util::task::TaskTracker;

/// How long the worker lets calls in flight finish once told to stop
/// (Paperclip waits 10 s after `shutdown`, and 5 s after SIGTERM).
pub const DRAIN: Duration = Duration::from_secs(4);

/// Where the worker's answers and notifications go: one JSON object a line
/// on stdout, in the order sent.
#[derive(Clone)]
pub struct Outbox(mpsc::UnboundedSender<Value>);

impl Outbox {
    /// An outbox and the receiving end [`serve`] writes out.
    pub fn new() -> (Outbox, mpsc::UnboundedReceiver<Value>) {
        let (sender, receiver) = mpsc::unbounded_channel();
        (Outbox(sender), receiver)
    }

    /// Queues `message` (dropped once the worker has stopped writing).
    pub fn send(&self, message: Value) {
        drop(self.0.send(message));
    }

    /// The sink that forwards the provider's log events as the worker's
    /// `log` notifications (level, message, and the event's target and
    /// fields as `meta`).
    pub fn log_sink(&self) -> LogSink {
        let outbox = self.clone();
        LogSink::new(move |record: &LogRecord<'_>| {
            let level = match record.level {
                LogLevel::Error => "error",
                LogLevel::Warn => "warn",
                LogLevel::Info => "info",
                LogLevel::Debug | LogLevel::Trace => "debug",
            };
            let mut meta = Map::new();
            meta.insert("target".into(), json!(record.target.as_str()));
            for field in record.fields.iter() {
                meta.insert(field.name.to_string(), json!(field.value.as_str()));
            }
            let params = json!({"level": level, "message": record.message.as_str(), "meta": meta});
            outbox.send(rpc::notification("log", params, None));
        })
    }
}

/// The worker's state: the provider, the ledger and the outbox.
pub struct Worker {
    provider: &'static dyn HookSupport,
    ledger: &'static dyn LeaseStore,
    out: Outbox,
    /// The environment methods served (the provider has their hooks).
    served: Vec<&'static str>,
    /// Whether the sweep of gone workers' leases has run.
    swept: tokio::sync::Mutex<bool>,
}

impl Worker {
    /// A worker serving `provider` (set up already) with `ledger`.
    pub fn new(provider: &'static dyn HookSupport, ledger: &'static dyn LeaseStore, out: Outbox) -> Self {
        let served = protocol::ENVIRONMENT_METHODS
            .iter()
            .filter(|(_, hook)| provider.supports(*hook))
            .map(|(method, _)| *method)
            .collect();
        Worker { provider, ledger, out, served, swept: tokio::sync::Mutex::new(false) }
    }

    /// Answers one request.
    async fn answer(self: Arc<Self>, id: Value, method: String, params: Value, invocation: Option<String>) {
        let message = match self.call(&method, params, invocation.as_deref()).await {
            Ok(result) => rpc::success(id, result),
            Err(error) => rpc::failure(id, &error),
        };
        self.out.send(message);
    }

    async fn call(&self, method: &str, params: Value, invocation: Option<&str>) -> Result<Value, RpcError> {
        match method {
            "initialize" => Ok(json!({"ok": true, "supportedMethods": self.served})),
            "health" => self.health(),
            _ if self.served.contains(&method) => self.environment(method, params, invocation).await,
            _ if protocol::OPTIONAL_METHODS.contains(&method) => Err(RpcError::new(
                codes::METHOD_NOT_IMPLEMENTED,
                format!("{method} is not implemented by this plugin"),
            )),
            _ => Err(RpcError::new(codes::METHOD_NOT_FOUND, format!("method not found: {method}"))),
        }
    }

    fn health(&self) -> Result<Value, RpcError> {
        let report = self.provider.health().map_err(|error| rpc_error(&error))?;
        let status = match report.status.as_str() {
            status @ ("ok" | "degraded" | "error") => status,
            _ => "degraded",
        };
        Ok(json!({"status": status, "message": report.message.as_str()}))
    }

    async fn environment(
        &self,
        method: &str,
        params: Value,
        invocation: Option<&str>,
    ) -> Result<Value, RpcError> {
        if method == "environmentValidateConfig" {
            return self.validate(protocol::params(method, params)?);
        }
        let fail = |error: ProviderError| rpc_error(&error);
        match method {
            "environmentProbe" => {
                let env: Environment = protocol::params(method, params)?;
                let host = self.host(method, &env, "probe").await?;
                host.probe().await.map(|report| protocol::probe_result(&report)).map_err(fail)
            }
            "environmentAcquireLease" => {
                let call: protocol::AcquireParams = protocol::params(method, params)?;
                let host = self.host(method, &call.env, &call.run_id).await?;
                let held = host.acquire().await.map_err(fail)?;
                Ok(protocol::lease_result(&held.lease))
            }
            "environmentResumeLease" => {
                let call: LeaseIdParams = protocol::params(method, params)?;
                let host = self.host(method, &call.env, "paperclip").await?;
                let Some(id) = call.provider_lease_id else {
                    return Err(RpcError::invalid_params(method, "`providerLeaseId` is required"));
                };
                let held = self.hold(&host, Some(id), call.lease_metadata)?;
                host.resume(&held).await.map(|lease| protocol::lease_result(&lease)).map_err(fail)
            }
            "environmentReleaseLease" => {
                let call: LeaseIdParams = protocol::params(method, params)?;
                let host = self.host(method, &call.env, "paperclip").await?;
                self.release(&host, call).await
            }
            "environmentDestroyLease" => {
                let call: LeaseIdParams = protocol::params(method, params)?;
                let host = self.host(method, &call.env, "paperclip").await?;
                let Some(id) = call.provider_lease_id else { return Ok(Value::Null) };
                let held = self.hold(&host, Some(id.clone()), call.lease_metadata)?;
                host.destroy(&held).await.map_err(fail)?;
                Ok(json!({"providerLeaseId": id, "state": "destroyed"}))
            }
            "environmentRealizeWorkspace" => {
                let call: OnLease<Realize> = protocol::params(method, params)?;
                let (host, held) = self.on_lease(method, &call.env, call.lease).await?;
                host.realize(&held).map(|workspace| protocol::workspace_result(&workspace)).map_err(fail)
            }
            "environmentExecute" => {
                let call: OnLease<Execute> = protocol::params(method, params)?;
                let (host, held) = self.on_lease(method, &call.env, call.lease).await?;
                self.execute(&host, &held, call.call, invocation).await
            }
            "environmentSyncIn" | "environmentSyncOut" => {
                let call: OnLease<Sync> = protocol::params(method, params)?;
                let (host, held) = self.on_lease(method, &call.env, call.lease).await?;
                let transfer = protocol::file_transfer(method, call.call);
                host.sync(&held, transfer).await.map(|outcome| protocol::sync_result(&outcome)).map_err(fail)
            }
            _ => Err(RpcError::new(codes::METHOD_NOT_FOUND, format!("method not found: {method}"))),
        }
    }

    /// The host acting for `env` (after the sweep of gone workers' leases).
    async fn host(&self, method: &str, env: &Environment, run_id: &str) -> Result<Host<'static>, RpcError> {
        let config = self.config(method, &env.driver_key, env)?;
        self.sweep_once(&config).await;
        Ok(Host::new(self.provider, self.ledger, &config, Owner::Command, run_id))
    }

    /// The host's view of the environment Paperclip names; a driver key
    /// other than the provider's is refused.
    fn config(
        &self,
        method: &str,
        driver_key: &str,
        env: &Environment,
    ) -> Result<environment::Environment, RpcError> {
        let served = self.provider.manifest().driver_key.to_string();
        if driver_key != served {
            return Err(RpcError::invalid_params(
                method,
                format!("this worker serves driver `{served}`, not `{driver_key}`"),
            ));
        }
        let mut config = environment::Environment::new(
            &env.company_id,
            &env.environment_id,
            Value::Object(env.config.clone()),
        );
        config.driver_key = Some(served);
        Ok(config)
    }

    /// Once per worker, before its first lease call: destroys what gone
    /// workers left (see the module documentation).
    async fn sweep_once(&self, config: &environment::Environment) {
        let mut swept = self.swept.lock().await;
        if *swept {
            return;
        }
        *swept = true;
        let secrets = SweepSecrets::from_config(self.provider, config);
        let (provider, ledger) = (self.provider, self.ledger);
        let scope = Scope::Unreturned;
        let outcome =
            tokio::task::spawn_blocking(move || sweep::sweep(provider, ledger, scope, &secrets)).await;
        let (level, message) = match outcome {
            Ok(Ok(rows)) if rows.is_empty() => return,
            Ok(Ok(rows)) => {
                let rows: Vec<Value> = rows.iter().map(|row| row.to_json()).collect();
                let message = format!("swept {} lease(s) that a previous worker left", rows.len());
                self.out.send(rpc::notification(
                    "log",
                    json!({"level": "warn", "message": message, "meta": {"swept": rows}}),
                    None,
                ));
                return;
            }
            Ok(Err(error)) => ("error", format!("cannot sweep the leases previous workers left: {error}")),
            Err(error) => ("error", format!("the sweep of previous workers' leases failed: {error}")),
        };
        self.out.send(rpc::notification("log", json!({"level": level, "message": message}), None));
    }

    /// The lease Paperclip names, held through the ledger. A lease the
    /// ledger knows is acted on with the metadata the provider returned
    /// (Paperclip adds keys of its own to what it passes back).
    fn hold(
        &self,
        host: &Host<'static>,
        id: Option<String>,
        metadata: Option<Map<String, Value>>,
    ) -> Result<HeldLease, RpcError> {
        let known = self.known(host, id.as_deref());
        let lease = match known.filter(|record| record.metadata.is_some()) {
            Some(record) => record.lease(),
            None => protocol::lease(id, metadata),
        };
        host.hold(lease).map_err(|error| rpc_error(&error))
    }

    /// The ledger's latest row of lease `id` in the host's environment.
    fn known(&self, host: &Host<'static>, id: Option<&str>) -> Option<LeaseRecord> {
        let env = host.env();
        let id = id?;
        self.ledger.find(id, env.company_id.as_str(), env.environment_id.as_str()).ok().flatten()
    }

    async fn on_lease(
        &self,
        method: &str,
        env: &Environment,
        lease: PaperclipLease,
    ) -> Result<(Host<'static>, HeldLease), RpcError> {
        let host = self.host(method, env, "paperclip").await?;
        if lease.provider_lease_id.is_none() {
            return Err(RpcError::invalid_params(method, "`lease.providerLeaseId` is required"));
        }
        let held = self.hold(&host, lease.provider_lease_id, lease.metadata)?;
        Ok((host, held))
    }

    /// `environmentReleaseLease`: released for reuse (`stopped`) or deleted
    /// (`destroyed`). A lease whose cleanup is unconfirmed (reported by the
    /// provider's release, or known to the ledger) is destroyed instead, and
    /// the call fails with the seed's sentence (`data.leaseDestroyed`: true),
    /// so Paperclip never reuses it and its own fallback, a destroy, finds
    /// nothing left.
    async fn release(&self, host: &Host<'static>, call: LeaseIdParams) -> Result<Value, RpcError> {
        let Some(id) = call.provider_lease_id else { return Ok(Value::Null) };
        let held = self.hold(host, Some(id.clone()), call.lease_metadata)?;
        match host.release(&held).await {
            Ok(Released::Kept) => Ok(json!({"providerLeaseId": id, "state": "stopped"})),
            Ok(Released::Deleted) => Ok(json!({"providerLeaseId": id, "state": "destroyed"})),
            Ok(Released::DestroyedInstead(cause)) => {
                let mut error = rpc_error(&cause);
                if let Some(Value::Object(data)) = error.data.as_mut() {
                    data.insert("leaseDestroyed".into(), json!(true));
                }
                Err(error)
            }
            Err(error) => Err(rpc_error(&error)),
        }
    }

    /// `environmentExecute`, its output streamed as `execute.log` chunks.
    async fn execute(
        &self,
        host: &Host<'static>,
        held: &HeldLease,
        call: Execute,
        invocation: Option<&str>,
    ) -> Result<Value, RpcError> {
        let mut decoders = [Utf8Stream::default(), Utf8Stream::default()];
        let out = &self.out;
        let result = {
            let mut forward = |stream: OutputStream, bytes: &[u8]| {
                let (name, decoder) = match stream {
                    OutputStream::Stdout => ("stdout", &mut decoders[0]),
                    OutputStream::Stderr => ("stderr", &mut decoders[1]),
                };
                send_log(out, name, &decoder.push(bytes), invocation);
            };
            let (params, stdin) = protocol::execute_params(call);
            host.execute(held, params, stdin, &mut forward).await
        };
        for (name, decoder) in ["stdout", "stderr"].into_iter().zip(decoders.iter_mut()) {
            send_log(out, name, &decoder.finish(), invocation);
        }
        result.map(|result| protocol::execute_result(&result)).map_err(|error| rpc_error(&error))
    }

    /// `environmentValidateConfig`: the provider's report, its normalised
    /// configuration with the secret properties as Paperclip sent them (the
    /// server stores it, so it must keep the secret references, and never
    /// gets a value back it did not send).
    fn validate(&self, call: ValidateParams) -> Result<Value, RpcError> {
        let env = Environment {
            driver_key: call.driver_key.clone(),
            company_id: "paperclip".into(),
            environment_id: "paperclip".into(),
            config: call.config.clone(),
        };
        let config = self.config("environmentValidateConfig", &call.driver_key, &env)?;
        let host = Host::new(self.provider, self.ledger, &config, Owner::Command, "validate");
        let report = host.validate().map_err(|error| rpc_error(&error))?;
        let normalized = report
            .normalized_config_json
            .as_ref()
            .into_option()
            .and_then(|text| serde_json::from_str::<Value>(text).ok())
            .filter(Value::is_object)
            .map(|normalized| self.secrets_as_given(&normalized, &call.config));
        Ok(protocol::validation_result(&report, normalized))
    }

    /// `normalized` without the provider's secret properties, and with those
    /// of `given` put back as they were.
    fn secrets_as_given(&self, normalized: &Value, given: &Map<String, Value>) -> Value {
        let fields = SecretFields::of(&self.provider.manifest());
        let given = Value::Object(given.clone());
        let public = fields.strip(&given);
        let mut result = fields.strip(normalized);
        if let (Value::Object(result), Value::Object(given)) = (&mut result, given) {
            for (key, value) in given.into_iter().filter(|(key, _)| public.get(key).is_none()) {
                result.insert(key, value);
            }
        }
        result
    }
}

/// Sends `text` of `stream` as `execute.log` chunks of the call `invocation`.
fn send_log(out: &Outbox, stream: &str, text: &str, invocation: Option<&str>) {
    for chunk in text::chunks(text) {
        out.send(rpc::notification("execute.log", json!({"stream": stream, "chunk": chunk}), invocation));
    }
}

/// Serves Paperclip's requests from `input`, writing to `output`, until
/// `shutdown`, the end of the input, or `stop` resolves (SIGTERM); then
/// cancels the provider's work in flight, lets the calls end within
/// [`DRAIN`], and returns.
pub async fn serve(
    worker: Worker,
    outgoing: mpsc::UnboundedReceiver<Value>,
    input: impl AsyncRead + Unpin,
    output: impl AsyncWrite + Unpin + Send + 'static,
    stop: impl std::future::Future<Output = ()>,
) {
    let writer = tokio::spawn(write_lines(outgoing, output));
    let worker = Arc::new(worker);
    let tasks = TaskTracker::new();
    let mut lines = Lines::new(input, MAX_LINE_BYTES);
    let mut stop = std::pin::pin!(stop);
    let mut shutdown_id = None;
    loop {
        let line = tokio::select! {
            line = lines.next() => line,
            () = &mut stop => break,
        };
        let line = match line {
            None => break,
            Some(Err(rpc::Oversize)) => {
                let error = RpcError::new(
                    codes::INVALID_REQUEST,
                    format!("a line over {MAX_LINE_BYTES} bytes was skipped"),
                );
                worker.out.send(rpc::failure(Value::Null, &error));
                continue;
            }
            Some(Ok(line)) if line.iter().all(u8::is_ascii_whitespace) => continue,
            Some(Ok(line)) => line,
        };
        match rpc::parse(&line) {
            Incoming::Request { id, method, .. } if method == "shutdown" => {
                shutdown_id = Some(id);
                break;
            }
            Incoming::Request { id, method, params, invocation } => {
                tasks.spawn(Arc::clone(&worker).answer(id, method, params, invocation));
            }
            Incoming::Invalid { id, error } => worker.out.send(rpc::failure(id, &error)),
            Incoming::Notification { .. } | Incoming::Response { .. } => {}
        }
    }
    // What the provider learnt, for the next worker (a one-time write).
    provider_host::memory::save(worker.provider, worker.ledger);
    if let Err(error) = worker.provider.shutdown() {
        tracing::warn!(kind = %error.kind, "the provider's shutdown failed");
    }
    tasks.close();
    if tokio::time::timeout(DRAIN, tasks.wait()).await.is_err() {
        tracing::warn!("calls still running at shutdown were abandoned; `sweep` destroys what they leave");
    }
    if let Some(id) = shutdown_id {
        worker.out.send(rpc::success(id, Value::Null));
    }
    // The provider's log sink keeps an outbox for the rest of the process:
    // the writer stops at this marker, after everything sent before it.
    worker.out.send(Value::Null);
    let _ = writer.await;
}

/// Writes each message as one line, flushing after each, until `null`.
async fn write_lines(mut messages: mpsc::UnboundedReceiver<Value>, mut output: impl AsyncWrite + Unpin) {
    while let Some(message) = messages.recv().await {
        if message.is_null() {
            return;
        }
        let mut line = match serde_json::to_vec(&message) {
            Ok(line) => line,
            Err(_) => continue,
        };
        line.push(b'\n');
        if output.write_all(&line).await.is_err() || output.flush().await.is_err() {
            return;
        }
    }
}
