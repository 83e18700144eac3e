//! Per-lease state shared by every hook of one provider instance: which
//! leases are closing, which have unconfirmed cleanup, and which commands
//! are running on each.

use crate::error::Error;
use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex, MutexGuard},
};
use tokio_util::sync::CancellationToken;

/// Identifies a lease: the API origin, company, environment and sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LeaseScope {
    /// The API origin.
    pub origin: String,
    /// The owning company.
    pub company_id: String,
    /// The owning environment.
    pub environment_id: String,
    /// The sandbox id.
    pub sandbox_id: String,
}

/// A running command as release sees it: its lease, a way to cancel it and
/// a token cancelled once it finished (its process tree terminated or
/// declared unconfirmed).
#[derive(Debug)]
struct Command {
    scope: LeaseScope,
    cancel: CancellationToken,
    done: CancellationToken,
}

#[derive(Default)]
struct State {
    closing: HashSet<LeaseScope>,
    unconfirmed: HashSet<LeaseScope>,
    /// The running commands, by number.
    commands: HashMap<u64, Command>,
    next_command: u64,
}

/// The lease registry of one provider instance.
#[derive(Default, Clone)]
pub struct Registry {
    state: Arc<Mutex<State>>,
}

impl State {
    /// Why the lease refuses new work, if it does: a release or destroy is
    /// running, or its cleanup is unconfirmed (only destroy is allowed).
    fn accepts_work(&self, scope: &LeaseScope) -> Result<(), Error> {
        match (self.closing.contains(scope), self.unconfirmed.contains(scope)) {
            (true, _) => Err(Error::CleanupInProgress),
            (false, true) => Err(Error::CleanupUnconfirmed),
            (false, false) => Ok(()),
        }
    }
}

