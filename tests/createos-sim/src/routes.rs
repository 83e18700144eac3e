//! HTTP surface: `/v1` routes, the auth / rate-limit / fault middleware and
//! the JSON envelope.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, Path, Query, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Router};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::faults::FaultKind;
use crate::process::{ManagedProcess, ReadResult, SpawnError};
use crate::server::{cleanup, ConnCtx, Shared, TransitionOutcome};
use crate::state::{Sandbox, SandboxStatus, Transition};

/// Faults that fired for this request, for handlers that act on them.
#[derive(Clone, Default)]
pub(crate) struct Fired(pub Vec<FaultKind>);

impl Fired {
    fn has(&self, k: FaultKind) -> bool {
        self.0.contains(&k)
    }
    /// True when the client will not receive the reply as sent.
    fn loses_reply(&self) -> bool {
        [FaultKind::DropAfterAction, FaultKind::MalformedJson, FaultKind::WrongId]
            .into_iter()
            .any(|k| self.has(k))
    }
    fn outcome(&self) -> TransitionOutcome {
        if self.has(FaultKind::TransitionStuck) {
            TransitionOutcome::Stuck
        } else if self.has(FaultKind::TransitionError) {
            TransitionOutcome::Error
        } else {
            TransitionOutcome::Complete
        }
    }
}

/// Build the router.
pub(crate) fn router(sh: Arc<Shared>) -> Router {
    let v1 = Router::new()
        .route("/sandboxes", post(create_sandbox))
        .route("/sandboxes/{id}", get(get_sandbox).delete(delete_sandbox))
        .route("/sandboxes/{id}/pause", post(pause))
        .route("/sandboxes/{id}/resume", post(resume))
        .route("/sandboxes/{id}/exec", post(exec))
        .route("/sandboxes/{id}/files", get(get_file).put(put_file))
        .route("/sandboxes/{id}/processes", post(create_process))
        .route("/sandboxes/{id}/processes/{pid}/stdin/close", post(close_stdin))
        .route("/sandboxes/{id}/processes/{pid}/connect", get(connect))
        .route("/sandboxes/{id}/processes/{pid}", axum::routing::delete(delete_process));
    Router::new()
        .nest("/v1", v1)
        .fallback(|| async { err_response(StatusCode::NOT_FOUND, "not found") })
        .layer(DefaultBodyLimit::max(256 * 1024 * 1024))
        .layer(middleware::from_fn_with_state(sh.clone(), gate))
        .with_state(sh)
}

type Reply = Result<Response, ApiError>;

fn ok(data: Value) -> Response {
    json_response(StatusCode::OK, json!({"status": "success", "data": data}))
}

fn json_response(status: StatusCode, v: Value) -> Response {
    (status, [(header::CONTENT_TYPE, "application/json")], serde_json::to_vec(&v).unwrap_or_default())
        .into_response()
}

/// An error reply with the error envelope.
pub(crate) fn err_response(status: StatusCode, msg: &str) -> Response {
    json_response(status, json!({"status": "error", "error": msg}))
}

/// A handler error: rendered as a non-2xx error envelope.
#[derive(Debug)]
pub(crate) struct ApiError {
    status: StatusCode,
    msg: String,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        err_response(self.status, &self.msg)
    }
}

fn err(status: StatusCode, msg: &str) -> ApiError {
    ApiError { status, msg: msg.to_string() }
}

