//! Request and sandbox ledger: what the simulator saw, for assertions.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Instant, SystemTime};

/// One sandbox ever created, with its latest known status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxRecord {
    /// Sandbox id.
    pub id: String,
    /// Latest status (`creating`, `running`, ..., `destroyed`).
    pub status: String,
    /// Shape requested at creation.
    pub shape: String,
    /// True once deleted by a client or force-stopped by the host.
    pub deleted: bool,
    /// True if the host force-stopped it (fault or [`crate::Simulator::force_stop`]).
    pub force_stopped: bool,
    /// True if a fault lost or falsified the reply to its creation (the
    /// connection dropped, malformed JSON, a wrong id): no client can name
    /// it, since the API has no idempotency key.
    pub creation_reply_lost: bool,
    /// Creation time.
    pub created_at: SystemTime,
    /// Deletion time, if deleted.
    pub deleted_at: Option<SystemTime>,
}

/// One HTTP request as answered (status 0 = connection dropped without a reply).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestRecord {
    /// HTTP method, upper case.
    pub method: String,
    /// Request path without the query string.
    pub path: String,
    /// Status answered; 0 when the connection was dropped without a reply.
    pub status: u16,
    /// When the simulator received it (before rate limiting).
    pub received_at: Instant,
}

/// One in-flight phase (`creating`, `pausing`, `resuming`) that ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransitionRecord {
    /// The sandbox.
    pub sandbox_id: String,
    /// The status it ended in (`running`, `paused` or `error`).
    pub to: String,
    /// When the phase began (creation, or the accepted pause/resume request).
    pub began_at: Instant,
    /// When the status changed (taken just before it did).
    pub completed_at: Instant,
}

/// One managed process as its creation request described it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessRecord {
    /// The sandbox it ran in.
    pub sandbox_id: String,
    /// The raw JSON body of `POST .../processes`, exactly as received.
    pub request_body: String,
}

/// Snapshot of everything the simulator recorded.
#[derive(Debug, Clone, Default)]
pub struct Ledger {
    /// Every sandbox ever created, in creation order.
    pub sandboxes: Vec<SandboxRecord>,
    /// Every request, in completion order.
    pub requests: Vec<RequestRecord>,
    /// Every managed process creation request that was accepted.
    pub processes: Vec<ProcessRecord>,
    /// Every in-flight phase that ended, in completion order.
    pub transitions: Vec<TransitionRecord>,
}

impl Ledger {
    /// Number of requests whose method matches `method` (`*` = any) and whose
    /// path matches `path_pattern` (`*` = exactly one path segment).
    pub fn count(&self, method: &str, path_pattern: &str) -> usize {
        self.requests
            .iter()
            .filter(|r| {
                (method == "*" || r.method.eq_ignore_ascii_case(method))
                    && path_matches(path_pattern, &r.path)
            })
            .count()
    }

    /// Live sandboxes whose creation reply reached the client intact: the
    /// client knew their id, so any of these is a leak it is to blame for.
    pub fn leaked_nameable(&self) -> Vec<&SandboxRecord> {
        self.leaked().into_iter().filter(|s| !s.creation_reply_lost).collect()
    }

    /// Processes created (answered 2xx) and not terminated by a client
    /// (those that ended by themselves count too).
    pub fn unterminated_processes(&self) -> usize {
        let created = self
            .requests
            .iter()
            .filter(|r| r.method == "POST" && path_matches("/v1/sandboxes/*/processes", &r.path))
            .filter(|r| (200..300).contains(&r.status))
            .count();
        created - self.count("DELETE", "/v1/sandboxes/*/processes/*")
    }

    /// Sandboxes never deleted.
    pub fn leaked(&self) -> Vec<&SandboxRecord> {
        self.sandboxes.iter().filter(|s| !s.deleted).collect()
    }

    /// Number of requests answered with `status`.
    pub fn count_status(&self, status: u16) -> usize {
        self.requests.iter().filter(|r| r.status == status).count()
    }
}

