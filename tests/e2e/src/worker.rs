//! The out-of-process baseline: a worker process that loads a provider and
//! answers hooks as JSON lines over stdin/stdout, the way Paperclip's plugin
//! workers, nushell plugins and HashiCorp's go-plugin run plugins.
//!
//! Protocol, one JSON object a line each way:
//! - `{"hook":"health"}` → `{"ok":{"status":..,"message":..}}`
//! - `{"hook":"validate_config","companyId":..,"environmentId":..,"config":{..}}`
//!   → `{"ok":{"ok":..,"normalizedConfig":{..}|null,"errors":[..],"warnings":[..]}}`
//! - any failure → `{"error":{"kind":..,"message":..}}`
//!
//! [`serve`] is the worker's side (the `provider-worker` binary); [`Worker`]
//! is the host's.

use provider_abi::{EnvironmentParams, HealthReport, Provider, ProviderError, ValidationReport};
use serde_json::{json, Value};
use std::io::{self, BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

/// Answers requests from `input` on `output` until `input` ends.
pub fn serve(provider: &impl Provider, input: impl BufRead, mut output: impl Write) -> io::Result<()> {
    for line in input.lines() {
        let reply = match serde_json::from_str::<Value>(&line?) {
            Ok(request) => answer(provider, &request),
            Err(error) => json!({"error": {"kind": "invalid_input", "message": error.to_string()}}),
        };
        serde_json::to_writer(&mut output, &reply)?;
        output.write_all(b"\n")?;
        output.flush()?;
    }
    Ok(())
}

fn answer(provider: &impl Provider, request: &Value) -> Value {
    let reply = match request["hook"].as_str() {
        Some("health") => provider.health().map(|report| health_json(&report)),
        Some("validate_config") => {
            provider.validate_config(&environment(request)).map(|r| validation_json(&r))
        }
        _ => Err(ProviderError::unsupported("unknown hook")),
    };
    match reply {
        Ok(value) => json!({ "ok": value }),
        Err(error) => json!({"error": {"kind": error.kind.name(), "message": error.message.as_str()}}),
    }
}

fn environment(request: &Value) -> EnvironmentParams {
    let text = |key: &str, default: &str| request[key].as_str().unwrap_or(default).into();
    EnvironmentParams {
        driver_key: text("driverKey", "createos"),
        company_id: text("companyId", ""),
        environment_id: text("environmentId", ""),
        config_json: request["config"].to_string().into(),
        extensions_json: Default::default(),
    }
}

fn health_json(report: &HealthReport) -> Value {
    json!({"status": report.status.as_str(), "message": report.message.as_str()})
}

fn validation_json(report: &ValidationReport) -> Value {
    let normalized =
        report.normalized_config_json.as_ref().map(|config| serde_json::from_str::<Value>(config));
    json!({
        "ok": report.ok,
        "normalizedConfig": normalized.into_option().and_then(Result::ok),
        "errors": report.errors.iter().map(|e| e.as_str()).collect::<Vec<_>>(),
        "warnings": report.warnings.iter().map(|w| w.as_str()).collect::<Vec<_>>(),
    })
}

/// A running worker process, from the host's side.
pub struct Worker {
    child: Child,
    input: Option<ChildStdin>,
    output: BufReader<ChildStdout>,
    line: String,
}

impl Worker {
    /// Starts worker binary `exe` serving the provider library at `library`.
    pub fn spawn(exe: &Path, library: &Path) -> io::Result<Self> {
        let mut child =
            Command::new(exe).arg(library).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn()?;
        let input = child.stdin.take().expect("piped stdin");
        let output = BufReader::new(child.stdout.take().expect("piped stdout"));
        Ok(Self { child, input: Some(input), output, line: String::new() })
    }

    /// Sends one request and waits for its reply.
    pub fn call(&mut self, request: &Value) -> io::Result<Value> {
        let mut bytes = serde_json::to_vec(request)?;
        bytes.push(b'\n');
        let input = self.input.as_mut().expect("stdin is open until drop");
        input.write_all(&bytes)?;
        input.flush()?;
        self.line.clear();
        if self.output.read_line(&mut self.line)? == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the worker exited"));
        }
        Ok(serde_json::from_str(&self.line)?)
    }

    /// `health` through the worker.
    pub fn health(&mut self) -> io::Result<Value> {
        self.call(&json!({"hook": "health"}))
    }

    /// `validate_config` of `config` through the worker.
    pub fn validate_config(&mut self, config: &Value) -> io::Result<Value> {
        self.call(&json!({"hook": "validate_config", "config": config}))
    }
}

impl Drop for Worker {
    /// Closing stdin ends the worker; wait for it so no zombie is left.
    fn drop(&mut self) {
        drop(self.input.take());
        let _ = self.child.wait();
    }
}