fn valid_id(id: &str) -> bool {
    (1..=200).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

fn lookup(sh: &Shared, id: &str) -> Result<Arc<Sandbox>, ApiError> {
    if !valid_id(id) {
        return Err(err(StatusCode::BAD_REQUEST, "invalid sandbox id"));
    }
    sh.sandboxes.get(id).ok_or_else(|| err(StatusCode::NOT_FOUND, "sandbox not found"))
}

fn lookup_process(sh: &Shared, id: &str, pid: &str) -> Result<(Arc<Sandbox>, Arc<ManagedProcess>), ApiError> {
    let sb = lookup(sh, id)?;
    if !valid_id(pid) {
        return Err(err(StatusCode::BAD_REQUEST, "invalid process id"));
    }
    let p = sb.process(pid).ok_or_else(|| err(StatusCode::NOT_FOUND, "process not found"))?;
    Ok((sb, p))
}

fn require_running(sb: &Sandbox) -> Result<(), ApiError> {
    match sb.status() {
        SandboxStatus::Running => Ok(()),
        s => Err(err(StatusCode::CONFLICT, &format!("sandbox is {}, not running", s.as_str()))),
    }
}

fn json_object(body: &[u8]) -> Result<serde_json::Map<String, Value>, ApiError> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => Ok(m),
        _ => Err(err(StatusCode::BAD_REQUEST, "body must be a JSON object")),
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Rate limit, authenticate, inject faults, record in the ledger.
async fn gate(State(sh): State<Arc<Shared>>, mut req: Request, next: Next) -> Response {
    let received_at = Instant::now();
    let method = req.method().as_str().to_string();
    let path = req.uri().path().to_string();
    let ctx = req.extensions().get::<ConnCtx>().cloned();
    let ip = ctx.as_ref().map_or(IpAddr::V4(Ipv4Addr::LOCALHOST), |c| c.peer.ip());
    let record = |status: u16| sh.ledger.record_request(&method, &path, status, received_at);

    if let Err(secs) = sh.limiter.check(ip) {
        let mut r = err_response(StatusCode::TOO_MANY_REQUESTS, "rate limit exceeded");
        r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs));
        record(429);
        return r;
    }
    let authed =
        req.headers().get("x-api-key").is_some_and(|v| constant_time_eq(v.as_bytes(), sh.api_key.as_bytes()));
    if !authed {
        record(401);
        return err_response(StatusCode::UNAUTHORIZED, "missing or invalid API key");
    }

    let fired = sh.faults.evaluate(&method, &path);
    for k in &fired {
        if let FaultKind::Delay(d) = k {
            tokio::time::sleep(*d).await;
        }
    }
    if let Some(code) = fired.iter().find_map(|k| match k {
        FaultKind::Status(c) => Some(*c),
        _ => None,
    }) {
        let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut r = err_response(status, "injected fault");
        if code == 429 {
            r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(1u32));
        }
        record(status.as_u16());
        return r;
    }
    let fired = Fired(fired);
    req.extensions_mut().insert(fired.clone());
    let mut resp = next.run(req).await;
    for k in &fired.0 {
        if let FaultKind::DelayReply(d) = k {
            tokio::time::sleep(*d).await;
        }
    }

    if fired.has(FaultKind::ForceStopped) {
        if let Some(id) = path.strip_prefix("/v1/sandboxes/").and_then(|r| r.split('/').next()) {
            sh.force_stop(id, &tokio::runtime::Handle::current());
        }
    }
    if fired.has(FaultKind::DropAfterAction) {
        record(0);
        if let Some(ctx) = ctx {
            ctx.kill.notify_one();
            std::future::pending::<()>().await;
        }
        return err_response(StatusCode::INTERNAL_SERVER_ERROR, "connection drop unavailable");
    }
    if fired.has(FaultKind::WrongId) {
        resp = wrong_id(resp).await;
    }
    if fired.has(FaultKind::MalformedJson) {
        resp = (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            "{\"status\":\"success\",\"data\":{\"id\":",
        )
            .into_response();
    }
    record(resp.status().as_u16());
    resp
}

async fn wrong_id(resp: Response) -> Response {
    let (parts, body) = resp.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, 16 * 1024 * 1024).await else {
        return err_response(StatusCode::INTERNAL_SERVER_ERROR, "body unreadable");
    };
    let Ok(mut v) = serde_json::from_slice::<Value>(&bytes) else {
        return Response::from_parts(parts, Body::from(bytes));
    };
    if let Some(data) = v.get_mut("data").and_then(Value::as_object_mut) {
        let key =
            if data.contains_key("process_id") && !data.contains_key("id") { "process_id" } else { "id" };
        let fake = format!("sb-wrong-{}", uuid::Uuid::new_v4().simple());
        data.insert(key.to_string(), Value::String(fake));
    }
    let mut r = Response::from_parts(parts, Body::from(serde_json::to_vec(&v).unwrap_or_default()));
    r.headers_mut().remove(header::CONTENT_LENGTH);
    r
}

