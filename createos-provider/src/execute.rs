//! The `execute` hook: run one command in a lease's sandbox as a managed
//! process and stream its output.
//!
//! # Order of events
//!
//! 1. Ownership check, timeout check, script built and checked (env names,
//!    NUL bytes, size): any failure here sends no request.
//! 2. The command registers on its lease ([`Registry::start_command`]); a
//!    closing lease is refused with [`Error::CleanupInProgress`], an
//!    unconfirmed one with [`Error::CleanupUnconfirmed`], before any request.
//! 3. Standard input is pulled from the host's byte source on a thread of
//!    its own in [`STREAM_CHUNK`]-byte pieces, at most [`STDIN_PIECES_AHEAD`]
//!    of them ahead of the upload. An input that ends before its first byte
//!    stages nothing: the command reads `/dev/null`. Otherwise the command
//!    waits for the pacer's admission of new work ([`crate::lease::admit`]),
//!    which it holds until process creation returns, and the input is sent
//!    chunked as it is read to `/tmp/.paperclip-stdin-<uuid>` (`PUT /files`)
//!    and redirected with `<`; it never appears in the script or the
//!    process-creation request. Memory stays bounded whatever its size, and
//!    the upload (no 429 retry: it cannot be sent twice) is raced against
//!    the deadline and the cancellation like every step. There is no size
//!    limit but the sandbox's disk and the command's deadline.
//! 4. `POST /processes` runs `/bin/bash -lc SCRIPT`, never retried. A 4xx (or
//!    an input error) is a plain error; a request the pacer never sent
//!    before the deadline is a plain timeout; any other failure (5xx, connection
//!    error, timeout, malformed reply, cancellation before the process id
//!    arrived) leaves the outcome unknown: the lease is marked unconfirmed
//!    and the error is [`Error::ProcessCreationUnconfirmed`].
//! 5. The output is streamed with `GET .../connect?after=<cursor>` and
//!    decoded by [`OutputDecoder`]; the bytes of every data frame are written
//!    to the sink once, as they arrive (the result keeps the text tails). On a connection error, a premature
//!    end of the body, a 5xx or a 429 the stream reconnects from its cursor,
//!    at most [`MAX_RECONNECTS`] times per command, [`RECONNECT_DELAY`]
//!    apart. Everything is raced against the command's deadline and its
//!    cancellation token (release or shutdown).
//! 6. Exit: the result carries the exit code, or `signal` with no exit code.
//!    Timeout: `exit_code: None, timed_out: true` with the partial output.
//!    Cancellation: [`Error::Cancelled`]. Stream failure: its error. In these
//!    three cases the process tree is first terminated
//!    (`DELETE ...?grace_ms=1000`) at cleanup priority under a fresh
//!    deadline ([`CLEANUP_TIMEOUT`]), up to [`KILL_ATTEMPTS`] times unless
//!    refused with a 4xx other than 429; if
//!    termination is not confirmed the lease is marked unconfirmed and the
//!    error is [`Error::CommandCleanupUnconfirmed`].
//! 7. The staged stdin file is removed (`exec /bin/rm -f -- <path>`, errors
//!    ignored), then the command unregisters: a release waiting in
//!    [`Registry::stop_commands`] resumes only once the tree is gone (or the
//!    lease is marked unconfirmed).
//!
//! `metadata_json` is `{"processId", "outputTruncated": {"stdout",
//! "stderr"}, "reconnects"}` (`processId` is `null` when no process was
//! created: a timeout while reading or uploading stdin, waiting for
//! admission or before the creation request was sent).
//!
//! A relative `cwd` is resolved against the workspace
//! ([`REMOTE_CWD`]); an empty or missing one is the workspace.

use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use futures_util::{FutureExt, StreamExt};
use provider_abi::{ByteSink, ByteSource, ExecuteParams, ExecuteResult, OutputStream};
use serde_json::json;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::client::{CallOptions, CreateosClient, STREAM_CHUNK};
use crate::config::{ProviderConfig, MAX_TIMEOUT_MS};
use crate::error::{op, Error, ErrorKind};
use crate::lease::{Context, OwnedLease};
use crate::metadata::REMOTE_CWD;
use crate::ndjson::{DecodedOutput, ExitStatus, OutputDecoder};
use crate::pacer::Priority;
use crate::registry::Registry;
use crate::script::{self, ScriptSpec};

/// Prefix of the staged stdin file; a random UUID follows.
pub const STDIN_PATH_PREFIX: &str = "/tmp/.paperclip-stdin-";
/// Pieces of a pulled standard input read ahead of its upload.
pub const STDIN_PIECES_AHEAD: usize = 2;
/// Reconnects of the output stream per command.
pub const MAX_RECONNECTS: u32 = 3;
/// Pause before a reconnect.
pub const RECONNECT_DELAY: Duration = Duration::from_millis(250);
/// Grace the process tree gets between SIGTERM and SIGKILL.
pub const KILL_GRACE_MS: u64 = 1000;
/// Attempts to confirm a tree's termination.
pub const KILL_ATTEMPTS: u32 = 3;
/// The fresh deadline of the cleanup after a timeout, a cancellation or a
/// failure (termination, then stdin removal, each).
pub const CLEANUP_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a step stopped before its result.
#[derive(Debug)]
enum Stop {
    /// The command's deadline passed.
    Deadline,
    /// Release or shutdown cancelled the command.
    Cancelled,
    /// The step failed.
    Failed(Error),
}

/// Runs `params.command` in the lease's sandbox, its standard input pulled
/// from `stdin` and its output written to `output` as raw bytes as it
/// arrives; see the module docs.
pub async fn execute(
    ctx: &Context,
    params: &ExecuteParams,
    stdin: ByteSource,
    mut output: ByteSink,
) -> Result<ExecuteResult, Error> {
    // A source the host made empty needs no reader thread.
    let stdin = (!stdin.is_empty()).then_some(stdin);
    execute_to(ctx, params, stdin, &mut |stream, bytes| output.write(stream, bytes)).await
}

