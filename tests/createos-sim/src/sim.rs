//! The [`Simulator`] handle: starts the server on its own runtime thread.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::JoinHandle;

use tokio::sync::oneshot;

use crate::config::{RateLimit, SimConfig};
use crate::faults::{FaultId, FaultRule};
use crate::ledger::Ledger;
use crate::server::Shared;

/// A running CreateOS simulator.
///
/// The HTTP server runs on a private multi-threaded tokio runtime on a
/// background thread, so the handle can be used from plain synchronous code
/// (and from async code). Dropping it stops the server, SIGKILLs every
/// process tree, reaps them, and removes every sandbox directory (bounded:
/// it never waits more than a few seconds).
///
/// Requirements: Linux, root (mount namespaces for per-sandbox
/// `/paperclip-workspace` and `/tmp`); without them the server still runs but
/// process creation and `/exec` answer 500. Starting a simulator makes the
/// current process a child subreaper (`PR_SET_CHILD_SUBREAPER`) so orphaned
/// descendants of sandbox processes are reaped by the simulator.
pub struct Simulator {
    shared: Arc<Shared>,
    addr: SocketAddr,
    handle: tokio::runtime::Handle,
    shutdown: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
    _temp: Option<tempfile::TempDir>,
}

impl Simulator {
    /// Bind `config.listen` (loopback only) and start serving.
    pub fn start(config: SimConfig) -> io::Result<Simulator> {
        if !config.listen.ip().is_loopback() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the simulator only listens on loopback addresses",
            ));
        }
        let (temp, state_dir) = match &config.state_dir {
            Some(d) => {
                std::fs::create_dir_all(d)?;
                (None, d.clone())
            }
            None => {
                remove_stale_temp_dirs(&std::env::temp_dir());
                let prefix = format!("{TEMP_PREFIX}{}-", std::process::id());
                let t = tempfile::Builder::new().prefix(&prefix).tempdir()?;
                let p = t.path().to_path_buf();
                live_temp_dirs().push(p.clone());
                (Some(t), p)
            }
        };
        let isolation = crate::isolation::probe(&state_dir, config.pid_namespaces);
        if let Err(msg) = &isolation {
            tracing::error!("createos-sim: {msg}; process creation will answer 500");
        }
        crate::process::become_subreaper();
        let std_listener = listen(config.listen)?;
        let addr = std_listener.local_addr()?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("createos-sim")
            .enable_all()
            .build()?;
        let handle = rt.handle().clone();
        let shared = Arc::new(Shared::new(&config, state_dir, isolation));
        let listener = {
            let _guard = rt.enter();
            tokio::net::TcpListener::from_std(std_listener)?
        };
        let router = crate::routes::router(shared.clone());
        let (tx, rx) = oneshot::channel();
        let sh = shared.clone();
        let thread = std::thread::Builder::new().name("createos-sim-main".into()).spawn(move || {
            rt.block_on(async move {
                crate::server::serve(listener, router, sh.connections.clone(), sh.admission.clone(), rx)
                    .await;
                sh.shutdown_all().await;
            });
            rt.shutdown_timeout(std::time::Duration::from_secs(2));
        })?;
        Ok(Simulator { shared, addr, handle, shutdown: Some(tx), thread: Some(thread), _temp: temp })
    }

    /// Origin, e.g. `http://127.0.0.1:PORT` (no `/v1`).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The bound socket address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// How many client connections are open now.
    pub fn open_connections(&self) -> usize {
        self.shared.connections.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The accepted API key.
    pub fn api_key(&self) -> &str {
        &self.shared.api_key
    }

    /// A CreateOS provider configuration pointing at this simulator, with its
    /// key; `reuse_lease` makes release pause (true) or delete (false).
    pub fn provider_config(&self, reuse_lease: bool) -> serde_json::Value {
        serde_json::json!({
            "apiUrl": self.url(),
            "apiKey": self.api_key(),
            "shape": "s-1vcpu-1gb",
            "reuseLease": reuse_lease,
            "timeoutMs": 30_000,
        })
    }

    /// Replace the rate limit (`None` = off); the request history is reset.
    pub fn set_rate_limit(&self, limit: Option<RateLimit>) {
        self.shared.limiter.set(limit);
    }

    /// Add a fault rule (evaluated after the ones already added).
    pub fn add_fault(&self, rule: FaultRule) -> FaultId {
        self.shared.faults.add(rule)
    }

    /// Add several rules, e.g. a [`crate::FaultProfile`].
    pub fn add_faults(&self, rules: impl IntoIterator<Item = FaultRule>) -> Vec<FaultId> {
        rules.into_iter().map(|r| self.add_fault(r)).collect()
    }

    /// Remove one rule.
    pub fn remove_fault(&self, id: FaultId) {
        self.shared.faults.remove(id);
    }

    /// Remove every rule.
    pub fn clear_faults(&self) {
        self.shared.faults.clear();
    }

    /// Snapshot of the ledger.
    pub fn ledger(&self) -> Ledger {
        self.shared.ledger.snapshot()
    }

    /// Ids of sandboxes not deleted (sorted).
    pub fn live_sandboxes(&self) -> Vec<String> {
        self.shared.sandboxes.ids()
    }

    /// Host-level force stop: the sandbox vanishes at once (GET answers 404),
    /// its processes are SIGKILLed and its files removed in the background.
    /// Returns false if no such live sandbox.
    pub fn force_stop(&self, sandbox_id: &str) -> bool {
        self.shared.force_stop(sandbox_id, &self.handle)
    }

    /// Stop now (same as dropping the handle).
    pub fn shutdown(self) {}

    /// For a CLI: block until SIGINT or SIGTERM, then shut down.
    pub fn serve_until_ctrl_c(self) -> io::Result<()> {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        rt.block_on(async {
            let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
            tokio::select! {
                r = tokio::signal::ctrl_c() => r,
                _ = term.recv() => Ok(()),
            }
        })?;
        drop(self);
        Ok(())
    }
}