/// Match a path against a pattern where `*` stands for exactly one segment
/// and a final `**` for any (possibly empty) rest.
pub fn path_matches(pattern: &str, path: &str) -> bool {
    let p: Vec<&str> = pattern.trim_end_matches('/').split('/').collect();
    let s: Vec<&str> = path.trim_end_matches('/').split('/').collect();
    if p.last() == Some(&"**") {
        let head = &p[..p.len() - 1];
        return s.len() >= head.len() && head.iter().zip(&s).all(|(a, b)| *a == "*" || a == b);
    }
    p.len() == s.len() && p.iter().zip(&s).all(|(a, b)| *a == "*" || a == b)
}

/// Thread-safe recorder behind [`Ledger`] snapshots.
#[derive(Debug, Default)]
pub(crate) struct LedgerStore {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    sandboxes: Vec<SandboxRecord>,
    index: HashMap<String, usize>,
    requests: Vec<RequestRecord>,
    processes: Vec<ProcessRecord>,
    transitions: Vec<TransitionRecord>,
}

impl LedgerStore {
    pub(crate) fn snapshot(&self) -> Ledger {
        let g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        Ledger {
            sandboxes: g.sandboxes.clone(),
            requests: g.requests.clone(),
            processes: g.processes.clone(),
            transitions: g.transitions.clone(),
        }
    }

    pub(crate) fn record_request(&self, method: &str, path: &str, status: u16, received_at: Instant) {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        g.requests.push(RequestRecord {
            method: method.to_string(),
            path: path.to_string(),
            status,
            received_at,
        });
    }

    /// Sets the status an in-flight phase ended in and records the phase
    /// (`completed_at`: taken just before the status changed).
    pub(crate) fn complete_transition(&self, id: &str, to: &str, began_at: Instant, completed_at: Instant) {
        self.set_status(id, to);
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let record =
            TransitionRecord { sandbox_id: id.to_string(), to: to.to_string(), began_at, completed_at };
        g.transitions.push(record);
    }

    pub(crate) fn record_process(&self, sandbox_id: &str, request_body: &[u8]) {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let request_body = String::from_utf8_lossy(request_body).into_owned();
        g.processes.push(ProcessRecord { sandbox_id: sandbox_id.to_string(), request_body });
    }

    pub(crate) fn add_sandbox(&self, id: &str, shape: &str, status: &str) {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let idx = g.sandboxes.len();
        g.sandboxes.push(SandboxRecord {
            id: id.to_string(),
            status: status.to_string(),
            shape: shape.to_string(),
            deleted: false,
            force_stopped: false,
            creation_reply_lost: false,
            created_at: SystemTime::now(),
            deleted_at: None,
        });
        g.index.insert(id.to_string(), idx);
    }

    pub(crate) fn set_status(&self, id: &str, status: &str) {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(&i) = g.index.get(id) {
            g.sandboxes[i].status = status.to_string();
        }
    }

    pub(crate) fn mark_creation_reply_lost(&self, id: &str) {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(&i) = g.index.get(id) {
            g.sandboxes[i].creation_reply_lost = true;
        }
    }

    pub(crate) fn mark_deleted(&self, id: &str, force_stopped: bool) {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(&i) = g.index.get(id) {
            let r = &mut g.sandboxes[i];
            r.deleted = true;
            r.force_stopped |= force_stopped;
            r.status = "destroyed".to_string();
            r.deleted_at = Some(SystemTime::now());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_matching() {
        assert!(path_matches("/v1/sandboxes/*", "/v1/sandboxes/abc"));
        assert!(!path_matches("/v1/sandboxes/*", "/v1/sandboxes/abc/pause"));
        assert!(path_matches("/v1/sandboxes/*/processes/*/connect", "/v1/sandboxes/a/processes/b/connect"));
        assert!(path_matches("/v1/sandboxes", "/v1/sandboxes"));
        assert!(path_matches("/v1/**", "/v1/sandboxes/a/pause"));
        assert!(!path_matches("/v1/**", "/v2/x"));
    }
}
