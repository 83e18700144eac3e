//! Lease records and the provider's per-lease state.
//!
//! A lease record (id plus metadata JSON) is *untrusted input*: the host
//! stores it in files and databases and hands it back later, possibly for
//! another environment. Every hook that takes a lease checks it here before
//! touching anything.

use crate::{config::Config, process::Event};
use provider_abi::{EnvironmentParams, ErrorKind, LeaseParams, ProviderError};
use serde_json::{json, Value};
use std::{
    collections::{HashMap, HashSet},
    path::PathBuf,
    sync::{mpsc::Sender, Condvar, Mutex, MutexGuard, PoisonError},
    time::Duration,
};

/// The `provider` field of every lease record this provider writes.
pub const PROVIDER: &str = "hello";

/// The message of the release rule, in CreateOS's words: a lease
/// whose cleanup is unconfirmed is never handed out for reuse.
pub const UNCONFIRMED: &str = "Hello process cleanup is unconfirmed; destroy this lease before reusing it.";

/// A checked lease: its id and where it lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseDir {
    /// The provider lease id (`hello-<32 hex digits>`).
    pub id: String,
    /// The lease directory.
    pub dir: PathBuf,
}

impl LeaseDir {
    /// A new lease under `config.root` (not yet created).
    pub fn new(config: &Config) -> LeaseDir {
        let id = format!("hello-{}", uuid::Uuid::new_v4().simple());
        LeaseDir { dir: config.root.join(&id), id }
    }

    /// The workspace directory commands run in.
    pub fn workspace(&self) -> PathBuf {
        self.dir.join("workspace")
    }

    /// The file whose presence says the lease is released (paused).
    pub fn released_marker(&self) -> PathBuf {
        self.dir.join("released")
    }

    /// The metadata JSON the host stores with the lease.
    pub fn metadata(&self, env: &EnvironmentParams, config: &Config) -> String {
        json!({
            "provider": PROVIDER,
            "companyId": env.company_id.as_str(),
            "environmentId": env.environment_id.as_str(),
            "root": config.root.to_string_lossy(),
        })
        .to_string()
    }

    /// Checks that `params` names a lease of this provider, for the hook's
    /// own company, environment and root, *before* anything is done with it.
    ///
    /// A malformed record is `invalid_input`; a well-formed record of another
    /// environment is `not_this_environment`. A provider talking to a shared
    /// service should also make the record tamper-evident (the CreateOS
    /// provider MACs every field under a key derived from its API key), so
    /// that editing the environment fields does not unlock another tenant's
    /// lease; a local directory has no such secret to key it with.
    pub fn open(params: &LeaseParams, config: &Config) -> Result<LeaseDir, ProviderError> {
        let invalid =
            |what: &str| ProviderError::new(ErrorKind::INVALID_INPUT, format!("Hello lease {what}."));
        let id = params.provider_lease_id.as_ref().map(|id| id.to_string()).into_option();
        let id = id.ok_or_else(|| invalid("has no id (it expired; acquire a new one)"))?;
        let well_formed = id
            .strip_prefix("hello-")
            .is_some_and(|hex| hex.len() == 32 && hex.bytes().all(|b| b.is_ascii_hexdigit()));
        if !well_formed {
            return Err(invalid("id is malformed"));
        }
        let metadata: Value =
            serde_json::from_str(&params.metadata_json).map_err(|_| invalid("metadata is not JSON"))?;
        let field = |key: &str| metadata.get(key).and_then(Value::as_str).unwrap_or_default().to_owned();
        let ours = field("provider") == PROVIDER
            && field("companyId") == params.env.company_id.as_str()
            && field("environmentId") == params.env.environment_id.as_str()
            && field("root") == config.root.to_string_lossy();
        if !ours {
            return Err(ProviderError::new(
                ErrorKind::NOT_THIS_ENVIRONMENT,
                "Hello lease does not belong to this environment.",
            ));
        }
        Ok(LeaseDir { dir: config.root.join(&id), id })
    }
}

/// What the provider remembers about its leases between hooks.
#[derive(Default)]
struct State {
    /// The leases whose release or destroy is running.
    closing: HashSet<String>,
    /// The leases where a command's process cleanup could not be confirmed:
    /// only destroy may follow. (In memory: a provider that must survive
    /// restarts keeps it with the lease; the host's ledger remembers it too.)
    unconfirmed: HashSet<String>,
    /// The commands running, by number: the lease each runs in and the
    /// channel that cancels it.
    running: HashMap<u64, (String, Sender<Event>)>,
    /// The number of the last command registered.
    last: u64,
}

