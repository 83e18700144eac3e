//! Typed CreateOS HTTP client.
//!
//! - Base `<origin>/v1`, header `X-Api-Key` (marked sensitive), rustls,
//!   redirects never followed (a 3xx is an API error: the key must not travel
//!   to another host).
//! - Every request first takes a pass from its origin's [`RequestGate`]
//!   (a bound on the requests awaiting a reply, held until the reply's head
//!   arrives), then a permit from the shared [`Pacer`] at the caller's
//!   [`Priority`], and the whole call (pacing, request, reply body)
//!   is bounded by the caller's deadline (a `Timeout` error). Cancel by
//!   dropping the future.
//! - A non-2xx reply is an `Api` error with the status and the call's fixed
//!   operation label; its body is dropped unread. A 2xx JSON reply must be
//!   `{"status":"success","data":{...}}` (else `Protocol`).
//! - IDs are checked against `^[A-Za-z0-9_-]{1,200}$` before they are put in a
//!   path (`InvalidInput`, no request), and IDs in replies must match it too.
//!
//! # 429
//!
//! A 429 pauses the whole budget until its `Retry-After` (seconds; missing or
//! unparsable counts as [`DEFAULT_RETRY_AFTER`], longer than
//! [`MAX_RETRY_AFTER`] is capped). Then the request is sent again, at most
//! [`MAX_429_RETRIES`] times and only if the pause ends before the deadline,
//! for the calls a rate limiter's refusal makes safe to repeat: creating,
//! reading, deleting, pausing and resuming a sandbox (a 429 is the limiter's
//! refusal before the request is acted on, *assumed* as for `exec`, and the
//! provider already treats a 429 to `POST /sandboxes` as "nothing created";
//! a repeated pause/resume answers 409, which the transition reconciles),
//! `exec` (a 429 is a refusal before the command runs, and the provider's
//! workspace commands are idempotent), file transfer and process
//! cleanup. Never retried: `POST /processes` (the execute module reports
//! its refusal to the caller, who decides whether to run the command
//! again) and the output connection (the execute module reconnects from
//! its cursor). A 429 that is not retried is returned as an `Api`
//! error with status 429.
//!
//! A 429 also tells the pacer that the server's limiter is not the 60 s
//! sliding window it paces by (see `pacer`): it falls back to smooth pacing
//! for this API, with a `debug` log saying so.

use std::io::Write;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use reqwest::header::{HeaderValue, CONTENT_LENGTH, CONTENT_TYPE, RETRY_AFTER};
use reqwest::{RequestBuilder, Response, StatusCode};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use tokio::time::Instant;
use url::Url;

use crate::config::{ProviderConfig, Secret};
use crate::error::{op, Error};
use crate::gate::RequestGate;
use crate::pacer::{key_fingerprint, Pacer, Priority};
use crate::transition::{Desired, Lifecycle};
use provider_abi::CreationRecorder;

/// `Retry-After` assumed when a 429 has none.
pub const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(1);
/// Longest honoured `Retry-After`.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);
/// Retries of one call after 429s.
pub const MAX_429_RETRIES: u32 = 4;
/// Largest JSON reply accepted.
pub const MAX_JSON_REPLY: usize = 16 << 20;
/// Bytes read from disk at a time when a file is uploaded.
pub const STREAM_CHUNK: usize = 256 << 10;
/// TCP/TLS connect timeout (the caller's deadline bounds everything else).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);

/// Idle connections kept per API origin for reuse: as many as may await a
/// reply at once (the request gate's bound), so the connections of one
/// burst of requests carry the next instead of being closed and opened
/// again; [`IDLE_CONNECTION_TIMEOUT`] closes those a burst left unused.
pub const MAX_IDLE_CONNECTIONS: usize = crate::gate::MAX_AWAITING_REPLY;
/// How long an idle connection is kept.
pub const IDLE_CONNECTION_TIMEOUT: Duration = Duration::from_secs(10);

/// A stream of response body chunks.
pub type ByteStream = Pin<Box<dyn Stream<Item = Result<Bytes, Error>> + Send>>;

/// Per-call pacing priority and deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallOptions {
    /// The call fails with `Timeout` when this passes.
    pub deadline: Instant,
    /// The pacer priority.
    pub priority: Priority,
}

impl CallOptions {
    /// Options with a deadline and priority.
    pub fn new(deadline: Instant, priority: Priority) -> Self {
        CallOptions { deadline, priority }
    }
}

/// The result of `POST /sandboxes/{id}/exec`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
pub struct ExecResult {
    /// The exit code.
    pub exit_code: i64,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

/// Checks a resource ID before it goes into a path.
pub fn is_valid_id(id: &str) -> bool {
    (1..=200).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

pub(crate) fn check_id(id: &str, what: &str) -> Result<(), Error> {
    is_valid_id(id)
        .then_some(())
        .ok_or_else(|| Error::invalid_input(format!("CreateOS {what} ID is invalid.")))
}

/// Builds the HTTP client the provider uses: rustls, no redirects.
/// Share one per runtime: it pools connections.
pub fn build_http_client() -> Result<reqwest::Client, Error> {
    reqwest::Client::builder()
        .use_rustls_tls()
        .pool_max_idle_per_host(MAX_IDLE_CONNECTIONS)
        .pool_idle_timeout(IDLE_CONNECTION_TIMEOUT)
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(CONNECT_TIMEOUT)
        .user_agent(concat!("createos-provider/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|_| Error::internal("Could not build the CreateOS HTTP client."))
}

/// Whether a call may be sent again after a 429.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Retry {
    Never,
    After429,
}

/// A CreateOS API client for one origin and key.
#[derive(Clone)]
pub struct CreateosClient {
    http: reqwest::Client,
    /// `<origin>/v1`, parsed once: each request's URL is this with path
    /// segments pushed, never a string parsed again.
    base: Url,
    /// `<origin>` as text, for errors.
    origin: String,
    key: HeaderValue,
    pacer: Arc<Pacer>,
    gate: Arc<RequestGate>,
}

impl std::fmt::Debug for CreateosClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CreateosClient")
            .field("base", &self.base.as_str())
            .field("key", &"[redacted]")
            .finish_non_exhaustive()
    }
}

impl CreateosClient {
    /// A client for `config`, using the process-wide pacer of its origin and
    /// key.
    pub fn new(config: &ProviderConfig, http: reqwest::Client) -> Result<Self, Error> {
        let pacer = Pacer::shared(
            &config.origin(),
            key_fingerprint(config.api_key.expose()),
            config.requests_per_minute,
        );
        Self::with_pacer(&config.api_url, &config.api_key, http, pacer)
    }