async fn create_sandbox(
    State(sh): State<Arc<Shared>>,
    Extension(fired): Extension<Fired>,
    body: Bytes,
) -> Reply {
    let m = json_object(&body)?;
    let shape = m
        .get("shape")
        .and_then(Value::as_str)
        .ok_or_else(|| err(StatusCode::BAD_REQUEST, "shape is required"))?;
    if !crate::config::SHAPES.contains(&shape) {
        return Err(err(StatusCode::BAD_REQUEST, "unknown shape"));
    }
    for k in ["rootfs", "region"] {
        if m.get(k).is_some_and(|v| !v.is_string() && !v.is_null()) {
            return Err(err(StatusCode::BAD_REQUEST, &format!("{k} must be a string")));
        }
    }
    if m.get("ingress_enabled").is_some_and(|v| !v.is_boolean()) {
        return Err(err(StatusCode::BAD_REQUEST, "ingress_enabled must be a boolean"));
    }
    let sb = sh.create_sandbox(shape, fired.outcome()).map_err(|e| {
        tracing::error!("cannot create sandbox directories: {e}");
        err(StatusCode::INTERNAL_SERVER_ERROR, "sandbox creation failed")
    })?;
    if fired.loses_reply() {
        sh.ledger.mark_creation_reply_lost(&sb.id);
    }
    Ok(ok(json!({"id": sb.id})))
}

async fn get_sandbox(State(sh): State<Arc<Shared>>, Path(id): Path<String>) -> Reply {
    let sb = lookup(&sh, &id)?;
    Ok(ok(json!({"id": sb.id, "status": sb.status().as_str()})))
}

async fn delete_sandbox(State(sh): State<Arc<Shared>>, Path(id): Path<String>) -> Reply {
    lookup(&sh, &id)?;
    let (sb, trees) = sh.detach(&id, false).ok_or_else(|| err(StatusCode::NOT_FOUND, "sandbox not found"))?;
    cleanup(sb, trees).await;
    Ok(ok(json!({"id": id})))
}

async fn transition(sh: Arc<Shared>, id: &str, t: Transition, fired: &Fired) -> Reply {
    let sb = lookup(&sh, id)?;
    let (generation, st) = sb.begin(t).map_err(|r| err(StatusCode::CONFLICT, &r.to_string()))?;
    sh.ledger.set_status(&sb.id, st.as_str());
    let delay = match t {
        Transition::Pause => sh.pause_delay,
        Transition::Resume => sh.resume_delay,
    };
    sh.schedule(sb, generation, delay, fired.outcome());
    Ok(ok(json!({"status": st.as_str()})))
}

async fn pause(
    State(sh): State<Arc<Shared>>,
    Extension(fired): Extension<Fired>,
    Path(id): Path<String>,
) -> Reply {
    transition(sh, &id, Transition::Pause, &fired).await
}

async fn resume(
    State(sh): State<Arc<Shared>>,
    Extension(fired): Extension<Fired>,
    Path(id): Path<String>,
) -> Reply {
    transition(sh, &id, Transition::Resume, &fired).await
}

struct CommandSpec {
    cmd: String,
    args: Vec<String>,
    cwd: Option<String>,
}

fn command_spec(body: &[u8]) -> Result<CommandSpec, ApiError> {
    let m = json_object(body)?;
    if m.contains_key("env") {
        return Err(err(StatusCode::BAD_REQUEST, "env keys were not declared at sandbox creation"));
    }
    let cmd = m
        .get("cmd")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .ok_or_else(|| err(StatusCode::BAD_REQUEST, "cmd must be a non-empty string"))?;
    let args = match m.get("args") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| v.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| err(StatusCode::BAD_REQUEST, "args must be strings"))?,
        Some(_) => return Err(err(StatusCode::BAD_REQUEST, "args must be an array")),
    };
    let cwd = match m.get("cwd") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if s.starts_with('/') => Some(s.clone()),
        Some(_) => return Err(err(StatusCode::BAD_REQUEST, "cwd must be an absolute path")),
    };
    if cmd.contains('\0') || args.iter().any(|a| a.contains('\0')) {
        return Err(err(StatusCode::BAD_REQUEST, "NUL byte in command"));
    }
    Ok(CommandSpec { cmd: cmd.to_string(), args, cwd })
}

