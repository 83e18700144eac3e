//! Shared server state, sandbox lifecycle operations and the accept loop.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::{header, HeaderValue};
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::sync::{oneshot, Notify};
use tower_service::Service;

use crate::admission::Admission;
use crate::config::SimConfig;
use crate::faults::FaultEngine;
use crate::isolation::SandboxDirs;
use crate::ledger::LedgerStore;
use crate::process::Tree;
use crate::ratelimit::RateLimiter;
use crate::state::{Registry, Sandbox};

/// How a transition's timer ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TransitionOutcome {
    Complete,
    Stuck,
    Error,
}

/// Everything the handlers share.
pub(crate) struct Shared {
    pub api_key: String,
    pub create_delay: Duration,
    pub pause_delay: Duration,
    pub resume_delay: Duration,
    pub journal_bytes: usize,
    /// [`SimConfig::pace_output`].
    pub pace_output: bool,
    pub state_dir: PathBuf,
    /// Each command in a PID namespace of its own ([`SimConfig::pid_namespaces`]).
    pub pid_namespaces: bool,
    pub isolation: Result<(), String>,
    pub sandboxes: Registry,
    pub ledger: LedgerStore,
    pub limiter: RateLimiter,
    pub faults: FaultEngine,
    /// Client connections open now.
    pub connections: Arc<AtomicUsize>,
    /// Bounds on connections and running commands.
    pub admission: Arc<Admission>,
}

impl Shared {
    pub(crate) fn new(cfg: &SimConfig, state_dir: PathBuf, isolation: Result<(), String>) -> Self {
        Shared {
            api_key: cfg.api_key.clone(),
            create_delay: cfg.create_delay,
            pause_delay: cfg.pause_delay,
            resume_delay: cfg.resume_delay,
            journal_bytes: cfg.journal_bytes,
            pace_output: cfg.pace_output,
            state_dir,
            pid_namespaces: cfg.pid_namespaces,
            isolation,
            sandboxes: Registry::default(),
            ledger: LedgerStore::default(),
            limiter: RateLimiter::new(cfg.rate_limit),
            faults: FaultEngine::default(),
            connections: Arc::default(),
            admission: Arc::new(Admission::for_this_process()),
        }
    }

    /// Create a sandbox in `creating` and schedule its start.
    pub(crate) fn create_sandbox(
        self: &Arc<Self>,
        shape: &str,
        outcome: TransitionOutcome,
    ) -> std::io::Result<Arc<Sandbox>> {
        let id = format!("sb-{}", uuid::Uuid::new_v4().simple());
        let dirs = SandboxDirs::new(&self.state_dir, &id).with_pid_namespace(self.pid_namespaces);
        dirs.create()?;
        let sb = Arc::new(Sandbox::new(id.clone(), dirs));
        self.sandboxes.insert(sb.clone());
        self.ledger.add_sandbox(&id, shape, "creating");
        self.schedule(sb.clone(), 0, self.create_delay, outcome);
        Ok(sb)
    }

    /// Complete generation `generation` of `sb` after `delay`.
    pub(crate) fn schedule(
        self: &Arc<Self>,
        sb: Arc<Sandbox>,
        generation: u64,
        delay: Duration,
        outcome: TransitionOutcome,
    ) {
        if outcome == TransitionOutcome::Stuck {
            return;
        }
        let me = self.clone();
        let began_at = Instant::now();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let completed_at = Instant::now();
            if let Some(st) = sb.complete(generation, outcome == TransitionOutcome::Complete) {
                me.ledger.complete_transition(&sb.id, st.as_str(), began_at, completed_at);
            }
        });
    }

    /// Remove a sandbox from view and SIGKILL its processes; the caller
    /// awaits (or spawns) [`cleanup`] with the result.
    pub(crate) fn detach(&self, id: &str, force_stopped: bool) -> Option<(Arc<Sandbox>, Vec<Arc<Tree>>)> {
        let sb = self.sandboxes.remove(id)?;
        let trees = sb.mark_deleted();
        for t in &trees {
            t.signal(libc::SIGKILL);
            t.signal(libc::SIGCONT);
        }
        self.ledger.mark_deleted(id, force_stopped);
        Some((sb, trees))
    }

    /// Host-level force stop: the sandbox vanishes; cleanup runs on `rt`.
    pub(crate) fn force_stop(&self, id: &str, rt: &tokio::runtime::Handle) -> bool {
        match self.detach(id, true) {
            Some((sb, trees)) => {
                rt.spawn(cleanup(sb, trees));
                true
            }
            None => false,
        }
    }

    /// Kill everything and remove every sandbox directory (bounded).
    pub(crate) async fn shutdown_all(&self) {
        let all = self.sandboxes.drain();
        let mut jobs = Vec::new();
        for sb in all {
            let trees = sb.mark_deleted();
            for t in &trees {
                t.signal(libc::SIGKILL);
                t.signal(libc::SIGCONT);
            }
            jobs.push(tokio::spawn(cleanup(sb, trees)));
        }
        for j in jobs {
            let _ = j.await;
        }
    }
}