    /// A client with an explicit pacer. `origin`'s path, query and fragment
    /// are ignored.
    pub fn with_pacer(
        origin: &Url,
        key: &Secret,
        http: reqwest::Client,
        pacer: Arc<Pacer>,
    ) -> Result<Self, Error> {
        let mut key = HeaderValue::from_bytes(key.expose().as_bytes())
            .map_err(|_| Error::invalid_config("apiKey cannot be sent in an HTTP header."))?;
        key.set_sensitive(true);
        let origin = origin.origin().ascii_serialization();
        let base = Url::parse(&format!("{origin}/v1"))
            .ok()
            .filter(|base| !base.cannot_be_a_base())
            .ok_or_else(|| Error::invalid_config("apiUrl must be an http or https URL."))?;
        let gate = RequestGate::shared(&origin);
        Ok(CreateosClient { http, base, origin, key, pacer, gate })
    }

    /// The same client behind another request gate.
    #[cfg(test)]
    fn with_gate(self, gate: Arc<RequestGate>) -> Self {
        CreateosClient { gate, ..self }
    }

    /// The shared request budget.
    pub fn pacer(&self) -> &Arc<Pacer> {
        &self.pacer
    }

    /// `<origin>/v1/` followed by `segments`, each percent-encoded as a path
    /// segment.
    fn url(&self, segments: &[&str]) -> Url {
        let mut url = self.base.clone();
        url.path_segments_mut().expect("the base was checked to be a base URL").extend(segments);
        url
    }

    /// `POST /sandboxes`; returns the new sandbox ID. Sent again only after
    /// a 429 (a refusal: nothing was created). `recorder` hears each attempt
    /// right before it leaves, once the gate and the pacer admitted it; its
    /// refusal is returned as [`Error::HostRefused`] and nothing is sent.
    pub async fn create_sandbox(
        &self,
        shape: &str,
        rootfs: Option<&str>,
        region: Option<&str>,
        opts: CallOptions,
        recorder: &mut CreationRecorder,
    ) -> Result<String, Error> {
        let mut body = json!({"shape": shape, "ingress_enabled": false});
        if let Some(rootfs) = rootfs {
            body["rootfs"] = json!(rootfs);
        }
        if let Some(region) = region {
            body["region"] = json!(region);
        }
        let url = self.url(&["sandboxes"]);
        let label = op::SANDBOX_LIFECYCLE;
        let data = self
            .call_json(label, opts, Retry::After429, Some(recorder), || {
                self.http.post(url.clone()).json(&body)
            })
            .await?;
        reply_id(&data, "id", label)
    }

    /// `DELETE /sandboxes/{id}`; 404 counts as already gone. An `id` in the
    /// reply, if any, must echo the request.
    pub async fn delete_sandbox(&self, id: &str, opts: CallOptions) -> Result<(), Error> {
        check_id(id, "sandbox")?;
        let url = self.url(&["sandboxes", id]);
        let data = self
            .call_json(op::SANDBOX_LIFECYCLE, opts, Retry::After429, None, || self.http.delete(url.clone()));
        match data.await {
            Ok(data) if data.get("id").is_some_and(|echo| echo.as_str() != Some(id)) => {
                Err(Error::Protocol(op::SANDBOX_LIFECYCLE))
            }
            Err(error) if !error.is_not_found() => Err(error),
            _ => Ok(()),
        }
    }

    /// `POST /sandboxes/{id}/exec`: a short synchronous command.
    pub async fn exec(
        &self,
        id: &str,
        cmd: &str,
        args: &[String],
        opts: CallOptions,
    ) -> Result<ExecResult, Error> {
        check_id(id, "sandbox")?;
        let url = self.url(&["sandboxes", id, "exec"]);
        let body = json!({"cmd": cmd, "args": args});
        let label = op::WORKSPACE_COMMAND;
        let data = self
            .call_json(label, opts, Retry::After429, None, || self.http.post(url.clone()).json(&body))
            .await?;
        data.get("result")
            .filter(|result| result.is_object())
            .and_then(|result| ExecResult::deserialize(result).ok())
            .ok_or(Error::Protocol(label))
    }

    fn file_url(&self, id: &str, path: &str) -> Result<Url, Error> {
        check_id(id, "sandbox")?;
        if path.is_empty() || path.contains('\0') {
            return Err(Error::invalid_input("CreateOS file path is invalid."));
        }
        let mut url = self.url(&["sandboxes", id, "files"]);
        url.query_pairs_mut().append_pair("path", path);
        Ok(url)
    }

    /// `PUT /sandboxes/{id}/files?path=P` with the bytes `body` streams, of
    /// a length not known ahead (sent chunked). The body can be sent only
    /// once, so a 429 is not retried: it fails the transfer.
    pub async fn put_file_stream(
        &self,
        id: &str,
        path: &str,
        body: reqwest::Body,
        opts: CallOptions,
    ) -> Result<(), Error> {
        let mut body = Some(body);
        let take = || body.take().expect("a request that is never retried is built once");
        self.put_body(id, path, None, opts, Retry::Never, take).await
    }

    /// `PUT /sandboxes/{id}/files?path=P` with the bytes of the host file
    /// `source` (`len` bytes), streamed from disk in
    /// [`STREAM_CHUNK`]-byte reads: the file is never held in memory. The
    /// file is reopened for each attempt (a 429 retry sends it again).
    pub async fn put_file_from(
        &self,
        id: &str,
        path: &str,
        source: &Path,
        len: u64,
        opts: CallOptions,
    ) -> Result<(), Error> {
        self.put_body(id, path, Some(len), opts, Retry::After429, || file_body(source)).await
    }

    /// `PUT /sandboxes/{id}/files?path=P` with the `len` bytes `body` makes
    /// (`None`: a length not known ahead, sent chunked), `body` called again
    /// for each attempt `retry` allows (a 429 retry sends the bytes again).
    async fn put_body(
        &self,
        id: &str,
        path: &str,
        len: Option<u64>,
        opts: CallOptions,
        retry: Retry,
        mut body: impl FnMut() -> reqwest::Body,
    ) -> Result<(), Error> {
        let url = self.file_url(id, path)?;
        let label = op::FILE_TRANSFER;
        self.bounded(label, opts.deadline, async {
            let resp = self
                .send(label, opts, retry, None, || {
                    let request = self.http.put(url.clone()).header(CONTENT_TYPE, "application/octet-stream");
                    match len {
                        Some(len) => request.header(CONTENT_LENGTH, len),
                        None => request,
                    }
                    .body(body())
                })
                .await?;
            read_capped(resp, MAX_JSON_REPLY, label).await?;
            Ok(())
        })
        .await
    }

