//! Sandbox state machine and the processes a sandbox owns.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::isolation::SandboxDirs;
use crate::process::{ManagedProcess, Tree};

/// Sandbox states as CreateOS reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SandboxStatus {
    /// Being created (in flight).
    Creating,
    /// Ready for commands.
    Running,
    /// Pause accepted, not done (in flight).
    Pausing,
    /// Paused: processes stopped.
    Paused,
    /// Resume accepted, not done (in flight).
    Resuming,
    /// A transition failed; resume is allowed.
    Error,
    /// Deleted.
    Destroyed,
    /// Creation failed for good.
    Failed,
}

impl SandboxStatus {
    /// Wire name (`creating`, `running`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            SandboxStatus::Creating => "creating",
            SandboxStatus::Running => "running",
            SandboxStatus::Pausing => "pausing",
            SandboxStatus::Paused => "paused",
            SandboxStatus::Resuming => "resuming",
            SandboxStatus::Error => "error",
            SandboxStatus::Destroyed => "destroyed",
            SandboxStatus::Failed => "failed",
        }
    }

    /// True for `creating`, `pausing`, `resuming`.
    pub fn in_flight(self) -> bool {
        matches!(self, SandboxStatus::Creating | SandboxStatus::Pausing | SandboxStatus::Resuming)
    }
}

/// A lifecycle request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Transition {
    Pause,
    Resume,
}

/// Why a transition was refused (both answer 409).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// Another transition is under way.
    InFlight(SandboxStatus),
    /// Not allowed from this state.
    WrongState(SandboxStatus),
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::InFlight(s) => write!(f, "a transition is under way ({})", s.as_str()),
            Refused::WrongState(s) => write!(f, "not allowed from state {}", s.as_str()),
        }
    }
}

/// One live sandbox.
#[derive(Debug)]
pub(crate) struct Sandbox {
    pub id: String,
    pub dirs: SandboxDirs,
    inner: Mutex<Inner>,
}

#[derive(Debug)]
struct Inner {
    status: SandboxStatus,
    generation: u64,
    deleted: bool,
    processes: HashMap<String, Arc<ManagedProcess>>,
    execs: HashMap<u64, Arc<Tree>>,
    next_exec: u64,
}