impl Drop for Simulator {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if let Some(temp) = &self._temp {
            live_temp_dirs().retain(|dir| dir != temp.path());
        }
    }
}

/// Prefix of a simulator's temporary directory: `createos-sim-<pid>-<random>`.
const TEMP_PREFIX: &str = "createos-sim-";

fn live_temp_dirs() -> std::sync::MutexGuard<'static, Vec<std::path::PathBuf>> {
    static LIVE: std::sync::Mutex<Vec<std::path::PathBuf>> = std::sync::Mutex::new(Vec::new());
    LIVE.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Removes the temporary directories of every simulator of this process, for
/// a process about to exit without dropping them (a second Ctrl-C).
pub fn remove_temp_dirs() {
    for dir in live_temp_dirs().drain(..) {
        // Sandboxes still running may add a file between the listing and the
        // last `rmdir`; a few passes get past that (nothing recreates the
        // directory itself once it is gone).
        for _ in 0..10 {
            if std::fs::remove_dir_all(&dir).is_ok() || !dir.exists() {
                break;
            }
        }
    }
}

/// Removes the temporary directories in `parent` of simulators whose process
/// is gone (killed before it could clean up). A directory whose process
/// still runs, or whose name carries no process id, is left alone.
pub fn remove_stale_temp_dirs(parent: &std::path::Path) {
    let Ok(entries) = std::fs::read_dir(parent) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|name| name.strip_prefix(TEMP_PREFIX))
            .and_then(|rest| rest.split_once('-'))
            .and_then(|(pid, _)| pid.parse::<libc::pid_t>().ok())
        else {
            continue;
        };
        if pid > 0 && !process_exists(pid) && entry.file_type().is_ok_and(|kind| kind.is_dir()) {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// True unless `pid` names no process (`kill(pid, 0)` fails with ESRCH).
fn process_exists(pid: libc::pid_t) -> bool {
    // SAFETY: signal 0 only checks that the process exists; nothing is sent.
    let result = unsafe { libc::kill(pid, 0) };
    result == 0 || io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

impl std::fmt::Debug for Simulator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Simulator").field("addr", &self.addr).finish_non_exhaustive()
    }
}

/// A nonblocking listener on `addr` whose queue holds
/// [`LISTEN_BACKLOG`](crate::admission::LISTEN_BACKLOG) connections not yet
/// accepted (the standard library's holds 128).
fn listen(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    let socket = socket2::Socket::new(socket2::Domain::for_address(addr), socket2::Type::STREAM, None)?;
    socket.set_reuse_address(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(crate::admission::LISTEN_BACKLOG)?;
    Ok(socket.into())
}