    /// `GET /sandboxes/{id}/files?path=P`, streamed into `sink` chunk by
    /// chunk (a blocking writer: a host file); returns
    /// the number of bytes written. More than `cap` bytes is
    /// [`Error::UnsafeArchive`]; a body cut short is a connection error. The
    /// deadline bounds the whole transfer.
    pub async fn get_file_into(
        &self,
        id: &str,
        path: &str,
        sink: &mut (dyn Write + Send),
        cap: u64,
        opts: CallOptions,
    ) -> Result<u64, Error> {
        let url = self.file_url(id, path)?;
        let label = op::FILE_TRANSFER;
        self.bounded(label, opts.deadline, async {
            let resp = self.send(label, opts, Retry::After429, None, || self.http.get(url.clone())).await?;
            read_into(resp, sink, cap, Error::UnsafeArchive, label).await
        })
        .await
    }

    /// Removes the `what` file `path` in sandbox `id` (`exec rm -f`) at
    /// cleanup priority under a fresh deadline `timeout` away; a failure is
    /// logged and ignored.
    pub async fn remove_file(&self, id: &str, path: &str, what: &str, timeout: Duration) {
        let options = CallOptions::new(Instant::now() + timeout, Priority::Cleanup);
        let args = ["-f".to_owned(), "--".to_owned(), path.to_owned()];
        if let Err(error) = self.exec(id, "/bin/rm", &args, options).await {
            tracing::debug!(sandbox = %id, error = %error, "CreateOS {what} file removal failed");
        }
    }

    /// `POST /sandboxes/{id}/processes` running `/bin/bash -lc SCRIPT`
    /// (never with `env` or `cwd`: the script changes directory itself).
    /// Returns the process ID. Never retried.
    pub async fn create_process(&self, id: &str, script: &str, opts: CallOptions) -> Result<String, Error> {
        check_id(id, "sandbox")?;
        let url = self.url(&["sandboxes", id, "processes"]);
        let body = json!({"cmd": "/bin/bash", "args": ["-lc", script]});
        let label = op::PROCESS_CREATION;
        let data = self
            .call_json(label, opts, Retry::Never, None, || self.http.post(url.clone()).json(&body))
            .await?;
        reply_id(&data, "process_id", label)
    }

    /// `GET .../processes/{pid}/connect?after=SEQ`: after the status check,
    /// the raw NDJSON body as a stream (errors are `output connection`
    /// connection errors). The deadline bounds only the wait for the reply
    /// headers; the caller bounds the stream. Never retried.
    pub async fn connect(
        &self,
        id: &str,
        pid: &str,
        after: u64,
        opts: CallOptions,
    ) -> Result<ByteStream, Error> {
        check_id(id, "sandbox")?;
        check_id(pid, "process")?;
        let mut url = self.url(&["sandboxes", id, "processes", pid, "connect"]);
        url.query_pairs_mut().append_pair("after", &after.to_string());
        let label = op::OUTPUT_CONNECTION;
        let send = self.send(label, opts, Retry::Never, None, || self.http.get(url.clone()));
        let resp = self.bounded(label, opts.deadline, send).await?;
        Ok(Box::pin(resp.bytes_stream().map(move |chunk| chunk.map_err(transport(label)))))
    }

    /// `DELETE .../processes/{pid}?grace_ms=N`: `Ok(true)` when the whole
    /// process tree is confirmed gone (`tree_exited: true`, or 404);
    /// `Ok(false)` when the reply does not confirm it.
    pub async fn kill_process(
        &self,
        id: &str,
        pid: &str,
        grace_ms: u64,
        opts: CallOptions,
    ) -> Result<bool, Error> {
        check_id(id, "sandbox")?;
        check_id(pid, "process")?;
        let mut url = self.url(&["sandboxes", id, "processes", pid]);
        url.query_pairs_mut().append_pair("grace_ms", &grace_ms.to_string());
        let data = self
            .call_json(op::PROCESS_CLEANUP, opts, Retry::After429, None, || self.http.delete(url.clone()));
        match data.await {
            Ok(data) => Ok(data.get("tree_exited") == Some(&Value::Bool(true))),
            Err(error) if error.is_not_found() => Ok(true),
            Err(error) => Err(error),
        }
    }

    /// Runs `fut` under `deadline`, mapping expiry to `Timeout`.
    async fn bounded<T>(
        &self,
        label: &'static str,
        deadline: Instant,
        fut: impl std::future::Future<Output = Result<T, Error>>,
    ) -> Result<T, Error> {
        tokio::time::timeout_at(deadline, fut).await.unwrap_or(Err(Error::Timeout(label)))
    }

    /// A JSON call: send (`announce` told right before each attempt leaves,
    /// see [`Self::send`]), read the capped body, check the envelope, return
    /// `data`.
    async fn call_json(
        &self,
        label: &'static str,
        opts: CallOptions,
        retry: Retry,
        announce: Option<&mut CreationRecorder>,
        build: impl FnMut() -> RequestBuilder,
    ) -> Result<Map<String, Value>, Error> {
        self.bounded(label, opts.deadline, async {
            let resp = self.send(label, opts, retry, announce, build).await?;
            envelope(&read_capped(resp, MAX_JSON_REPLY, label).await?, label)
        })
        .await
    }