impl Registry {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the sets inconsistent
        // (each operation is a single insert or remove), so poison is ignored.
        crate::lock(&self.state)
    }

    /// Marks the lease closing until the returned guard is dropped, or
    /// refuses with [`Error::CleanupInProgress`] if it already is.
    pub fn begin_closing(&self, scope: &LeaseScope) -> Result<impl Sized, Error> {
        if !self.lock().closing.insert(scope.clone()) {
            return Err(Error::CleanupInProgress);
        }
        let (registry, scope) = (self.clone(), scope.clone());
        Ok(scopeguard::guard((), move |()| {
            registry.lock().closing.remove(&scope);
        }))
    }

    /// Whether the lease accepts new work: the error says why it does not.
    pub fn accepts_work(&self, scope: &LeaseScope) -> Result<(), Error> {
        self.lock().accepts_work(scope)
    }

    /// True when the lease's cleanup is unconfirmed.
    pub fn is_unconfirmed(&self, scope: &LeaseScope) -> bool {
        self.lock().unconfirmed.contains(scope)
    }

    /// Marks the lease's cleanup unconfirmed: it can only be destroyed.
    /// Warns once, when the lease was not marked yet.
    pub fn mark_unconfirmed(&self, scope: &LeaseScope) {
        if self.lock().unconfirmed.insert(scope.clone()) {
            tracing::warn!(sandbox = %scope.sandbox_id, "CreateOS lease cleanup is unconfirmed");
        }
    }

    /// Clears the flag; only a confirmed delete may call this.
    pub fn clear_unconfirmed(&self, scope: &LeaseScope) {
        self.lock().unconfirmed.remove(scope);
    }

    /// Registers a command on the lease unless the lease refuses new work;
    /// the check and the registration are atomic, so a release that starts
    /// afterwards always sees the command. Returns the token cancelled when
    /// release or shutdown wants the command stopped, and a guard whose drop
    /// tells release the command finished.
    pub fn start_command(
        &self,
        scope: &LeaseScope,
        parent: &CancellationToken,
    ) -> Result<(CancellationToken, impl Sized + Send), Error> {
        let mut state = self.lock();
        state.accepts_work(scope)?;
        state.next_command += 1;
        let id = state.next_command;
        let (cancel, done) = (parent.child_token(), CancellationToken::new());
        state.commands.insert(id, Command { scope: scope.clone(), cancel: cancel.clone(), done });
        let registry = self.clone();
        let finished = scopeguard::guard((), move |()| {
            registry.lock().commands.remove(&id).inspect(|command| command.done.cancel());
        });
        Ok((cancel, finished))
    }

    /// Cancels every command on the lease and waits until each has finished
    /// its own cleanup (its process tree terminated, or marked unconfirmed).
    pub async fn stop_commands(&self, scope: &LeaseScope) {
        self.stop(|command| command == scope).await
    }

    /// Cancels every command on every lease and waits for each to finish.
    pub async fn stop_all_commands(&self) {
        self.stop(|_| true).await
    }

    async fn stop(&self, on: impl Fn(&LeaseScope) -> bool) {
        let waiting: Vec<CancellationToken> = (self.lock().commands.values())
            .filter(|command| on(&command.scope))
            .map(|command| {
                command.cancel.cancel();
                command.done.clone()
            })
            .collect();
        for done in waiting {
            done.cancelled().await;
        }
    }

    /// The number of commands running on all leases.
    pub fn active_commands(&self) -> usize {
        self.lock().commands.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scope(id: &str) -> LeaseScope {
        LeaseScope {
            origin: "http://127.0.0.1:1".into(),
            company_id: "c".into(),
            environment_id: "e".into(),
            sandbox_id: id.into(),
        }
    }

    #[test]
    fn closing_is_exclusive_and_released_on_drop() {
        let registry = Registry::default();
        let guard = registry.begin_closing(&scope("a")).expect("first release");
        assert!(registry.begin_closing(&scope("a")).is_err_and(|e| e == Error::CleanupInProgress));
        assert!(registry.begin_closing(&scope("b")).is_ok());
        assert_eq!(registry.accepts_work(&scope("a")), Err(Error::CleanupInProgress));
        drop(guard);
        assert_eq!(registry.accepts_work(&scope("a")), Ok(()));
    }

    #[test]
    fn commands_are_refused_on_closing_or_unconfirmed_leases() {
        let registry = Registry::default();
        let root = CancellationToken::new();
        registry.mark_unconfirmed(&scope("a"));
        assert_eq!(registry.start_command(&scope("a"), &root).err(), Some(Error::CleanupUnconfirmed));
        registry.clear_unconfirmed(&scope("a"));
        let _closing = registry.begin_closing(&scope("a")).unwrap();
        assert_eq!(registry.start_command(&scope("a"), &root).err(), Some(Error::CleanupInProgress));
    }

    #[test]
    fn a_confirmed_destroy_clears_the_flag_and_the_scope_takes_work_again() {
        let registry = Registry::default();
        let root = CancellationToken::new();
        registry.mark_unconfirmed(&scope("a"));
        registry.mark_unconfirmed(&scope("b"));
        assert_eq!(registry.accepts_work(&scope("a")), Err(Error::CleanupUnconfirmed));
        registry.clear_unconfirmed(&scope("a"));
        assert!(!registry.is_unconfirmed(&scope("a")));
        assert_eq!(registry.accepts_work(&scope("a")), Ok(()));
        assert!(registry.start_command(&scope("a"), &root).is_ok());
        // Only that lease: another keeps its flag.
        assert!(registry.is_unconfirmed(&scope("b")));
        assert_eq!(registry.start_command(&scope("b"), &root).err(), Some(Error::CleanupUnconfirmed));
    }

    /// Starts `n` commands on lease `a`, each of which, once cancelled,
    /// records its number and then finishes (drops its guard).
    fn commands_that_finish_when_cancelled(
        registry: &Registry,
        n: usize,
        finished: &Arc<Mutex<Vec<usize>>>,
    ) -> Vec<tokio::task::JoinHandle<()>> {
        let root = CancellationToken::new();
        (0..n)
            .map(|i| {
                let (cancel, guard) =
                    registry.start_command(&scope("a"), &root).expect("the lease takes work");
                let finished = Arc::clone(finished);
                tokio::spawn(async move {
                    cancel.cancelled().await;
                    finished.lock().unwrap().push(i);
                    drop(guard);
                })
            })
            .collect()
    }

    #[tokio::test]
    async fn each_of_many_commands_on_one_lease_is_tracked_until_it_finishes() {
        for n in [2, 16] {
            let registry = Registry::default();
            let root = CancellationToken::new();
            let finished = Arc::new(Mutex::new(Vec::new()));
            let early = registry.start_command(&scope("a"), &root).unwrap();
            let tasks = commands_that_finish_when_cancelled(&registry, n, &finished);
            assert_eq!(registry.active_commands(), n + 1);
            // One command ending leaves the others registered.
            drop(early);
            assert_eq!(registry.active_commands(), n, "{n} commands");
            // Release stops every one of them and returns only when each finished.
            registry.stop_commands(&scope("a")).await;
            let mut done = finished.lock().unwrap().clone();
            done.sort_unstable();
            assert_eq!(done, (0..n).collect::<Vec<_>>(), "{n} commands");
            for task in tasks {
                task.await.unwrap();
            }
            assert_eq!(registry.active_commands(), 0);
            assert_eq!(registry.accepts_work(&scope("a")), Ok(()));
        }
    }

    #[tokio::test]
    async fn shutdown_stops_the_commands_of_every_lease_and_waits_for_them() {
        let registry = Registry::default();
        let root = CancellationToken::new();
        let finished = Arc::new(Mutex::new(Vec::new()));
        let tasks = commands_that_finish_when_cancelled(&registry, 3, &finished);
        let (other_cancel, other) = registry.start_command(&scope("b"), &root).unwrap();
        let other_finished = Arc::clone(&finished);
        let other_task = tokio::spawn(async move {
            other_cancel.cancelled().await;
            other_finished.lock().unwrap().push(100);
            drop(other);
        });
        registry.stop_all_commands().await;
        let mut done = finished.lock().unwrap().clone();
        done.sort_unstable();
        assert_eq!(done, [0, 1, 2, 100]);
        for task in tasks.into_iter().chain([other_task]) {
            task.await.unwrap();
        }
        assert_eq!(registry.active_commands(), 0);
    }

    #[tokio::test]
    async fn stop_commands_cancels_and_waits_for_each_command() {
        let registry = Registry::default();
        let root = CancellationToken::new();
        let (cancel, command) = registry.start_command(&scope("a"), &root).unwrap();
        let (other_cancel, _other) = registry.start_command(&scope("b"), &root).unwrap();
        let finisher = tokio::spawn(async move {
            cancel.cancelled().await;
            drop(command);
        });
        registry.stop_commands(&scope("a")).await;
        finisher.await.unwrap();
        assert!(!other_cancel.is_cancelled(), "other leases keep running");
        assert_eq!(registry.active_commands(), 1);
    }
}
