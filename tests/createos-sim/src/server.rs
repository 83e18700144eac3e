//! Shared server state, sandbox lifecycle operations and the accept loop.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::sync::{oneshot, Notify};
use tower_service::Service;

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
    pub state_dir: PathBuf,
    pub isolation: Result<(), String>,
    pub sandboxes: Registry,
    pub ledger: LedgerStore,
    pub limiter: RateLimiter,
    pub faults: FaultEngine,
    /// Client connections open now.
    pub connections: Arc<AtomicUsize>,
}

impl Shared {
    pub(crate) fn new(cfg: &SimConfig, state_dir: PathBuf, isolation: Result<(), String>) -> Self {
        Shared {
            api_key: cfg.api_key.clone(),
            create_delay: cfg.create_delay,
            pause_delay: cfg.pause_delay,
            resume_delay: cfg.resume_delay,
            journal_bytes: cfg.journal_bytes,
            state_dir,
            isolation,
            sandboxes: Registry::default(),
            ledger: LedgerStore::default(),
            limiter: RateLimiter::new(cfg.rate_limit),
            faults: FaultEngine::default(),
            connections: Arc::default(),
        }
    }

    /// Create a sandbox in `creating` and schedule its start.
    pub(crate) fn create_sandbox(
        self: &Arc<Self>,
        shape: &str,
        outcome: TransitionOutcome,
    ) -> std::io::Result<Arc<Sandbox>> {
        let id = format!("sb-{}", uuid::Uuid::new_v4().simple());
        let dirs = SandboxDirs::new(&self.state_dir, &id);
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
/// `connections`.
pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    connections: Arc<AtomicUsize>,
    mut shutdown: oneshot::Receiver<()>,
) {
    loop {
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
        tokio::spawn(async move {
            let _open = open;
            let svc = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
                req.extensions_mut().insert(ctx.clone());
                let mut r = router.clone();
                async move { r.call(req).await }
            });
            let conn = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), svc);
            tokio::select! {
                _ = conn => {}
                _ = kill.notified() => {}
            }
        });
    }
}