    /// Paces and sends one request, handling 429 per the module docs.
    /// Returns the response of a 2xx; any other status is an `Api` error,
    /// its response (and unread body) dropped.
    /// `announce` (a creation's write-ahead recorder) is told right before
    /// each attempt leaves, once the gate and the pacer admitted it. Its
    /// refusal sends nothing and is returned as [`Error::HostRefused`]; a
    /// deadline that passes while it records is [`Error::NotSent`].
    async fn send(
        &self,
        label: &'static str,
        opts: CallOptions,
        retry: Retry,
        mut announce: Option<&mut CreationRecorder>,
        mut build: impl FnMut() -> RequestBuilder,
    ) -> Result<Response, Error> {
        let mut retries = 0;
        loop {
            // Racing the pass, the permit and the announcement against the
            // deadline here (inside `bounded`, whose timeout polls this
            // future first) tells "never sent" apart from "sent, outcome
            // unknown".
            let admitted = async {
                let pass = self.gate.enter(opts.priority).await;
                self.pacer.acquire(opts.priority).await;
                if let Some(recorder) = announce.as_deref_mut() {
                    recorder.sending().await.map_err(Error::HostRefused)?;
                }
                Ok(pass)
            };
            let pass = tokio::time::timeout_at(opts.deadline, admitted)
                .await
                .unwrap_or(Err(Error::NotSent(label)))?;
            let resp = build().header("X-Api-Key", self.key.clone()).send().await.map_err(|e| {
                match e.is_connect() {
                    true => Error::Unreachable(label, self.origin.clone()),
                    false => transport(label)(e),
                }
            })?;
            // The reply's head is here: its body is read without a pass.
            drop(pass);
            let status = resp.status();
            if status != StatusCode::TOO_MANY_REQUESTS {
                return status.is_success().then_some(resp).ok_or(Error::Api(label, status.as_u16()));
            }
            let wait = parse_retry_after(resp.headers().get(RETRY_AFTER).and_then(|v| v.to_str().ok()));
            drop(resp);
            let until = Instant::now() + wait;
            self.pacer.pause_until(until);
            tracing::debug!(operation = label, wait_ms = wait.as_millis() as u64, "CreateOS 429");
            if self.pacer.pace_smoothly() {
                // Our window had room for this request (window pacing only
                // starts one below its cap), so the server does not count a
                // 60 s sliding window over our requests.
                tracing::debug!(
                    origin = %self.origin,
                    "CreateOS answered 429 although the last 60 s had room: its rate limiter is not a \
                     sliding window; pacing requests smoothly for this API from now on"
                );
            }
            if retry == Retry::Never || retries >= MAX_429_RETRIES || until >= opts.deadline {
                return Err(Error::Api(label, 429));
            }
            retries += 1;
        }
    }
}

/// The sandbox calls of a transition, sent to CreateOS.
impl Lifecycle for CreateosClient {
    /// `GET /sandboxes/{id}`; the reply must echo `id`.
    async fn get_sandbox(&self, id: &str, opts: CallOptions) -> Result<String, Error> {
        check_id(id, "sandbox")?;
        let url = self.url(&["sandboxes", id]);
        let data = self
            .call_json(op::SANDBOX_LIFECYCLE, opts, Retry::After429, None, || self.http.get(url.clone()))
            .await?;
        match (data.get("id").and_then(Value::as_str), data.get("status").and_then(Value::as_str)) {
            (Some(echo), Some(status)) if echo == id => Ok(status.to_string()),
            _ => Err(Error::Protocol(op::SANDBOX_LIFECYCLE)),
        }
    }

    /// `POST /sandboxes/{id}/pause` or `.../resume`. Accepted is not done:
    /// poll. A 409 is returned as an `Api` error for the caller to reconcile.
    async fn submit(&self, id: &str, desired: Desired, opts: CallOptions) -> Result<(), Error> {
        check_id(id, "sandbox")?;
        let action = match desired {
            Desired::Paused => "pause",
            Desired::Running => "resume",
        };
        let url = self.url(&["sandboxes", id, action]);
        self.call_json(op::SANDBOX_LIFECYCLE, opts, Retry::After429, None, || self.http.post(url.clone()))
            .await?;
        Ok(())
    }
}

/// A request body streaming the host file at `source`; a file that cannot
/// be opened fails the body (and so the request) with the I/O error.
fn file_body(source: &Path) -> reqwest::Body {
    match std::fs::File::open(source) {
        Ok(file) => reqwest::Body::wrap_stream(tokio_util::io::ReaderStream::with_capacity(
            tokio::fs::File::from_std(file),
            STREAM_CHUNK,
        )),
        Err(error) => reqwest::Body::wrap_stream(futures_util::stream::once(async move {
            Err::<Bytes, std::io::Error>(error)
        })),
    }
}

/// Maps a transport error of `label` to a `Timeout` or `Connection` error
/// after logging its kind, never its text: that includes the URL (file
/// paths in queries).
fn transport(label: &'static str) -> impl Fn(reqwest::Error) -> Error {
    move |err| {
        tracing::debug!(
            operation = label,
            timeout = err.is_timeout(),
            connect = err.is_connect(),
            "CreateOS transport error"
        );
        match err.is_timeout() {
            true => Error::Timeout(label),
            false => Error::Connection(label),
        }
    }
}

/// Parses `Retry-After` seconds; missing or not a number gives
/// [`DEFAULT_RETRY_AFTER`], longer than [`MAX_RETRY_AFTER`] is capped.
pub fn parse_retry_after(value: Option<&str>) -> Duration {
    value
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map_or(DEFAULT_RETRY_AFTER, |s| Duration::from_secs(s).min(MAX_RETRY_AFTER))
}

/// The body of `resp`, at most `cap` bytes (more is a `Protocol` error).
async fn read_capped(resp: Response, cap: usize, label: &'static str) -> Result<Vec<u8>, Error> {
    let mut body = Vec::new();
    read_into(resp, &mut body, cap as u64, Error::Protocol(label), label).await?;
    Ok(body)
}

/// Streams the body of `resp` into `sink` (a blocking writer) chunk by
/// chunk; more than `cap` bytes is `too_big`, a body cut short a connection
/// error. Returns the number of bytes written.
async fn read_into(
    resp: Response,
    sink: &mut (dyn Write + Send),
    cap: u64,
    too_big: Error,
    label: &'static str,
) -> Result<u64, Error> {
    let mut written: u64 = 0;
    let mut stream = resp.bytes_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(transport(label))?;
        written += chunk.len() as u64;
        if written > cap {
            return Err(too_big);
        }
        sink.write_all(&chunk).map_err(Error::host_write)?;
    }
    sink.flush().map_err(Error::host_write)?;
    Ok(written)
}

/// `{"status":"success","data":{...}}` → `data`.
pub fn envelope(body: &[u8], label: &'static str) -> Result<Map<String, Value>, Error> {
    let reply = serde_json::from_slice::<Value>(body).ok().filter(|reply| reply["status"] == "success");
    match reply.and_then(|mut reply| reply.get_mut("data").map(Value::take)) {
        Some(Value::Object(data)) => Ok(data),
        _ => Err(Error::Protocol(label)),
    }
}