/// [`execute`], the output's bytes to `emit`; `stdin: None` reads `/dev/null`
/// (the post-upload commands of file sync keep their output only in the
/// result).
pub(crate) async fn execute_to(
    ctx: &Context,
    params: &ExecuteParams,
    stdin: Option<ByteSource>,
    emit: &mut (impl FnMut(OutputStream, &[u8]) + Send),
) -> Result<ExecuteResult, Error> {
    let lease = ctx.own_required(&params.lease)?;
    let timeout = command_timeout(params.timeout_ms.into_option(), &lease.config)?;
    let cwd = resolve_cwd(params.cwd.as_ref().into_option().map(|cwd| cwd.as_str()));
    let args: Vec<&str> = params.args.iter().map(|arg| arg.as_str()).collect();
    let env: Vec<(&str, &str)> =
        params.env.iter().map(|var| (var.name.as_str(), var.value.as_str())).collect();
    let spec =
        ScriptSpec { cwd: &cwd, command: params.command.as_str(), args: &args, env: &env, stdin_path: None };
    let plain = script::render(&spec)?;
    let client = ctx.client(&lease.config)?;
    let (cancel, guard) = ctx.registry.start_command(&lease.scope, &ctx.shutdown)?;
    let mut run = Run {
        client: &client,
        registry: &ctx.registry,
        lease: &lease,
        cancel,
        deadline: Instant::now() + timeout,
        reconnects: 0,
    };
    let result = run.run(spec, &plain, stdin, emit).await;
    // Only now, with the tree terminated (or the lease marked unconfirmed)
    // and the stdin file removed, may a waiting release go on.
    drop(guard);
    result
}

/// A piece of standard input read from the host.
type Piece = Result<Bytes, std::io::Error>;

/// Starts reading `source` on a thread of its own (a read may block on a
/// pipe or a terminal) in [`STREAM_CHUNK`]-byte pieces, at most
/// [`STDIN_PIECES_AHEAD`] ahead of the upload, and waits for the first
/// piece: `None` when the input is empty (nothing is staged, the command
/// reads `/dev/null`), else a request body streaming the input (a read error
/// fails the body, so the upload). Once the body is dropped (the upload
/// ended, failed or was cancelled) the thread stops after the read under way
/// and drops the source.
async fn pull(mut source: ByteSource) -> Result<Option<reqwest::Body>, Error> {
    let (sender, mut receiver) = tokio::sync::mpsc::channel::<Piece>(STDIN_PIECES_AHEAD);
    let reader = move || {
        let mut buffer = vec![0; STREAM_CHUNK];
        loop {
            let piece = match source.read(&mut buffer) {
                Ok(0) => return,
                Ok(read) => Ok(Bytes::copy_from_slice(&buffer[..read])),
                Err(error) => Err(std::io::Error::other(error.message.to_string())),
            };
            let failed = piece.is_err();
            if sender.blocking_send(piece).is_err() || failed {
                return;
            }
        }
    };
    std::thread::Builder::new().name("createos-stdin".into()).spawn(reader).map_err(|_| {
        Error::internal("The CreateOS provider cannot start a thread to read the command's standard input.")
    })?;
    let first = match receiver.recv().await {
        None => return Ok(None),
        Some(piece) => piece.map_err(|error| Error::internal(error.to_string()))?,
    };
    let rest = futures_util::stream::unfold(receiver, |mut receiver| async move {
        receiver.recv().await.map(|piece| (piece, receiver))
    });
    Ok(Some(reqwest::Body::wrap_stream(futures_util::stream::iter([Ok(first)]).chain(rest))))
}

/// The command's timeout: the call's, else the configuration's.
fn command_timeout(requested: Option<u64>, config: &ProviderConfig) -> Result<Duration, Error> {
    let ms = requested.unwrap_or(config.timeout_ms);
    if !(1..=MAX_TIMEOUT_MS).contains(&ms) {
        return Err(Error::invalid_input(format!(
            "CreateOS command timeoutMs must be between 1 and {MAX_TIMEOUT_MS}."
        )));
    }
    Ok(Duration::from_millis(ms))
}

/// The working directory: the workspace when missing or empty; a relative
/// path is taken inside the workspace.
fn resolve_cwd(cwd: Option<&str>) -> String {
    match cwd {
        None | Some("") => REMOTE_CWD.to_string(),
        Some(cwd) if cwd.starts_with('/') => cwd.to_string(),
        Some(cwd) => format!("{REMOTE_CWD}/{cwd}"),
    }
}

/// A 4xx or an input error: the request was refused (or never sent), so
/// nothing happened.
fn is_refusal(error: &Error) -> bool {
    error.http_status().is_some_and(|status| (400..500).contains(&status))
        || error.kind() == ErrorKind::INVALID_INPUT
}

/// Failures after which the output stream reconnects.
fn is_reconnectable(error: &Error) -> bool {
    error.is_transient() || error.kind() == ErrorKind::TIMEOUT
}

struct Run<'a> {
    client: &'a CreateosClient,
    registry: &'a Registry,
    lease: &'a OwnedLease,
    cancel: CancellationToken,
    deadline: Instant,
    reconnects: u32,
}