fn isolation_ok(sh: &Shared) -> Result<(), ApiError> {
    sh.isolation.as_ref().map(|_| ()).map_err(|msg| {
        tracing::error!("createos-sim: {msg}");
        err(StatusCode::INTERNAL_SERVER_ERROR, "process isolation unavailable")
    })
}

fn spawn_error(e: SpawnError) -> ApiError {
    match e {
        SpawnError::BadCommand(_) => err(StatusCode::BAD_REQUEST, &e.to_string()),
        SpawnError::Internal(_) => {
            tracing::error!("createos-sim: {e}");
            err(StatusCode::INTERNAL_SERVER_ERROR, "process creation failed")
        }
    }
}

async fn exec(
    State(sh): State<Arc<Shared>>,
    Extension(fired): Extension<Fired>,
    Path(id): Path<String>,
    body: Bytes,
) -> Reply {
    let sb = lookup(&sh, &id)?;
    let spec = command_spec(&body)?;
    let room = sh.admission.command().await;
    require_running(&sb)?;
    isolation_ok(&sh)?;
    let run = crate::process::start_exec(&sb.dirs, &spec.cmd, &spec.args, spec.cwd.as_deref(), room)
        .map_err(spawn_error)?;
    let tree = run.tree.clone();
    let Some(key) = sb.register_exec(tree.clone()) else {
        tree.kill_and_wait(Duration::from_secs(3)).await;
        return Err(err(StatusCode::NOT_FOUND, "sandbox not found"));
    };
    let out = run.finish().await;
    sb.unregister_exec(key);
    let out = out.map_err(|e| {
        tracing::error!("createos-sim: exec wait failed: {e}");
        err(StatusCode::INTERNAL_SERVER_ERROR, "command failed")
    })?;
    let exit_code = fired
        .0
        .iter()
        .find_map(|kind| match kind {
            FaultKind::ExitCode(code) => Some(*code),
            _ => None,
        })
        .unwrap_or(out.exit_code);
    Ok(ok(json!({"result": {
        "exit_code": exit_code,
        "stdout": String::from_utf8_lossy(&out.stdout),
        "stderr": String::from_utf8_lossy(&out.stderr),
    }})))
}

fn file_path(sb: &Sandbox, q: &HashMap<String, String>) -> Result<std::path::PathBuf, ApiError> {
    let p = q.get("path").ok_or_else(|| err(StatusCode::BAD_REQUEST, "path is required"))?;
    sb.dirs
        .map_path(p)
        .ok_or_else(|| err(StatusCode::BAD_REQUEST, "path must be a file under /paperclip-workspace or /tmp"))
}

/// Canonical parent must stay inside the sandbox (no symlink escapes).
fn check_parent(sb: &Sandbox, host: &std::path::Path) -> Result<(), ApiError> {
    let parent = host
        .parent()
        .and_then(|p| p.canonicalize().ok())
        .ok_or_else(|| err(StatusCode::NOT_FOUND, "no such directory"))?;
    if sb.dirs.contains(&parent) {
        Ok(())
    } else {
        Err(err(StatusCode::BAD_REQUEST, "path escapes the sandbox"))
    }
}

/// Bytes read from disk at a time when a file is served.
const FILE_CHUNK: usize = 256 << 10;

/// Writes the request body to the file as it arrives: any size, bounded
/// memory (one chunk at a time).
async fn put_file(
    State(sh): State<Arc<Shared>>,
    Path(id): Path<String>,
    Query(q): Query<HashMap<String, String>>,
    body: Body,
) -> Reply {
    let sb = lookup(&sh, &id)?;
    let host = file_path(&sb, &q)?;
    require_running(&sb)?;
    if let Some(parent) = host.parent() {
        // Parents are created, like `mkdir -p` (assumed).
        std::fs::create_dir_all(parent)
            .map_err(|e| err(StatusCode::BAD_REQUEST, &format!("cannot create parent: {e}")))?;
    }
    check_parent(&sb, &host)?;
    use futures_util::StreamExt;
    use std::os::unix::fs::OpenOptionsExt;
    use tokio::io::AsyncWriteExt;
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&host)
        .map_err(|e| err(StatusCode::BAD_REQUEST, &format!("cannot write file: {e}")))?;
    let mut file = tokio::io::BufWriter::with_capacity(FILE_CHUNK, tokio::fs::File::from_std(file));
    let mut stream = body.into_data_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|_| err(StatusCode::BAD_REQUEST, "request body interrupted"))?;
        file.write_all(&chunk).await.map_err(|e| {
            tracing::error!("createos-sim: write failed: {e}");
            err(StatusCode::INTERNAL_SERVER_ERROR, "write failed")
        })?;
    }
    file.flush().await.map_err(|_| err(StatusCode::INTERNAL_SERVER_ERROR, "write failed"))?;
    Ok(ok(json!({})))
}