fn reply_id(data: &Map<String, Value>, field: &str, label: &'static str) -> Result<String, Error> {
    match data.get(field) {
        Some(Value::String(id)) if is_valid_id(id) => Ok(id.clone()),
        _ => Err(Error::Protocol(label)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;
    use axum::body::Body;
    use axum::extract::{Request, State};
    use axum::response::Response as AxumResponse;
    use std::collections::VecDeque;
    use std::sync::Mutex;

    const KEY: &str = "test-key-Secret123";

    #[derive(Debug, Clone)]
    struct Seen {
        method: String,
        uri: String,
        key: Option<String>,
        content_type: Option<String>,
        body: Vec<u8>,
    }

    #[derive(Clone)]
    enum Reply {
        Status(u16, Vec<(&'static str, String)>, Vec<u8>),
        Hang,
    }

    fn ok(data: Value) -> Reply {
        Reply::Status(200, vec![], serde_json::to_vec(&json!({"status": "success", "data": data})).unwrap())
    }

    fn status(code: u16) -> Reply {
        Reply::Status(code, vec![], format!("secret echo {KEY}").into_bytes())
    }

    fn raw(code: u16, body: &str) -> Reply {
        Reply::Status(code, vec![], body.as_bytes().to_vec())
    }

    #[derive(Clone, Default)]
    struct Mock {
        replies: Arc<Mutex<VecDeque<Reply>>>,
        seen: Arc<Mutex<Vec<Seen>>>,
    }

    impl Mock {
        fn push(&self, reply: Reply) {
            self.replies.lock().unwrap().push_back(reply);
        }
        fn seen(&self) -> Vec<Seen> {
            self.seen.lock().unwrap().clone()
        }
    }

    async fn handler(State(mock): State<Mock>, req: Request) -> AxumResponse {
        let (parts, body) = req.into_parts();
        let body = axum::body::to_bytes(body, usize::MAX).await.unwrap().to_vec();
        let header = |name: &str| parts.headers.get(name).map(|v| v.to_str().unwrap().to_string());
        mock.seen.lock().unwrap().push(Seen {
            method: parts.method.to_string(),
            uri: parts.uri.to_string(),
            key: header("x-api-key"),
            content_type: header("content-type"),
            body,
        });
        let reply = mock.replies.lock().unwrap().pop_front();
        match reply {
            Some(Reply::Status(code, headers, body)) => {
                let mut resp = AxumResponse::builder().status(code);
                for (name, value) in headers {
                    resp = resp.header(name, value);
                }
                resp.body(Body::from(body)).unwrap()
            }
            Some(Reply::Hang) => std::future::pending().await,
            None => AxumResponse::builder().status(599).body(Body::empty()).unwrap(),
        }
    }

    /// `GET /sandboxes/s/files?path=P` into memory.
    async fn get_file(client: &CreateosClient, path: &str, o: CallOptions) -> Result<Vec<u8>, Error> {
        let mut body = Vec::new();
        client.get_file_into("s", path, &mut body, u64::MAX, o).await.map(|_| body)
    }

    async fn server() -> (Mock, CreateosClient) {
        let mock = Mock::default();
        let client = client_of(axum::Router::new().fallback(handler).with_state(mock.clone())).await;
        (mock, client)
    }

    /// Serves `app` on a loopback port and returns a client of it.
    async fn client_of(app: axum::Router) -> CreateosClient {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        let origin = Url::parse(&format!("http://{addr}")).unwrap();
        CreateosClient::with_pacer(
            &origin,
            &Secret::new(KEY),
            build_http_client().unwrap(),
            Arc::new(Pacer::new(100_000)),
        )
        .unwrap()
    }

    fn opts() -> CallOptions {
        CallOptions::new(Instant::now() + Duration::from_secs(10), Priority::InFlight)
    }

    fn discard() -> CreationRecorder {
        CreationRecorder::discard()
    }

    /// Notes how many requests the server had seen each time a creation was
    /// announced; refuses every announcement when `refuse` is set.
    struct Announcements {
        mock: Mock,
        heard: Arc<Mutex<Vec<usize>>>,
        refuse: bool,
    }

    impl provider_abi::RecordCreation for Announcements {
        fn sending(&mut self) -> provider_abi::HookFuture<()> {
            self.heard.lock().unwrap().push(self.mock.seen().len());
            let answer = match self.refuse {
                true => Err(provider_abi::ProviderError::internal("the ledger is read-only")),
                false => Ok(()),
            };
            provider_abi::ready(answer)
        }

        fn created(&mut self, _lease: &provider_abi::Lease) -> provider_abi::HookFuture<()> {
            provider_abi::ready(Ok(()))
        }
    }

    fn announcing(mock: &Mock, refuse: bool) -> (CreationRecorder, Arc<Mutex<Vec<usize>>>) {
        let heard = Arc::new(Mutex::new(Vec::new()));
        let recorder =
            CreationRecorder::new(Announcements { mock: mock.clone(), heard: Arc::clone(&heard), refuse });
        (recorder, heard)
    }

    #[tokio::test]
    async fn each_creation_attempt_is_announced_right_before_it_leaves() {
        let (mock, client) = server().await;
        mock.push(Reply::Status(429, vec![("retry-after", "0".into())], vec![]));
        mock.push(ok(json!({"id": "sbx_1"})));
        let (mut recorder, heard) = announcing(&mock, false);
        let id = client.create_sandbox("s-1vcpu-1gb", None, None, opts(), &mut recorder).await.unwrap();
        assert_eq!(id, "sbx_1");
        assert_eq!(*heard.lock().unwrap(), [0, 1], "once per attempt, before the server saw it");
    }

    #[tokio::test]
    async fn a_refused_announcement_sends_nothing_and_returns_the_hosts_error() {
        let (mock, client) = server().await;
        let (mut recorder, heard) = announcing(&mock, true);
        let err = client.create_sandbox("s-1vcpu-1gb", None, None, opts(), &mut recorder).await.unwrap_err();
        assert!(err.is_not_sent());
        assert_eq!(err, Error::HostRefused(provider_abi::ProviderError::internal("the ledger is read-only")));
        assert_eq!(heard.lock().unwrap().len(), 1);
        assert!(mock.seen().is_empty());
    }

    #[tokio::test]
    async fn a_creation_the_pacer_never_admits_is_never_announced() {
        let (mock, client) = server().await;
        client.pacer().pause_until(Instant::now() + Duration::from_secs(60));
        let (mut recorder, heard) = announcing(&mock, false);
        let deadline = Instant::now() + Duration::from_millis(200);
        let options = CallOptions::new(deadline, Priority::InFlight);
        let err = client.create_sandbox("s-1vcpu-1gb", None, None, options, &mut recorder).await.unwrap_err();
        assert!(err.is_not_sent(), "{err}");
        assert!(heard.lock().unwrap().is_empty(), "nothing could exist remotely: nothing to record");
        assert!(mock.seen().is_empty());
    }

    fn assert_clean(err: &Error) {
        let msg = err.to_string();
        assert!(!msg.contains(KEY) && !msg.contains("127.0.0.1"), "{msg}");
    }

    #[tokio::test]
    async fn create_sandbox_sends_the_contract() {
        let (mock, client) = server().await;
        mock.push(ok(json!({"id": "sbx_1"})));
        let id =
            client.create_sandbox("s-1vcpu-1gb", Some("ubuntu"), None, opts(), &mut discard()).await.unwrap();
        assert_eq!(id, "sbx_1");
        let seen = &mock.seen()[0];
        assert_eq!(seen.method, "POST");
        assert_eq!(seen.uri, "/v1/sandboxes");
        assert_eq!(seen.key.as_deref(), Some(KEY));
        assert_eq!(seen.content_type.as_deref(), Some("application/json"));
        let body: Value = serde_json::from_slice(&seen.body).unwrap();
        assert_eq!(body, json!({"shape": "s-1vcpu-1gb", "rootfs": "ubuntu", "ingress_enabled": false}));
    }

    #[tokio::test]
    async fn malformed_replies_are_protocol_errors() {
        let cases = [
            raw(200, "not json"),
            raw(200, r#"{"status":"error","data":{"id":"a","status":"running"}}"#),
            raw(200, r#"{"status":"success","data":[1]}"#),
            raw(200, r#"{"status":"success"}"#),
            raw(200, r#"[]"#),
            ok(json!({"id": "other", "status": "running"})),
            ok(json!({"status": "running"})),
            ok(json!({"id": "sbx_1", "status": 3})),
        ];
        let (mock, client) = server().await;
        for reply in cases {
            mock.push(reply);
            let err = client.get_sandbox("sbx_1", opts()).await.unwrap_err();
            assert_eq!(err.kind(), ErrorKind::PROTOCOL, "{err}");
            assert_eq!(err.to_string(), "CreateOS returned a malformed sandbox lifecycle response.");
        }
        mock.push(ok(json!({"id": "sbx_1", "status": "paused"})));
        assert_eq!(client.get_sandbox("sbx_1", opts()).await.unwrap(), "paused");
        mock.push(ok(json!({"id": "../x"})));
        let err = client.create_sandbox("s-1vcpu-1gb", None, None, opts(), &mut discard()).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::PROTOCOL);
    }

    #[tokio::test]
    async fn non_2xx_is_an_api_error_with_the_label() {
        let (mock, client) = server().await;
        let cases: Vec<(u16, &str)> = vec![
            (500, "sandbox lifecycle"),
            (400, "process creation"),
            (503, "file transfer"),
            (502, "workspace command"),
            (410, "output connection"),
            (500, "process cleanup"),
            (302, "sandbox lifecycle"),
        ];
        for (code, label) in cases {
            mock.push(status(code));
            let o = opts();
            let err = match label {
                "sandbox lifecycle" => client.submit("s", Desired::Paused, o).await.unwrap_err(),
                "process creation" => client.create_process("s", "true", o).await.unwrap_err(),
                "file transfer" => get_file(&client, "/a", o).await.unwrap_err(),
                "workspace command" => client.exec("s", "true", &[], o).await.unwrap_err(),
                "output connection" => client.connect("s", "p", 0, o).await.err().unwrap(),
                _ => client.kill_process("s", "p", 1000, o).await.unwrap_err(),
            };
            assert_eq!(err.kind(), ErrorKind::API);
            assert_eq!(err.http_status(), Some(code));
            assert_eq!(err.operation(), Some(label));
            assert_eq!(err.to_string(), format!("CreateOS {label} failed with HTTP {code}."));
            assert_clean(&err);
        }
    }

    #[tokio::test]
    async fn redirects_are_not_followed() {
        let (mock, client) = server().await;
        mock.push(Reply::Status(307, vec![("location", "http://127.0.0.1:1/steal".to_string())], vec![]));
        let err = client.delete_sandbox("s", opts()).await.unwrap_err();
        assert_eq!(err.http_status(), Some(307));
        assert_eq!(mock.seen().len(), 1);
    }

    #[tokio::test]
    async fn tolerated_statuses() {
        let (mock, client) = server().await;
        mock.push(status(404));
        client.delete_sandbox("gone", opts()).await.unwrap();
        mock.push(ok(json!({"id": "s"})));
        client.delete_sandbox("s", opts()).await.unwrap();
        mock.push(ok(json!({"id": "t"})));
        let err = client.delete_sandbox("s", opts()).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::PROTOCOL);
        mock.push(status(404));
        assert!(client.kill_process("s", "p", 1000, opts()).await.unwrap());
        mock.push(ok(json!({"tree_exited": true})));
        assert!(client.kill_process("s", "p", 1000, opts()).await.unwrap());
        mock.push(ok(json!({"tree_exited": false})));
        assert!(!client.kill_process("s", "p", 1000, opts()).await.unwrap());
        mock.push(ok(json!({})));
        assert!(!client.kill_process("s", "p", 250, opts()).await.unwrap());
        mock.push(status(409));
        let err = client.submit("s", Desired::Running, opts()).await.unwrap_err();
        assert_eq!(err.http_status(), Some(409));
        let uris: Vec<_> = mock.seen().into_iter().map(|s| s.uri).collect();
        assert_eq!(uris[3], "/v1/sandboxes/s/processes/p?grace_ms=1000");
        assert_eq!(uris[6], "/v1/sandboxes/s/processes/p?grace_ms=250");
        assert_eq!(uris[7], "/v1/sandboxes/s/resume");
    }

    #[tokio::test]
    async fn exec_files_processes_and_output() {
        let (mock, client) = server().await;
        mock.push(ok(json!({"result": {"exit_code": 3, "stdout": "o", "stderr": "e"}})));
        let r = client.exec("s", "/bin/mkdir", &["-p".into(), "/w".into()], opts()).await.unwrap();
        assert_eq!(r, ExecResult { exit_code: 3, stdout: "o".into(), stderr: "e".into() });
        mock.push(raw(200, ""));
        let body = reqwest::Body::from(Bytes::from_static(b"\x00\x01"));
        client.put_file_stream("s", "/w/a b&c=d", body, opts()).await.unwrap();
        mock.push(raw(200, "contents"));
        let bytes = get_file(&client, "/w/x", opts()).await.unwrap();
        assert_eq!(&bytes[..], b"contents");
        mock.push(ok(json!({"process_id": "p-1"})));
        let pid = client.create_process("s", "echo hi", opts()).await.unwrap();
        assert_eq!(pid, "p-1");
        mock.push(raw(200, "{\"type\":\"heartbeat\"}\n"));
        let mut stream = client.connect("s", "p-1", 7, opts()).await.unwrap();
        let mut out = Vec::new();
        while let Some(chunk) = stream.next().await {
            out.extend_from_slice(&chunk.unwrap());
        }
        assert_eq!(out, b"{\"type\":\"heartbeat\"}\n");

        let seen = mock.seen();
        assert_eq!(
            serde_json::from_slice::<Value>(&seen[0].body).unwrap(),
            json!({"cmd": "/bin/mkdir", "args": ["-p", "/w"]})
        );
        assert_eq!(seen[1].method, "PUT");
        assert_eq!(seen[1].uri, "/v1/sandboxes/s/files?path=%2Fw%2Fa+b%26c%3Dd");
        assert_eq!(seen[1].content_type.as_deref(), Some("application/octet-stream"));
        assert_eq!(seen[1].body, b"\x00\x01");
        assert_eq!(seen[2].uri, "/v1/sandboxes/s/files?path=%2Fw%2Fx");
        assert_eq!(
            serde_json::from_slice::<Value>(&seen[3].body).unwrap(),
            json!({"cmd": "/bin/bash", "args": ["-lc", "echo hi"]})
        );
        assert_eq!(seen[4].uri, "/v1/sandboxes/s/processes/p-1/connect?after=7");
        assert!(seen.iter().all(|s| s.key.as_deref() == Some(KEY)));
    }

    #[tokio::test]
    async fn invalid_ids_send_nothing() {
        let (mock, client) = server().await;
        let long = "a".repeat(201);
        for id in ["", "a/b", "..", "a b", "é", long.as_str()] {
            let err = client.get_sandbox(id, opts()).await.unwrap_err();
            assert_eq!(err.kind(), ErrorKind::INVALID_INPUT);
            assert_eq!(err.to_string(), "CreateOS sandbox ID is invalid.");
            let err = client.kill_process("s", id, 1, opts()).await.unwrap_err();
            assert_eq!(err.to_string(), "CreateOS process ID is invalid.");
        }
        let err = get_file(&client, "", opts()).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::INVALID_INPUT);
        assert!(mock.seen().is_empty());
        assert!(is_valid_id(&"a".repeat(200)));
    }

    #[tokio::test]
    async fn too_many_requests() {
        let (mock, client) = server().await;
        let retry = |s: &str| Reply::Status(429, vec![("retry-after", s.to_string())], vec![]);
        assert_eq!(client.pacer().pacing(), crate::pacer::Pacing::Window);
        // Safe calls are retried after the pause.
        mock.push(retry("0"));
        mock.push(ok(json!({"id": "s", "status": "running"})));
        client.get_sandbox("s", opts()).await.unwrap();
        assert_eq!(mock.seen().len(), 2);
        // So is a refused creation: the limiter created nothing.
        mock.push(retry("0"));
        mock.push(ok(json!({"id": "sbx_2"})));
        assert_eq!(
            client.create_sandbox("s-1vcpu-1gb", None, None, opts(), &mut discard()).await.unwrap(),
            "sbx_2"
        );
        let seen = mock.seen();
        assert_eq!(seen.len(), 4);
        assert!(seen[2..].iter().all(|s| s.method == "POST" && s.uri == "/v1/sandboxes"));
        // A pause past the deadline is not waited for; the whole budget
        // pauses, and the pacer paces smoothly from now on.
        assert_eq!(client.pacer().pacing(), crate::pacer::Pacing::Smooth);
        mock.push(retry("30"));
        let before = Instant::now();
        let err = client.create_sandbox("s-1vcpu-1gb", None, None, opts(), &mut discard()).await.unwrap_err();
        assert_eq!(err.http_status(), Some(429));
        assert_eq!(err.operation(), Some("sandbox lifecycle"));
        let paused = client.pacer().paused_until().unwrap();
        assert!(paused >= before + Duration::from_secs(30));
        assert_eq!(mock.seen().len(), 5);
    }

    #[tokio::test]
    async fn process_creation_is_never_retried_and_pause_past_deadline_fails_fast() {
        let (mock, client) = server().await;
        mock.push(Reply::Status(429, vec![("retry-after", "0".into())], vec![]));
        let err = client.create_process("s", "true", opts()).await.unwrap_err();
        assert_eq!(err.http_status(), Some(429));
        // A retryable call whose pause outlasts the deadline is not retried.
        mock.push(Reply::Status(429, vec![("retry-after", "20".into())], vec![]));
        let err = get_file(&client, "/a", opts()).await.unwrap_err();
        assert_eq!(err.http_status(), Some(429));
        assert_eq!(mock.seen().len(), 2);
    }

    #[test]
    fn retry_after_parsing() {
        assert_eq!(parse_retry_after(Some("5")), Duration::from_secs(5));
        assert_eq!(parse_retry_after(Some(" 0 ")), Duration::ZERO);
        assert_eq!(parse_retry_after(Some("9999")), MAX_RETRY_AFTER);
        assert_eq!(parse_retry_after(Some("soon")), DEFAULT_RETRY_AFTER);
        assert_eq!(parse_retry_after(None), DEFAULT_RETRY_AFTER);
    }

    #[tokio::test]
    async fn transport_failures_and_deadlines() {
        // Connection refused: a port nobody listens on.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let client = CreateosClient::with_pacer(
            &Url::parse(&format!("http://{addr}")).unwrap(),
            &Secret::new(KEY),
            build_http_client().unwrap(),
            Arc::new(Pacer::new(1000)),
        )
        .unwrap();
        let err = get_file(&client, "/secret?x", opts()).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::CONNECTION);
        assert_eq!(
            err.to_string(),
            format!("CreateOS file transfer was not sent: cannot connect to http://{addr}.")
        );
        assert!(err.is_unreachable());
        // The origin is named, never the key, the path or the query.
        assert!(!err.to_string().contains(KEY) && !err.to_string().contains("secret"), "{err}");

        // A server that never answers: the deadline ends the call.
        let (mock, client) = server().await;
        mock.push(Reply::Hang);
        let deadline = Instant::now() + Duration::from_millis(200);
        let err = client.get_sandbox("s", CallOptions::new(deadline, Priority::Cleanup)).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::TIMEOUT);
        assert_eq!(err.to_string(), "CreateOS sandbox lifecycle timed out.");
        assert!(Instant::now() >= deadline);
    }

    /// A server that holds every request until the test lets replies go,
    /// counting the requests it holds at once.
    #[derive(Clone)]
    struct Holding {
        held: Arc<std::sync::atomic::AtomicUsize>,
        peak: Arc<std::sync::atomic::AtomicUsize>,
        arrived: Arc<std::sync::atomic::AtomicUsize>,
        replies: Arc<tokio::sync::Semaphore>,
    }

    async fn hold(State(server): State<Holding>) -> AxumResponse {
        use std::sync::atomic::Ordering::SeqCst;
        let held = server.held.fetch_add(1, SeqCst) + 1;
        server.peak.fetch_max(held, SeqCst);
        server.arrived.fetch_add(1, SeqCst);
        server.replies.acquire().await.unwrap().forget();
        server.held.fetch_sub(1, SeqCst);
        let body = json!({"status": "success", "data": {"id": "s", "status": "running"}});
        AxumResponse::builder().status(200).body(Body::from(body.to_string())).unwrap()
    }

    #[tokio::test]
    async fn requests_past_the_gate_are_sent_only_once_a_reply_arrived() {
        use std::sync::atomic::Ordering::SeqCst;
        let server = Holding {
            held: Arc::default(),
            peak: Arc::default(),
            arrived: Arc::default(),
            replies: Arc::new(tokio::sync::Semaphore::new(0)),
        };
        let client = client_of(axum::Router::new().fallback(hold).with_state(server.clone()))
            .await
            .with_gate(Arc::new(RequestGate::new(3, 1)));
        let calls: Vec<_> = (0..8)
            .map(|_| {
                let client = client.clone();
                tokio::spawn(async move { client.get_sandbox("s", opts()).await })
            })
            .collect();
        while server.arrived.load(SeqCst) < 3 {
            tokio::task::yield_now().await;
        }
        server.replies.add_permits(8);
        for call in calls {
            assert_eq!(call.await.unwrap().unwrap(), "running");
        }
        assert_eq!(server.arrived.load(SeqCst), 8);
        assert_eq!(server.peak.load(SeqCst), 3, "at most the gate's bound awaits a reply at once");
    }

    #[tokio::test]
    async fn the_connections_of_one_burst_carry_the_next() {
        use axum::extract::ConnectInfo;
        use std::net::SocketAddr;
        use std::sync::atomic::Ordering::SeqCst;
        // More requests awaiting a reply at once than a small idle pool
        // keeps: the pool must keep them all for the next burst.
        const BURST: usize = 96;
        let server = Holding {
            held: Arc::default(),
            peak: Arc::default(),
            arrived: Arc::default(),
            replies: Arc::new(tokio::sync::Semaphore::new(0)),
        };
        let peers = Arc::new(Mutex::new(std::collections::HashSet::new()));
        let app = axum::Router::new().fallback({
            let (server, peers) = (server.clone(), peers.clone());
            move |ConnectInfo(peer): ConnectInfo<SocketAddr>| async move {
                peers.lock().unwrap().insert(peer);
                hold(State(server)).await
            }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let origin = Url::parse(&format!("http://{}", listener.local_addr().unwrap())).unwrap();
        tokio::spawn(async move {
            axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await.unwrap()
        });
        let client = CreateosClient::with_pacer(
            &origin,
            &Secret::new(KEY),
            build_http_client().unwrap(),
            Arc::new(Pacer::new(100_000)),
        )
        .unwrap();
        for burst in 1..=2 {
            let calls: Vec<_> = (0..BURST)
                .map(|_| {
                    let client = client.clone();
                    tokio::spawn(async move { client.get_sandbox("s", opts()).await })
                })
                .collect();
            while server.arrived.load(SeqCst) < burst * BURST {
                tokio::task::yield_now().await;
            }
            assert_eq!(server.peak.load(SeqCst), BURST, "the whole burst awaits a reply at once");
            server.replies.add_permits(BURST);
            for call in calls {
                call.await.unwrap().unwrap();
            }
        }
        // A pool of 32 idle connections opened 64 more for the second burst.
        let connections = peers.lock().unwrap().len();
        assert!(connections < BURST + BURST / 8, "{connections} connections for two bursts of {BURST}");
    }

    #[tokio::test]
    async fn a_deadline_that_passes_at_the_gate_means_the_request_was_never_sent() {
        let (mock, client) = server().await;
        let client = client.with_gate(Arc::new(RequestGate::new(1, 0)));
        mock.push(Reply::Hang);
        let hanging = tokio::spawn({
            let client = client.clone();
            async move { client.get_sandbox("s", opts()).await }
        });
        while mock.seen().is_empty() {
            tokio::task::yield_now().await;
        }
        let deadline = Instant::now() + Duration::from_millis(50);
        let err = client.create_process("s", "true", CallOptions::new(deadline, Priority::NewWork)).await;
        let err = err.unwrap_err();
        assert!(err.is_not_sent(), "{err}");
        assert_eq!(mock.seen().len(), 1, "the creation never reached the server");
        hanging.abort();
    }

    #[test]
    fn debug_redacts_the_key() {
        let client = CreateosClient::with_pacer(
            &Url::parse("https://api.sb.createos.sh").unwrap(),
            &Secret::new(KEY),
            reqwest::Client::new(),
            Arc::new(Pacer::new(10)),
        )
        .unwrap();
        assert!(!format!("{client:?}").contains(KEY));
        assert!(format!("{client:?}").contains("https://api.sb.createos.sh/v1"));
    }
}

#[cfg(test)]
mod envelope_properties {
    use super::*;
    use proptest::prelude::*;

    /// Arbitrary JSON values, nested a few levels.
    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            ".{0,12}".prop_map(Value::String),
            Just(json!("success")),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::btree_map(
                    prop_oneof![Just("status".to_owned()), Just("data".to_owned()), "[a-z]{1,6}"],
                    inner,
                    0..4
                )
                .prop_map(|map| Value::Object(map.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn hostile_bodies_never_panic_and_errors_never_echo_them(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
            if let Err(error) = envelope(&bytes, "sandbox lifecycle") {
                prop_assert_eq!(error.to_string(), "CreateOS returned a malformed sandbox lifecycle response.");
            }
        }

        #[test]
        fn only_a_success_status_with_object_data_is_accepted(value in json_value()) {
            let accepted = envelope(value.to_string().as_bytes(), "file transfer");
            let expected = value.get("status") == Some(&json!("success"))
                && value.get("data").is_some_and(Value::is_object);
            prop_assert_eq!(accepted.is_ok(), expected, "{}", value);
            if let Ok(data) = accepted {
                prop_assert_eq!(Value::Object(data), value["data"].clone());
            }
        }
    }
}