impl Run<'_> {
    fn sandbox(&self) -> &str {
        &self.lease.sandbox_id
    }

    fn options(&self, priority: Priority) -> CallOptions {
        CallOptions::new(self.deadline, priority)
    }

    /// Runs `step` until it ends, the deadline passes or the command is
    /// cancelled (cancellation wins ties). A client timeout at the deadline
    /// counts as the deadline.
    async fn race<T>(&self, step: impl Future<Output = Result<T, Error>>) -> Result<T, Stop> {
        tokio::select! {
            biased;
            _ = self.cancel.cancelled() => Err(Stop::Cancelled),
            _ = tokio::time::sleep_until(self.deadline) => Err(Stop::Deadline),
            result = step => result.map_err(|error| {
                if error.kind() == ErrorKind::TIMEOUT && Instant::now() >= self.deadline {
                    Stop::Deadline
                } else {
                    Stop::Failed(error)
                }
            }),
        }
    }

    /// Runs the command of `spec`, whose `plain` script reads `/dev/null`,
    /// its input staged first when `stdin` proves non-empty.
    async fn run(
        &mut self,
        spec: ScriptSpec<'_>,
        plain: &str,
        stdin: Option<ByteSource>,
        emit: &mut (impl FnMut(OutputStream, &[u8]) + Send),
    ) -> Result<ExecuteResult, Error> {
        if self.cancel.is_cancelled() {
            return Err(Error::Cancelled);
        }
        if let Some(source) = stdin {
            match self.race(pull(source)).await {
                Ok(None) => {}
                Ok(Some(body)) => {
                    // Only now, with input to stage, may the script's longer
                    // redirection make it too long.
                    let path = format!("{STDIN_PATH_PREFIX}{}", uuid::Uuid::new_v4());
                    let script = script::render(&ScriptSpec { stdin_path: Some(&path), ..spec })?;
                    let result = self.run_staged(&script, Some((body, &path)), emit).await;
                    self.client.remove_file(self.sandbox(), &path, "stdin", CLEANUP_TIMEOUT).await;
                    return result;
                }
                Err(stop) => return self.stopped(stop, None, OutputDecoder::new().finish()),
            }
        }
        self.run_staged(plain, None, emit).await
    }

    async fn run_staged(
        &mut self,
        script: &str,
        stdin: Option<(reqwest::Body, &str)>,
        emit: &mut (impl FnMut(OutputStream, &[u8]) + Send),
    ) -> Result<ExecuteResult, Error> {
        // New work waits for admission, so it never piles up in front of
        // work already in flight; it holds it until process creation returns.
        let staged = async {
            let admission = crate::lease::admit(self.client, &self.lease.config).await?;
            if let Some((body, path)) = stdin {
                let options = self.options(Priority::InFlight);
                self.client.put_file_stream(self.sandbox(), path, body, options).await?;
            }
            Ok(admission)
        };
        let admission = match self.race(staged).await {
            Ok(admission) => admission,
            Err(stop) => return self.stopped(stop, None, OutputDecoder::new().finish()),
        };

        // From here on, a future dropped before its cleanup leaves a process
        // nobody will terminate: the lease is then marked unconfirmed.
        let (registry, lease) = (self.registry, self.lease);
        let abandoned = scopeguard::guard((), |()| registry.mark_unconfirmed(&lease.scope));
        let result = self.create_and_stream(script, admission, emit).await;
        scopeguard::ScopeGuard::into_inner(abandoned);
        result
    }

    /// Creates the process. Not raced against the deadline: the client
    /// bounds the call by the same deadline and tells a request that was
    /// never sent (its deadline passed in the pacer queue: a plain timeout)
    /// from one whose outcome is unknown. A cancellation does not abandon the
    /// request: its reply is awaited (under the cleanup deadline) so that a
    /// process it started can be terminated rather than left unconfirmed.
    /// Returns the outcome and whether the command was cancelled meanwhile.
    async fn create_process(&self, script: &str) -> (Result<String, Error>, bool) {
        let create = self.client.create_process(self.sandbox(), script, self.options(Priority::InFlight));
        tokio::pin!(create);
        tokio::select! {
            biased;
            _ = self.cancel.cancelled() => {
                let created = tokio::time::timeout(CLEANUP_TIMEOUT, &mut create)
                    .await
                    .unwrap_or_else(|_| Err(Error::Timeout(op::PROCESS_CREATION)));
                (created, true)
            }
            created = &mut create => (created, false),
        }
    }

    async fn create_and_stream(
        &mut self,
        script: &str,
        admission: impl Sized,
        emit: &mut (impl FnMut(OutputStream, &[u8]) + Send),
    ) -> Result<ExecuteResult, Error> {
        let (created, cancelled) = self.create_process(script).await;
        drop(admission);
        let pid = match created {
            Ok(pid) => pid,
            Err(error) if cancelled && (error.is_not_sent() || is_refusal(&error)) => {
                return Err(Error::Cancelled)
            }
            Err(error) if error.is_not_sent() => {
                return Ok(self.result(None, None, true, OutputDecoder::new().finish()));
            }
            Err(error) if is_refusal(&error) || error.is_unreachable() => return Err(error),
            Err(error) => {
                tracing::warn!(sandbox = %self.sandbox(), reason = error.operation().unwrap_or("error"), "CreateOS process creation outcome unknown");
                self.registry.mark_unconfirmed(&self.lease.scope);
                return Err(Error::ProcessCreationUnconfirmed);
            }
        };
        if cancelled {
            self.terminate(&pid).await?;
            return Err(Error::Cancelled);
        }

        let mut decoder = OutputDecoder::new();
        let streamed = self.stream(&pid, &mut decoder, emit).await;
        let stop = match streamed {
            Ok(exit) => return Ok(self.result(Some(&pid), Some(exit), false, decoder.finish())),
            Err(stop) => stop,
        };
        self.terminate(&pid).await?;
        self.stopped(stop, Some(&pid), decoder.finish())
    }

    /// What a command that stopped before its exit returns: at the deadline,
    /// a timed-out result with the output so far; else the error.
    fn stopped(&self, stop: Stop, pid: Option<&str>, output: DecodedOutput) -> Result<ExecuteResult, Error> {
        match stop {
            Stop::Deadline => Ok(self.result(pid, None, true, output)),
            Stop::Cancelled => Err(Error::Cancelled),
            Stop::Failed(error) => Err(error),
        }
    }

    /// Streams the output until the exit frame, reconnecting per the module
    /// docs.
    async fn stream(
        &mut self,
        pid: &str,
        decoder: &mut OutputDecoder,
        emit: &mut (impl FnMut(OutputStream, &[u8]) + Send),
    ) -> Result<ExitStatus, Stop> {
        loop {
            let attempt = async {
                let options = self.options(Priority::InFlight);
                let mut body = self.client.connect(self.sandbox(), pid, decoder.cursor(), options).await?;
                decoder.reconnect();
                while let Some(chunk) = body.next().await {
                    if let Some(exit) = decoder.feed(&chunk?, emit)? {
                        return Ok(exit);
                    }
                }
                // The body ended without an exit frame: a cut connection.
                Err(Error::Connection(op::OUTPUT_CONNECTION))
            };
            match self.race(attempt).await {
                Ok(exit) => return Ok(exit),
                Err(Stop::Failed(error)) if is_reconnectable(&error) && self.reconnects < MAX_RECONNECTS => {
                    self.reconnects += 1;
                    tracing::debug!(
                        sandbox = %self.sandbox(),
                        cursor = decoder.cursor(),
                        reconnects = self.reconnects,
                        "CreateOS output stream reconnects"
                    );
                    self.race(tokio::time::sleep(RECONNECT_DELAY).map(Ok)).await?;
                }
                Err(stop) => return Err(stop),
            }
        }
    }

    /// Terminates the process tree under a fresh deadline: `Ok` when
    /// CreateOS confirmed the whole tree is gone, else the lease is marked
    /// unconfirmed and the error says so.
    async fn terminate(&self, pid: &str) -> Result<(), Error> {
        let deadline = Instant::now() + CLEANUP_TIMEOUT;
        for attempt in 1..=KILL_ATTEMPTS {
            let options = CallOptions::new(deadline, Priority::Cleanup);
            match self.client.kill_process(self.sandbox(), pid, KILL_GRACE_MS, options).await {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                // A refusal will not change; anything else (5xx, a lost or
                // malformed reply, a timeout) may: DELETE is idempotent.
                Err(error) if is_refusal(&error) && error.http_status() != Some(429) => break,
                Err(_) => {}
            }
            if attempt == KILL_ATTEMPTS || Instant::now() + RECONNECT_DELAY >= deadline {
                break;
            }
            tokio::time::sleep(RECONNECT_DELAY).await;
        }
        self.registry.mark_unconfirmed(&self.lease.scope);
        Err(Error::CommandCleanupUnconfirmed)
    }

    fn result(
        &self,
        pid: Option<&str>,
        exit: Option<ExitStatus>,
        timed_out: bool,
        output: DecodedOutput,
    ) -> ExecuteResult {
        let (exit_code, signal) = match exit {
            Some(ExitStatus::Code(code)) => (Some(code), None),
            Some(ExitStatus::Signal(name)) => (None, Some(name.into())),
            None => (None, None),
        };
        let metadata = json!({
            "processId": pid,
            "outputTruncated": {"stdout": output.stdout_truncated, "stderr": output.stderr_truncated},
            "reconnects": self.reconnects,
        });
        ExecuteResult {
            exit_code: exit_code.into(),
            signal: signal.into(),
            timed_out,
            stdout: output.stdout.into(),
            stderr: output.stderr.into(),
            metadata_json: metadata.to_string().into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::build_http_client;
    use crate::metadata::LeaseMetadata;
    use crate::registry::Registry;
    use axum::body::Body;
    use axum::extract::{Request, State};
    use axum::response::Response;
    use base64::Engine as _;
    use provider_abi::{EnvVar, EnvironmentParams, LeaseParams};
    use serde_json::Value;
    use std::collections::VecDeque;
    use std::sync::{Arc, Mutex};

    const KEY: &str = "test-key-execute";

    enum Reply {
        Json(Value),
        Status(u16),
        Hang,
    }

    enum Stream {
        Status(u16),
        /// Chunks, then the end of the body (`false`) or a hang (`true`).
        Body(Vec<String>, bool),
    }

    #[derive(Debug, Clone)]
    struct Seen {
        method: String,
        uri: String,
        body: Vec<u8>,
    }

    #[derive(Default)]
    struct MockState {
        create: VecDeque<Reply>,
        connect: VecDeque<Stream>,
        kill: VecDeque<Reply>,
        seen: Vec<Seen>,
    }

    #[derive(Clone, Default)]
    struct Mock(Arc<Mutex<MockState>>);

    impl Mock {
        fn create(&self, reply: Reply) {
            self.0.lock().unwrap().create.push_back(reply);
        }
        fn connect(&self, reply: Stream) {
            self.0.lock().unwrap().connect.push_back(reply);
        }
        fn kill(&self, reply: Reply) {
            self.0.lock().unwrap().kill.push_back(reply);
        }
        fn seen(&self) -> Vec<Seen> {
            self.0.lock().unwrap().seen.clone()
        }
        fn count(&self, method: &str, part: &str) -> usize {
            self.seen().iter().filter(|s| s.method == method && s.uri.contains(part)).count()
        }
    }

    fn envelope(data: Value) -> Response {
        let body = json!({"status": "success", "data": data}).to_string();
        Response::builder()
            .status(200)
            .header("content-type", "application/json")
            .body(Body::from(body))
            .unwrap()
    }

    fn status(code: u16) -> Response {
        Response::builder().status(code).body(Body::empty()).unwrap()
    }

    async fn reply(reply: Option<Reply>, default: Value) -> Response {
        match reply {
            None => envelope(default),
            Some(Reply::Json(data)) => envelope(data),
            Some(Reply::Status(code)) => status(code),
            Some(Reply::Hang) => std::future::pending().await,
        }
    }

    async fn handler(State(mock): State<Mock>, req: Request) -> Response {
        let (parts, body) = req.into_parts();
        let body = axum::body::to_bytes(body, usize::MAX).await.unwrap().to_vec();
        let method = parts.method.to_string();
        let uri = parts.uri.to_string();
        assert_eq!(parts.headers.get("x-api-key").unwrap(), KEY);
        mock.0.lock().unwrap().seen.push(Seen { method: method.clone(), uri: uri.clone(), body });
        let path = parts.uri.path().to_string();
        match method.as_str() {
            "PUT" if path.ends_with("/files") => {
                if mock.0.lock().unwrap().seen.last().is_some_and(|s| s.body == b"hang") {
                    std::future::pending::<()>().await;
                }
                status(200)
            }
            "POST" if path.ends_with("/exec") => {
                envelope(json!({"result": {"exit_code": 0, "stdout": "", "stderr": ""}}))
            }
            "POST" if path.ends_with("/processes") => {
                let next = mock.0.lock().unwrap().create.pop_front();
                reply(next, json!({"process_id": "proc-1"})).await
            }
            "DELETE" => {
                let next = mock.0.lock().unwrap().kill.pop_front();
                reply(next, json!({"tree_exited": true})).await
            }
            "GET" if path.ends_with("/connect") => {
                let next = mock.0.lock().unwrap().connect.pop_front();
                match next {
                    None => status(599),
                    Some(Stream::Status(code)) => status(code),
                    Some(Stream::Body(chunks, hang)) => {
                        let chunks = futures_util::stream::iter(
                            chunks.into_iter().map(|c| Ok::<_, std::io::Error>(Bytes::from(c))),
                        );
                        let body = if hang {
                            Body::from_stream(chunks.chain(futures_util::stream::pending()))
                        } else {
                            Body::from_stream(chunks)
                        };
                        Response::builder().status(200).body(body).unwrap()
                    }
                }
            }
            _ => status(404),
        }
    }

    struct Fixture {
        mock: Mock,
        ctx: Context,
        params: ExecuteParams,
        /// The command's standard input; `None`: an empty source.
        stdin: Option<Vec<u8>>,
    }

    async fn fixture() -> Fixture {
        let mock = Mock::default();
        let app = axum::Router::new().fallback(handler).with_state(mock.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        let config = json!({
            "apiUrl": format!("http://{addr}"), "apiKey": KEY, "shape": "s-1vcpu-1gb",
            "requestsPerMinute": 100000, "timeoutMs": 10000,
        });
        let env = EnvironmentParams {
            driver_key: "createos".into(),
            company_id: "company".into(),
            environment_id: "environment".into(),
            config_json: config.to_string().into(),
            ..Default::default()
        };
        let parsed = crate::lease::parse_config(&env).unwrap();
        let metadata = LeaseMetadata::new(&env, &parsed).bind("sbx-1", &parsed);
        let params = ExecuteParams {
            lease: LeaseParams {
                env,
                run_id: "run".into(),
                provider_lease_id: Some("sbx-1".into()).into(),
                metadata_json: metadata.to_json().into(),
            },
            command: "echo".into(),
            args: vec!["hi".into()].into(),
            ..Default::default()
        };
        let ctx = Context {
            http: build_http_client().unwrap(),
            registry: Registry::default(),
            shutdown: CancellationToken::new(),
        };
        Fixture { mock, ctx, params, stdin: None }
    }

    fn data(seq: u64, stream: &str, bytes: &[u8]) -> String {
        let encoded = base64::engine::general_purpose::STANDARD.encode(bytes);
        json!({"type": "data", "seq": seq, "stream": stream, "data_base64": encoded}).to_string() + "\n"
    }

    fn exit_code(code: i32) -> String {
        json!({"type": "exit", "exit_code": code}).to_string() + "\n"
    }

    /// The chunks the sink received, in order.
    type Written = Vec<(OutputStream, Vec<u8>)>;

    /// Runs `f`'s command with its input pulled from `stdin`.
    async fn run_with(f: &Fixture, stdin: ByteSource) -> (Result<ExecuteResult, Error>, Written) {
        let written = Arc::new(Mutex::new(Vec::new()));
        let kept = Arc::clone(&written);
        let sink =
            ByteSink::new(move |stream, chunk: &[u8]| kept.lock().unwrap().push((stream, chunk.to_vec())));
        let result = execute(&f.ctx, &f.params, stdin, sink).await;
        let written = written.lock().unwrap().clone();
        (result, written)
    }

    /// Runs `f`'s command with `f.stdin` as its input.
    async fn run(f: &Fixture) -> (Result<ExecuteResult, Error>, Written) {
        let stdin = f.stdin.clone().map_or_else(ByteSource::empty, ByteSource::from_bytes);
        run_with(f, stdin).await
    }

    /// The bytes written to `stream`.
    fn bytes(written: &Written, stream: OutputStream) -> Vec<u8> {
        written.iter().filter(|(s, _)| *s == stream).flat_map(|(_, b)| b.iter().copied()).collect()
    }

    fn metadata(result: &ExecuteResult) -> Value {
        serde_json::from_str(&result.metadata_json).unwrap()
    }

    fn scope(f: &Fixture) -> crate::registry::LeaseScope {
        f.ctx.own_required(&f.params.lease).unwrap().scope
    }

    #[tokio::test]
    async fn runs_a_command_with_stdin_env_and_split_characters() {
        let mut f = fixture().await;
        f.stdin = Some(b"secret-stdin\x00bytes".to_vec());
        f.params.env = vec![EnvVar { name: "K".into(), value: "it's".into() }].into();
        f.params.cwd = Some("sub dir".into()).into();
        let euro = "€".as_bytes();
        f.mock.connect(Stream::Body(
            vec![
                data(1, "stdout", &euro[..1]) + "{\"type\":\"heartbeat\"}\n",
                data(2, "stdout", &euro[1..]) + &data(3, "stderr", b"warn")[..10],
                data(3, "stderr", b"warn")[10..].to_string() + &exit_code(0),
            ],
            false,
        ));
        let (result, written) = run(&f).await;
        let result = result.unwrap();
        assert_eq!(result.exit_code.into_option(), Some(0));
        assert!(result.signal.is_none() && !result.timed_out);
        assert_eq!(result.stdout.as_str(), "€");
        assert_eq!(result.stderr.as_str(), "warn");
        assert_eq!(bytes(&written, OutputStream::Stdout), euro, "raw bytes, a character split across frames");
        assert_eq!(written.len(), 3, "one write per data frame");
        assert_eq!(bytes(&written, OutputStream::Stderr), b"warn");
        assert_eq!(
            metadata(&result),
            json!({"processId": "proc-1", "outputTruncated": {"stdout": false, "stderr": false}, "reconnects": 0})
        );

        let seen = f.mock.seen();
        let methods: Vec<&str> = seen.iter().map(|s| s.method.as_str()).collect();
        assert_eq!(methods, ["PUT", "POST", "GET", "POST"]);
        let path = seen[0].uri.split("path=").nth(1).unwrap().replace("%2F", "/");
        assert!(path.starts_with(STDIN_PATH_PREFIX), "{path}");
        assert_eq!(seen[0].body, b"secret-stdin\x00bytes");
        let create: Value = serde_json::from_slice(&seen[1].body).unwrap();
        assert_eq!(create["cmd"], "/bin/bash");
        assert_eq!(create["args"][0], "-lc");
        assert!(create.get("env").is_none());
        let script = create["args"][1].as_str().unwrap();
        assert_eq!(
            script,
            format!(
                "cd -- '/paperclip-workspace/sub dir' || exit\nexec env -- 'K=it'\"'\"'s' 'echo' 'hi' < '{path}'"
            )
        );
        assert!(!seen[1].body.windows(6).any(|w| w == b"secret"));
        assert_eq!(seen[2].uri, "/v1/sandboxes/sbx-1/processes/proc-1/connect?after=0");
        assert_eq!(seen[3].uri, "/v1/sandboxes/sbx-1/exec");
        let rm: Value = serde_json::from_slice(&seen[3].body).unwrap();
        assert_eq!(rm, json!({"cmd": "/bin/rm", "args": ["-f", "--", path]}));
        assert_eq!(f.ctx.registry.active_commands(), 0);
    }

    #[tokio::test]
    async fn reconnects_from_the_cursor_and_writes_each_chunk_once() {
        let f = fixture().await;
        f.mock.connect(Stream::Status(503));
        f.mock
            .connect(Stream::Body(vec![data(1, "stdout", b"a") + &data(2, "stdout", b"b") + "{\"ty"], false));
        f.mock.connect(Stream::Status(429));
        f.mock.connect(Stream::Body(
            vec![
                data(1, "stdout", b"a") + &data(2, "stdout", b"b") + &data(3, "stdout", b"c") + &exit_code(4),
            ],
            false,
        ));
        let (result, written) = run(&f).await;
        let result = result.unwrap();
        assert_eq!(result.exit_code.into_option(), Some(4));
        assert_eq!(bytes(&written, OutputStream::Stdout), b"abc");
        // "ab" arrived in one chunk and went out in one write; the replay
        // wrote nothing again.
        assert_eq!(written.len(), 2);
        assert_eq!(metadata(&result)["reconnects"], 3);
        let afters: Vec<String> = f
            .mock
            .seen()
            .iter()
            .filter(|s| s.uri.contains("/connect"))
            .map(|s| s.uri.split("after=").nth(1).unwrap().to_string())
            .collect();
        assert_eq!(afters, ["0", "0", "2", "2"]);
        assert_eq!(f.mock.count("DELETE", ""), 0);
    }

    #[tokio::test]
    async fn gives_up_after_three_reconnects_and_terminates_the_tree() {
        let f = fixture().await;
        for _ in 0..4 {
            f.mock.connect(Stream::Status(502));
        }
        let (result, _) = run(&f).await;
        assert_eq!(result.unwrap_err(), Error::Api(op::OUTPUT_CONNECTION, 502));
        assert_eq!(f.mock.count("GET", "/connect"), 4);
        let deletes: Vec<Seen> = f.mock.seen().into_iter().filter(|s| s.method == "DELETE").collect();
        assert_eq!(deletes.len(), 1);
        assert_eq!(deletes[0].uri, "/v1/sandboxes/sbx-1/processes/proc-1?grace_ms=1000");
        assert!(!f.ctx.registry.is_unconfirmed(&scope(&f)));
    }

    #[tokio::test]
    async fn stream_errors_are_not_retried() {
        let cases = [
            (Stream::Status(410), Error::Api(op::OUTPUT_CONNECTION, 410)),
            (Stream::Status(404), Error::Api(op::OUTPUT_CONNECTION, 404)),
            (
                Stream::Body(vec!["{\"type\":\"nope\"}\n".into()], true),
                Error::Protocol(op::OUTPUT_CONNECTION),
            ),
            (Stream::Body(vec![data(2, "stdout", b"gap")], true), Error::Protocol(op::OUTPUT_CONNECTION)),
            (
                Stream::Body(vec!["{\"type\":\"error\",\"error\":\"output_offset_expired\"}\n".into()], true),
                Error::OutputEvicted,
            ),
        ];
        for (stream, expected) in cases {
            let f = fixture().await;
            f.mock.connect(stream);
            let (result, _) = run(&f).await;
            assert_eq!(result.unwrap_err(), expected);
            assert_eq!(f.mock.count("GET", "/connect"), 1);
            assert_eq!(f.mock.count("DELETE", ""), 1, "{expected}");
        }
    }

    #[tokio::test]
    async fn timeout_returns_partial_output_after_terminating_the_tree() {
        let mut f = fixture().await;
        f.params.timeout_ms = Some(400).into();
        f.mock.connect(Stream::Body(
            vec![data(1, "stdout", b"partial ") + &data(2, "stdout", &[0xe2, 0x82])],
            true,
        ));
        let started = Instant::now();
        let (result, written) = run(&f).await;
        let result = result.unwrap();
        assert!(started.elapsed() >= Duration::from_millis(400));
        assert!(result.timed_out);
        assert!(result.exit_code.is_none() && result.signal.is_none());
        assert_eq!(result.stdout.as_str(), "partial \u{FFFD}");
        assert_eq!(bytes(&written, OutputStream::Stdout), b"partial \xe2\x82", "the bytes as written");
        assert_eq!(f.mock.count("DELETE", "grace_ms=1000"), 1);
        assert_eq!(f.ctx.registry.active_commands(), 0);
    }

    #[tokio::test]
    async fn unconfirmed_termination_marks_the_lease() {
        let mut f = fixture().await;
        f.params.timeout_ms = Some(200).into();
        f.mock.connect(Stream::Body(vec![], true));
        f.mock.kill(Reply::Json(json!({"tree_exited": false})));
        f.mock.kill(Reply::Status(503));
        f.mock.kill(Reply::Json(json!({})));
        let (result, _) = run(&f).await;
        let err = result.unwrap_err();
        assert_eq!(err, Error::CommandCleanupUnconfirmed);
        assert_eq!(err.kind(), ErrorKind::CLEANUP_UNCONFIRMED);
        assert_eq!(err.to_string(), "CreateOS command cleanup failed; process termination is unconfirmed.");
        assert_eq!(f.mock.count("DELETE", ""), 3);
        assert!(f.ctx.registry.is_unconfirmed(&scope(&f)));

        // The lease now refuses commands, before any request.
        let before = f.mock.seen().len();
        let (result, _) = run(&f).await;
        assert_eq!(result.unwrap_err(), Error::CleanupUnconfirmed);
        assert_eq!(f.mock.seen().len(), before);
    }

    #[tokio::test]
    async fn a_transient_kill_failure_is_retried() {
        let mut f = fixture().await;
        f.params.timeout_ms = Some(200).into();
        f.mock.connect(Stream::Body(vec![], true));
        f.mock.kill(Reply::Status(500));
        let (result, _) = run(&f).await;
        assert!(result.unwrap().timed_out);
        assert_eq!(f.mock.count("DELETE", ""), 2);
        assert!(!f.ctx.registry.is_unconfirmed(&scope(&f)));

        // A refusal is final.
        let mut f = fixture().await;
        f.params.timeout_ms = Some(200).into();
        f.mock.connect(Stream::Body(vec![], true));
        f.mock.kill(Reply::Status(403));
        let (result, _) = run(&f).await;
        assert_eq!(result.unwrap_err(), Error::CommandCleanupUnconfirmed);
        assert_eq!(f.mock.count("DELETE", ""), 1);
        assert!(f.ctx.registry.is_unconfirmed(&scope(&f)));
    }

    #[tokio::test]
    async fn release_cancels_and_waits_for_the_tree() {
        let mut f = fixture().await;
        f.stdin = Some(b"x".to_vec());
        f.mock.connect(Stream::Body(vec![data(1, "stderr", b"working")], true));
        let scope = scope(&f);
        let release = async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            f.ctx.registry.stop_commands(&scope).await;
            // The tree is gone and stdin removed before release goes on.
            (f.mock.count("DELETE", ""), f.mock.count("POST", "/exec"))
        };
        let ((result, written), (deletes, removals)) = tokio::join!(run(&f), release);
        assert_eq!(result.unwrap_err(), Error::Cancelled);
        assert_eq!(Error::Cancelled.to_string(), "CreateOS command was cancelled.");
        assert_eq!(bytes(&written, OutputStream::Stderr), b"working");
        assert_eq!((deletes, removals), (1, 1));
        assert!(!f.ctx.registry.is_unconfirmed(&scope));
    }

    #[tokio::test]
    async fn a_dropped_command_leaves_its_lease_unconfirmed() {
        let f = fixture().await;
        f.mock.connect(Stream::Body(vec![], true));
        let dropped = tokio::time::timeout(Duration::from_millis(300), run(&f)).await;
        assert!(dropped.is_err());
        assert!(f.ctx.registry.is_unconfirmed(&scope(&f)));
        assert_eq!(f.ctx.registry.active_commands(), 0);
    }

    #[tokio::test]
    async fn shutdown_before_start_sends_nothing() {
        let f = fixture().await;
        f.ctx.shutdown.cancel();
        let (result, _) = run(&f).await;
        assert_eq!(result.unwrap_err(), Error::Cancelled);
        assert!(f.mock.seen().is_empty());
    }

    #[tokio::test]
    async fn signals_end_without_an_exit_code() {
        let f = fixture().await;
        f.mock.connect(Stream::Body(vec!["{\"type\":\"exit\",\"signal\":\"SIGKILL\"}\n".into()], false));
        let (result, _) = run(&f).await;
        let result = result.unwrap();
        assert!(result.exit_code.is_none());
        assert_eq!(result.signal.into_option().unwrap().as_str(), "SIGKILL");
        assert!(!result.timed_out);
    }

    #[tokio::test]
    async fn creation_with_an_unknown_outcome_marks_the_lease() {
        for reply in [Reply::Status(500), Reply::Json(json!({"process_id": "../x"})), Reply::Hang] {
            let mut f = fixture().await;
            f.params.timeout_ms = Some(300).into();
            f.mock.create(reply);
            let (result, _) = run(&f).await;
            let err = result.unwrap_err();
            assert_eq!(err.kind(), ErrorKind::CREATION_UNCONFIRMED);
            assert_eq!(
                err.to_string(),
                "CreateOS process creation could not be confirmed; destroy the lease before reusing it."
            );
            assert!(f.ctx.registry.is_unconfirmed(&scope(&f)));
            assert_eq!(f.mock.count("POST", "/processes"), 1, "never retried");
            assert_eq!(f.mock.count("GET", ""), 0);
        }
        // A refusal is a plain error.
        for code in [400, 429] {
            let f = fixture().await;
            f.mock.create(Reply::Status(code));
            let (result, _) = run(&f).await;
            assert_eq!(result.unwrap_err(), Error::Api(op::PROCESS_CREATION, code));
            assert!(!f.ctx.registry.is_unconfirmed(&scope(&f)));
            assert_eq!(f.mock.count("POST", "/processes"), 1);
        }
    }

    #[tokio::test]
    async fn a_timeout_while_staging_stdin_creates_nothing() {
        let mut f = fixture().await;
        f.stdin = Some(b"hang".to_vec());
        f.params.timeout_ms = Some(300).into();
        let (result, _) = run(&f).await;
        let result = result.unwrap();
        assert!(result.timed_out);
        assert_eq!(metadata(&result)["processId"], Value::Null);
        assert_eq!(f.mock.count("POST", "/processes"), 0);
        // The file that may have been written is removed.
        assert_eq!(f.mock.count("POST", "/exec"), 1);
        assert!(!f.ctx.registry.is_unconfirmed(&scope(&f)));
    }

    #[tokio::test]
    async fn a_pulled_stdin_is_uploaded_whole_in_pieces() {
        let f = fixture().await;
        f.mock.connect(Stream::Body(vec![exit_code(0)], false));
        let input: Vec<u8> = (0..STREAM_CHUNK as u32 * 3 + 17).map(|i| (i % 253) as u8).collect();
        let (result, _) = run_with(&f, ByteSource::from_reader(std::io::Cursor::new(input.clone()))).await;
        assert_eq!(result.unwrap().exit_code.into_option(), Some(0));
        let seen = f.mock.seen();
        assert_eq!(seen[0].method, "PUT");
        assert!(seen[0].body == input, "the staged file holds every byte, in order");
    }

    #[tokio::test]
    async fn an_empty_stdin_stages_nothing_and_the_command_reads_dev_null() {
        let f = fixture().await;
        f.mock.connect(Stream::Body(vec![exit_code(0)], false));
        let (result, _) = run(&f).await;
        assert_eq!(result.unwrap().exit_code.into_option(), Some(0));
        let seen = f.mock.seen();
        let methods: Vec<&str> = seen.iter().map(|s| s.method.as_str()).collect();
        assert_eq!(methods, ["POST", "GET"], "no upload, no removal");
        let create: Value = serde_json::from_slice(&seen[0].body).unwrap();
        assert_eq!(
            create["args"][1],
            "cd -- '/paperclip-workspace' || exit\nexec env -- 'echo' 'hi' < '/dev/null'"
        );
    }

    #[tokio::test]
    async fn a_stdin_that_fails_before_its_first_byte_sends_nothing() {
        let f = fixture().await;
        let failing = ByteSource::new(|_: &mut [u8]| Err(provider_abi::ProviderError::internal("no input")));
        let (result, _) = run_with(&f, failing).await;
        assert_eq!(result.unwrap_err().to_string(), "no input");
        assert!(f.mock.seen().is_empty());
        assert_eq!(f.ctx.registry.active_commands(), 0);
    }

    /// Drops set `dropped` when the source that owns it is dropped.
    struct SetOnDrop(std::sync::Arc<std::sync::atomic::AtomicBool>);

    impl Drop for SetOnDrop {
        fn drop(&mut self) {
            self.0.store(true, std::sync::atomic::Ordering::SeqCst);
        }
    }

    #[tokio::test]
    async fn a_timeout_while_an_endless_stdin_is_sent_creates_nothing_and_lets_go_of_the_source() {
        let mut f = fixture().await;
        f.params.timeout_ms = Some(300).into();
        let dropped = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let guard = SetOnDrop(std::sync::Arc::clone(&dropped));
        let endless = ByteSource::new(move |buffer: &mut [u8]| {
            let _owned = &guard;
            std::thread::sleep(Duration::from_millis(2));
            buffer.fill(0);
            Ok(buffer.len())
        });
        let (result, _) = run_with(&f, endless).await;
        let result = result.unwrap();
        assert!(result.timed_out);
        assert_eq!(f.mock.count("POST", "/processes"), 0);
        for _ in 0..500 {
            if dropped.load(std::sync::atomic::Ordering::SeqCst) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(
            dropped.load(std::sync::atomic::Ordering::SeqCst),
            "the reader stopped and dropped the source"
        );
    }

    #[tokio::test]
    async fn invalid_input_and_refusals_send_nothing() {
        let mut f = fixture().await;
        f.params.env = vec![EnvVar { name: "BAD-NAME".into(), value: "v".into() }].into();
        let (result, _) = run(&f).await;
        assert_eq!(result.unwrap_err().kind(), ErrorKind::INVALID_INPUT);

        let mut f = fixture().await;
        f.params.timeout_ms = Some(0).into();
        let (result, _) = run(&f).await;
        assert_eq!(result.unwrap_err().kind(), ErrorKind::INVALID_INPUT);

        let mut f = fixture().await;
        f.params.lease.env.company_id = "someone-else".into();
        let (result, _) = run(&f).await;
        assert_eq!(result.unwrap_err().kind(), ErrorKind::NOT_THIS_ENVIRONMENT);
        assert!(f.mock.seen().is_empty());

        let f = fixture().await;
        let _closing = f.ctx.registry.begin_closing(&scope(&f)).unwrap();
        let (result, _) = run(&f).await;
        assert_eq!(result.unwrap_err(), Error::CleanupInProgress);
        assert!(f.mock.seen().is_empty());
    }

    #[test]
    fn working_directories() {
        assert_eq!(resolve_cwd(None), REMOTE_CWD);
        assert_eq!(resolve_cwd(Some("")), REMOTE_CWD);
        assert_eq!(resolve_cwd(Some("/srv")), "/srv");
        assert_eq!(resolve_cwd(Some("a/b")), "/paperclip-workspace/a/b");
    }

    #[test]
    fn new_error_messages() {
        assert_eq!(Error::CommandCleanupUnconfirmed.operation(), Some(op::PROCESS_CLEANUP));
        assert_eq!(Error::OutputEvicted.kind(), ErrorKind::API);
        assert_eq!(Error::OutputStreamError.operation(), Some(op::OUTPUT_CONNECTION));
    }
}