impl State {
    /// Refuses a lease that is closing or unconfirmed.
    fn check_usable(&self, id: &str) -> Result<(), ProviderError> {
        match (self.closing.contains(id), self.unconfirmed.contains(id)) {
            (true, _) => Err(in_progress()),
            (_, true) => Err(unconfirmed()),
            _ => Ok(()),
        }
    }
}

/// The per-lease state of every lease this provider instance has seen.
///
/// Hooks may run on many host threads at once, so all of it sits behind one
/// mutex (held only for bookkeeping, never across I/O) with a condition
/// variable for "a command finished".
#[derive(Default)]
pub struct Leases {
    state: Mutex<State>,
    changed: Condvar,
}

impl Leases {
    /// Locks the state. A panic while the lock was held (a bug) must not
    /// make every later hook panic too, so poisoning is ignored: the state
    /// is plain sets and maps, valid after any partial update.
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Refuses a lease that is closing or unconfirmed (resume, execute).
    pub fn check_usable(&self, id: &str) -> Result<(), ProviderError> {
        self.lock().check_usable(id)
    }

    /// True when the lease's cleanup is unconfirmed.
    pub fn is_unconfirmed(&self, id: &str) -> bool {
        self.lock().unconfirmed.contains(id)
    }

    /// Marks the lease's cleanup unconfirmed: from now on only destroy is allowed.
    pub fn mark_unconfirmed(&self, id: &str) {
        self.lock().unconfirmed.insert(id.to_owned());
    }

    /// Clears the unconfirmed flag of a lease that is gone (destroyed).
    pub fn clear_unconfirmed(&self, id: &str) {
        self.lock().unconfirmed.remove(id);
    }

    /// Registers a command about to start in the lease, refused while the
    /// lease is closing or unconfirmed. Checked and registered under one
    /// lock, so a release either sees the command (and cancels it) or the
    /// command sees the release (and does not start). Dropping the guard
    /// unregisters the command and wakes a release waiting for it.
    pub fn start_command(&self, id: &str, cancel: Sender<Event>) -> Result<impl Sized + '_, ProviderError> {
        let mut state = self.lock();
        state.check_usable(id)?;
        state.last += 1;
        let number = state.last;
        state.running.insert(number, (id.to_owned(), cancel));
        Ok(scopeguard::guard(number, |number| {
            self.lock().running.remove(&number);
            self.changed.notify_all();
        }))
    }

    /// Marks the lease closing; a second release or destroy of the same lease
    /// while this one runs is refused with `cleanup_in_progress`. Dropping
    /// the guard (also on error or panic) lets the next one in.
    pub fn begin_closing(&self, id: &str) -> Result<impl Sized + '_, ProviderError> {
        if !self.lock().closing.insert(id.to_owned()) {
            return Err(in_progress());
        }
        Ok(scopeguard::guard(id.to_owned(), |id| {
            self.lock().closing.remove(&id);
        }))
    }

    /// Cancels every command running in the lease (`None`: in every lease)
    /// and waits until they have finished, at most `bound`. Commands that
    /// outlive the bound leave their lease unconfirmed; returns false then.
    pub fn cancel_and_wait(&self, id: Option<&str>, bound: Duration) -> bool {
        let ours = |(lease, _): &&(String, Sender<Event>)| id.is_none_or(|id| id == lease);
        let state = self.lock();
        for (_, cancel) in state.running.values().filter(ours) {
            // A command that already finished dropped its receiver: fine.
            let _ = cancel.send(Event::Cancel);
        }
        let (mut state, _) = self
            .changed
            .wait_timeout_while(state, bound, |state| state.running.values().any(|command| ours(&command)))
            .unwrap_or_else(PoisonError::into_inner);
        // Those still busy: after `bound`, or sooner if a thread panicked
        // holding the lock (a poisoned wait returns at once). Either way
        // their commands may still run, so their leases are unconfirmed.
        let busy: Vec<String> = state.running.values().filter(ours).map(|(lease, _)| lease.clone()).collect();
        let all_finished = busy.is_empty();
        state.unconfirmed.extend(busy);
        all_finished
    }
}

/// The error of a lease whose cleanup is unconfirmed.
pub fn unconfirmed() -> ProviderError {
    ProviderError::new(ErrorKind::CLEANUP_UNCONFIRMED, UNCONFIRMED)
}

fn in_progress() -> ProviderError {
    ProviderError::new(ErrorKind::CLEANUP_IN_PROGRESS, "Hello lease cleanup is already in progress.")
}