impl Sandbox {
    pub(crate) fn new(id: String, dirs: SandboxDirs) -> Sandbox {
        Sandbox {
            id,
            dirs,
            inner: Mutex::new(Inner {
                status: SandboxStatus::Creating,
                generation: 0,
                deleted: false,
                processes: HashMap::new(),
                execs: HashMap::new(),
                next_exec: 0,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Current status.
    pub(crate) fn status(&self) -> SandboxStatus {
        self.lock().status
    }

    /// Start a pause or resume; returns the generation to complete.
    pub(crate) fn begin(&self, t: Transition) -> Result<(u64, SandboxStatus), Refused> {
        let mut g = self.lock();
        let s = g.status;
        if s.in_flight() {
            return Err(Refused::InFlight(s));
        }
        let next = match (t, s) {
            (Transition::Pause, SandboxStatus::Running) => SandboxStatus::Pausing,
            (Transition::Resume, SandboxStatus::Paused | SandboxStatus::Error) => SandboxStatus::Resuming,
            _ => return Err(Refused::WrongState(s)),
        };
        g.status = next;
        g.generation += 1;
        Ok((g.generation, next))
    }

    /// Finish the in-flight state of `generation`: success leads to its
    /// target (stopping or continuing processes), failure to `error`.
    /// Returns the new status, or `None` if superseded or deleted.
    pub(crate) fn complete(&self, generation: u64, ok: bool) -> Option<SandboxStatus> {
        let mut g = self.lock();
        if g.deleted || g.generation != generation || !g.status.in_flight() {
            return None;
        }
        let target = match (ok, g.status) {
            (false, _) => SandboxStatus::Error,
            (true, SandboxStatus::Pausing) => SandboxStatus::Paused,
            (true, _) => SandboxStatus::Running,
        };
        let sig = match target {
            SandboxStatus::Paused => Some(libc::SIGSTOP),
            SandboxStatus::Running => Some(libc::SIGCONT),
            _ => None,
        };
        if let Some(sig) = sig {
            for t in trees(&g) {
                t.signal(sig);
            }
        }
        g.status = target;
        Some(target)
    }

    /// Register a managed process; false if the sandbox was deleted meanwhile.
    pub(crate) fn add_process(&self, id: String, p: Arc<ManagedProcess>) -> bool {
        let mut g = self.lock();
        if g.deleted {
            return false;
        }
        g.processes.insert(id, p);
        true
    }

    /// A managed process by id.
    pub(crate) fn process(&self, id: &str) -> Option<Arc<ManagedProcess>> {
        self.lock().processes.get(id).cloned()
    }

    /// Register a running `/exec`; `None` if the sandbox was deleted meanwhile.
    pub(crate) fn register_exec(&self, tree: Arc<Tree>) -> Option<u64> {
        let mut g = self.lock();
        if g.deleted {
            return None;
        }
        g.next_exec += 1;
        let k = g.next_exec;
        g.execs.insert(k, tree);
        Some(k)
    }

    /// Forget a finished `/exec`.
    pub(crate) fn unregister_exec(&self, key: u64) {
        self.lock().execs.remove(&key);
    }

    /// Mark deleted (idempotent) and return every process tree to kill.
    pub(crate) fn mark_deleted(&self) -> Vec<Arc<Tree>> {
        let mut g = self.lock();
        g.deleted = true;
        g.status = SandboxStatus::Destroyed;
        let t = trees(&g);
        g.processes.clear();
        g.execs.clear();
        t
    }
}

fn trees(g: &Inner) -> Vec<Arc<Tree>> {
    g.processes.values().map(|p| p.tree.clone()).chain(g.execs.values().cloned()).collect()
}

/// Live sandboxes by id.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    map: Mutex<HashMap<String, Arc<Sandbox>>>,
}

impl Registry {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Arc<Sandbox>>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }
    pub(crate) fn insert(&self, sb: Arc<Sandbox>) {
        self.lock().insert(sb.id.clone(), sb);
    }
    pub(crate) fn get(&self, id: &str) -> Option<Arc<Sandbox>> {
        self.lock().get(id).cloned()
    }
    pub(crate) fn remove(&self, id: &str) -> Option<Arc<Sandbox>> {
        self.lock().remove(id)
    }
    pub(crate) fn ids(&self) -> Vec<String> {
        let mut v: Vec<String> = self.lock().keys().cloned().collect();
        v.sort();
        v
    }
    pub(crate) fn drain(&self) -> Vec<Arc<Sandbox>> {
        self.lock().drain().map(|(_, v)| v).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn sb() -> Sandbox {
        Sandbox::new("a".into(), SandboxDirs::new(Path::new("/x"), "a"))
    }

    #[test]
    fn transitions() {
        let s = sb();
        assert_eq!(s.begin(Transition::Pause), Err(Refused::InFlight(SandboxStatus::Creating)));
        assert_eq!(s.complete(0, true), Some(SandboxStatus::Running));
        assert_eq!(s.begin(Transition::Resume), Err(Refused::WrongState(SandboxStatus::Running)));
        let (g, st) = s.begin(Transition::Pause).unwrap();
        assert_eq!(st, SandboxStatus::Pausing);
        assert_eq!(s.begin(Transition::Pause), Err(Refused::InFlight(SandboxStatus::Pausing)));
        assert_eq!(s.complete(g, false), Some(SandboxStatus::Error));
        assert_eq!(s.complete(g, true), None);
        let (g, _) = s.begin(Transition::Resume).unwrap();
        assert_eq!(s.complete(g, true), Some(SandboxStatus::Running));
        s.mark_deleted();
        assert_eq!(s.status(), SandboxStatus::Destroyed);
    }
}