/// Streams the file from disk, one chunk at a time. With the `cut_stream`
/// fault, half the file is sent and then the body ends with an error.
async fn get_file(
    State(sh): State<Arc<Shared>>,
    Path(id): Path<String>,
    Query(q): Query<HashMap<String, String>>,
    Extension(fired): Extension<Fired>,
) -> Reply {
    let sb = lookup(&sh, &id)?;
    let host = file_path(&sb, &q)?;
    require_running(&sb)?;
    check_parent(&sb, &host)?;
    use std::os::unix::fs::OpenOptionsExt;
    use tokio::io::AsyncReadExt;
    let f = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW).open(&host).map_err(
        |e| match e.kind() {
            io::ErrorKind::NotFound => err(StatusCode::NOT_FOUND, "no such file"),
            _ => err(StatusCode::BAD_REQUEST, &format!("cannot read file: {e}")),
        },
    )?;
    let len = match f.metadata() {
        Ok(meta) if meta.is_file() => meta.len(),
        _ => return Err(err(StatusCode::BAD_REQUEST, "not a regular file")),
    };
    let left = if fired.has(FaultKind::CutStream) { len / 2 } else { len };
    let cut = fired.has(FaultKind::CutStream);
    let file = tokio::fs::File::from_std(f);
    let chunks =
        futures_util::stream::unfold((file, left, false), move |(mut file, left, done)| async move {
            if done {
                return None;
            }
            if left == 0 {
                return cut
                    .then(|| (Err(io::Error::new(io::ErrorKind::ConnectionReset, "cut")), (file, 0, true)));
            }
            let mut buf = vec![0u8; FILE_CHUNK.min(left as usize)];
            match file.read(&mut buf).await {
                Ok(0) => None,
                Ok(n) => {
                    buf.truncate(n);
                    Some((Ok(Bytes::from(buf)), (file, left - n as u64, false)))
                }
                Err(e) => Some((Err(e), (file, 0, true))),
            }
        });
    let mut response = Response::new(Body::from_stream(chunks));
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
    if !cut {
        response.headers_mut().insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    }
    Ok(response)
}

async fn create_process(State(sh): State<Arc<Shared>>, Path(id): Path<String>, body: Bytes) -> Reply {
    let sb = lookup(&sh, &id)?;
    let spec = command_spec(&body)?;
    let room = sh.admission.command().await;
    require_running(&sb)?;
    isolation_ok(&sh)?;
    let p = ManagedProcess::spawn(
        &sb.dirs,
        &spec.cmd,
        &spec.args,
        spec.cwd.as_deref(),
        (sh.journal_bytes, sh.pace_output),
        room,
    )
    .map_err(spawn_error)?;
    let pid = format!("proc-{}", uuid::Uuid::new_v4().simple());
    sh.ledger.record_process(&id, &body);
    if !sb.add_process(pid.clone(), p.clone()) {
        p.tree.kill_and_wait(Duration::from_secs(3)).await;
        return Err(err(StatusCode::NOT_FOUND, "sandbox not found"));
    }
    Ok(ok(json!({"process_id": pid})))
}

async fn close_stdin(State(sh): State<Arc<Shared>>, Path((id, pid)): Path<(String, String)>) -> Reply {
    let (_, p) = lookup_process(&sh, &id, &pid)?;
    if p.close_stdin() {
        Ok(ok(json!({})))
    } else {
        Err(err(StatusCode::CONFLICT, "stdin already closed"))
    }
}