/// Wait (bounded) for the trees to be gone, then remove the sandbox files.
pub(crate) async fn cleanup(sb: Arc<Sandbox>, trees: Vec<Arc<Tree>>) {
    let limit = Duration::from_secs(3);
    let id = sb.id.as_str();
    let waits = trees.into_iter().map(|t| async move {
        if !t.kill_and_wait(limit).await {
            tracing::warn!(sandbox = %id, "process tree survived SIGKILL");
        }
    });
    futures_util::future::join_all(waits).await;
    let _ = tokio::fs::remove_dir_all(&sb.dirs.root).await;
}

/// Per-connection context: peer address and a switch that drops the
/// connection without a reply.
#[derive(Clone)]
pub(crate) struct ConnCtx {
    pub peer: SocketAddr,
    pub kill: Arc<Notify>,
}

/// Counts a client connection in `connections` until dropped.
struct OpenConnection(Arc<AtomicUsize>);

impl OpenConnection {
    fn new(connections: &Arc<AtomicUsize>) -> Self {
        connections.fetch_add(1, Ordering::SeqCst);
        OpenConnection(connections.clone())
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Accept connections until `shutdown` fires, counting the open ones in
/// `connections`; past the admission bound, the next waits in the listen
/// queue until one closes, and every response closes its connection.
pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    connections: Arc<AtomicUsize>,
    admission: Arc<Admission>,
    mut shutdown: oneshot::Receiver<()>,
) {
    loop {
        let room = tokio::select! {
            _ = &mut shutdown => break,
            room = admission.connection() => room,
        };
        let accepted = tokio::select! {
            _ = &mut shutdown => break,
            a = listener.accept() => a,
        };
        let (stream, peer) = match accepted {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!("accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let kill = Arc::new(Notify::new());
        let ctx = ConnCtx { peer, kill: kill.clone() };
        let router = router.clone();
        let open = OpenConnection::new(&connections);
        let admission = admission.clone();
        tokio::spawn(async move {
            let _open = (open, room);
            let svc = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
                req.extensions_mut().insert(ctx.clone());
                let mut r = router.clone();
                let admission = admission.clone();
                async move {
                    let mut response = r.call(req).await?;
                    // Full: give a queued connection the next turn.
                    if admission.connections_exhausted() {
                        response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
                    }
                    Ok::<_, std::convert::Infallible>(response)
                }
            });
            let conn = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), svc);
            tokio::select! {
                _ = conn => {}
                _ = kill.notified() => {}
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    /// Serves `GET /` with a router that answers "ok", admitting at most
    /// `connections` at once; returns its address and its shutdown switch.
    async fn serve_ok(connections: usize) -> (SocketAddr, oneshot::Sender<()>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let router = Router::new().route("/", axum::routing::get(|| async { "ok" }));
        let (stop, stopped) = oneshot::channel();
        let admission = Arc::new(Admission::bounded(connections, 1));
        tokio::spawn(serve(listener, router, Arc::default(), admission, stopped));
        (addr, stop)
    }

    /// Sends one `GET /` on `stream` and returns the response's head,
    /// lower-cased (the body, "ok", is read past).
    async fn get(stream: &mut TcpStream) -> String {
        stream.write_all(b"GET / HTTP/1.1\r\nhost: sim\r\n\r\n").await.unwrap();
        let mut seen = Vec::new();
        let mut byte = [0u8; 1];
        while !seen.ends_with(b"\r\n\r\nok") {
            let read = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut byte))
                .await
                .expect("no response within 10 s: the connection waits in the listen queue")
                .unwrap();
            assert_eq!(read, 1, "connection closed before the response ended");
            seen.push(byte[0]);
        }
        String::from_utf8_lossy(&seen).to_lowercase()
    }

    #[tokio::test]
    async fn below_the_bound_connections_are_kept_alive() {
        let (addr, _stop) = serve_ok(2).await;
        let mut client = TcpStream::connect(addr).await.unwrap();
        for _ in 0..3 {
            assert!(!get(&mut client).await.contains("connection: close"));
        }
    }

    #[tokio::test]
    async fn at_the_bound_a_queued_connection_gets_the_next_turn() {
        let (addr, _stop) = serve_ok(1).await;
        // The only connection admitted, kept by a client that would reuse it
        // for ever.
        let mut first = TcpStream::connect(addr).await.unwrap();
        assert!(
            get(&mut first).await.contains("connection: close"),
            "the full server kept its only connection"
        );
        // Its close let the queued one in.
        let mut queued = TcpStream::connect(addr).await.unwrap();
        get(&mut queued).await;
        let mut rest = Vec::new();
        first.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty(), "the first connection was closed after its response");
    }
}