async fn delete_process(
    State(sh): State<Arc<Shared>>,
    Path((id, pid)): Path<(String, String)>,
    Query(q): Query<HashMap<String, String>>,
) -> Reply {
    let (_, p) = lookup_process(&sh, &id, &pid)?;
    let grace = match q.get("grace_ms") {
        None => 1000,
        Some(s) => {
            s.parse::<u64>().map_err(|_| err(StatusCode::BAD_REQUEST, "grace_ms must be an integer"))?
        }
    }
    .min(60_000);
    let exited = p.tree.terminate(Duration::from_millis(grace)).await;
    if exited {
        // Let the exit frame land before answering.
        p.wait_exited(Duration::from_secs(1)).await;
    }
    Ok(ok(json!({"tree_exited": exited})))
}

fn line(v: Value) -> Bytes {
    let mut l = serde_json::to_vec(&v).unwrap_or_default();
    l.push(b'\n');
    Bytes::from(l)
}

async fn connect(
    State(sh): State<Arc<Shared>>,
    Extension(fired): Extension<Fired>,
    Path((id, pid)): Path<(String, String)>,
    Query(q): Query<HashMap<String, String>>,
) -> Reply {
    let (_, p) = lookup_process(&sh, &id, &pid)?;
    let after = match q.get("after") {
        None => 0,
        Some(s) => s.parse::<u64>().map_err(|_| err(StatusCode::BAD_REQUEST, "after must be an integer"))?,
    };
    if let ReadResult::Evicted = p.read(after) {
        return Err(err(StatusCode::GONE, "output_offset_expired"));
    }
    let (tx, rx) = mpsc::channel::<io::Result<Bytes>>(16);
    tokio::spawn(follow(p, after, fired.has(FaultKind::CutStream), tx));
    let stream =
        futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|item| (item, rx)) });
    Ok((StatusCode::OK, [(header::CONTENT_TYPE, "application/x-ndjson")], Body::from_stream(stream))
        .into_response())
}

/// Most bytes of data lines written to a response body at once.
const BODY_WRITE_BYTES: usize = 256 * 1024;

/// Feed the NDJSON stream: replay, then follow live with heartbeats. The
/// lines of the frames at hand are written together, up to
/// [`BODY_WRITE_BYTES`] a write (a single larger line alone).
async fn follow(p: Arc<ManagedProcess>, mut cursor: u64, cut: bool, tx: mpsc::Sender<io::Result<Bytes>>) {
    let mut changes = p.subscribe();
    // Sends whole lines; with `cut`, only half of the first one and then an
    // error.
    let send = |lines: Vec<u8>| {
        let tx = tx.clone();
        async move {
            if cut {
                let first = lines.iter().position(|b| *b == b'\n').map_or(lines.len(), |end| end + 1);
                let half = Bytes::copy_from_slice(&lines[..first / 2]);
                let _ = tx.send(Ok(half)).await;
                let _ = tx.send(Err(io::Error::new(io::ErrorKind::ConnectionReset, "cut"))).await;
                return false;
            }
            tx.send(Ok(Bytes::from(lines))).await.is_ok()
        }
    };
    loop {
        changes.borrow_and_update();
        match p.read(cursor) {
            ReadResult::Evicted => {
                let _ = tx.send(Ok(line(json!({"type": "error", "error": "output_offset_expired"})))).await;
                return;
            }
            ReadResult::Frames(frames, exit) => {
                if let Some(last) = frames.last() {
                    p.taken(last.seq);
                }
                let mut lines = Vec::new();
                for f in frames {
                    let full = !lines.is_empty() && lines.len() + f.line_len_bound() > BODY_WRITE_BYTES;
                    if full && !send(std::mem::take(&mut lines)).await {
                        return;
                    }
                    f.write_line(&mut lines);
                    cursor = f.seq;
                }
                if let Some(e) = exit {
                    lines.extend_from_slice(&e.to_line());
                    send(lines).await;
                    return;
                }
                if !lines.is_empty() && !send(lines).await {
                    return;
                }
            }
        }
        match tokio::time::timeout(Duration::from_secs(1), changes.changed()).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return,
            Err(_) => {
                if tx.send(Ok(line(json!({"type": "heartbeat"})))).await.is_err() {
                    return;
                }
            }
        }
    }
}
