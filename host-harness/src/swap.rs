//! Swapping a running host's provider to the library at a path (`soak
//! --swap-to`, and `SIGHUP` in `soak` and `lifecycle`).
//!
//! The library is checked as at load: pinned by the lock file when one
//! applies, then loaded (ABI, layout, provider id) and set up, and made the
//! active version of the [`ProviderSet`]. A process never loads two files
//! from one path (a library is never unloaded, and the dynamic loader would
//! hand back the first), so each build is loaded from a private copy named
//! by its SHA-256: a new build dropped at the same path is a new version,
//! and swapping back to a build already loaded reuses its copy.

use crate::plugin::load_provider;
use provider_abi::LeaseParams;
use provider_host::{
    handover::unconfirmed_leases,
    lock::{file_sha256, LockFile},
    provider_set::{ProviderSet, SwapReport},
    store::LeaseStore,
    sweep::SweepSecrets,
};
use std::{
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicUsize, Ordering},
        Mutex,
    },
    time::Duration,
};

/// The private copies of the builds this process swapped to, removed when
/// the process ends (each stays mapped while it runs).
pub struct Staging {
    dir: tempfile::TempDir,
}

impl Staging {
    /// A new staging directory under the system's temporary directory.
    pub fn new() -> std::io::Result<Staging> {
        Ok(Staging { dir: tempfile::Builder::new().prefix("host-harness-swap-").tempdir()? })
    }

    /// Copies `library` into the staging directory (once per build) and
    /// returns the copy and its SHA-256.
    fn stage(&self, library: &Path) -> Result<(PathBuf, String), String> {
        let name = library.file_name().map(|name| name.to_string_lossy().into_owned()).unwrap_or_default();
        let read_error = |error: std::io::Error| format!("cannot read {}: {error}", library.display());
        let incoming = tempfile::NamedTempFile::new_in(self.dir.path()).map_err(|error| error.to_string())?;
        std::fs::copy(library, incoming.path()).map_err(read_error)?;
        let sha256 = file_sha256(incoming.path()).map_err(read_error)?;
        let staged = self.dir.path().join(format!("{}-{name}", &sha256[..16]));
        if !staged.exists() {
            incoming.persist(&staged).map_err(|error| error.error.to_string())?;
        }
        Ok((staged, sha256))
    }
}

/// Swaps `set` to the library at `library`: refused, in one line and with
/// the active version left in place, when `lock` does not pin it, when it
/// does not load (another ABI major version, not a provider...) or when it is
/// another provider. The new version takes over `unconfirmed` first.
pub fn swap_to_library(
    set: &ProviderSet,
    library: &Path,
    staging: &Staging,
    lock: Option<&LockFile>,
    unconfirmed: &[LeaseParams],
) -> Result<SwapReport, String> {
    let pinned = match lock {
        Some(lock) => Some(lock.verify(library).map_err(|error| error.to_string())?.sha256.clone()),
        None => None,
    };
    let (staged, sha256) = staging.stage(library)?;
    if pinned.is_some_and(|pinned| pinned != sha256) {
        return Err(format!("{} changed while it was being read", library.display()));
    }
    let next = load_provider(Some(&staged)).map_err(|error| {
        error.to_string().replace(&staged.display().to_string(), &library.display().to_string())
    })?;
    set.swap_to_importing(next, unconfirmed).map_err(|error| error.to_string())
}

/// Swaps a run's provider set on request and keeps what the swaps did.
#[derive(Default)]
pub struct Swapper {
    secrets: Mutex<SweepSecrets>,
    staging: Mutex<Option<Staging>>,
    reports: Mutex<Vec<SwapReport>>,
    refused: AtomicUsize,
}

/// What a run's swaps did, for its summary.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SwapFigures {
    /// Swaps done.
    pub done: usize,
    /// Swaps refused (the active version stayed).
    pub refused: usize,
    /// Calls still in flight on the old version at each swap (they finished there).
    pub drained: Vec<usize>,
    /// The longest time a new call waited because of a swap.
    pub longest_wait: Duration,
}

impl Swapper {
    /// The configuration whose secrets the unconfirmed leases handed to a new
    /// version are lent (rows of the same account only), once the run knows it.
    pub fn lend_secrets(&self, secrets: SweepSecrets) {
        *self.secrets.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = secrets;
    }

    /// Swaps `set` to `library` ([`swap_to_library`]), handing the new
    /// version the leases `store` knows as unconfirmed, and says the outcome
    /// in one line on stderr, naming what asked for it (`SIGHUP`, `--swap-to`).
    pub fn swap(
        &self,
        cause: &str,
        set: &ProviderSet,
        library: &Path,
        lock: Option<&LockFile>,
        store: &dyn LeaseStore,
    ) {
        let outcome = {
            let secrets = self.secrets.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone();
            let unconfirmed = unconfirmed_leases(store, set, &secrets).map_err(|error| error.to_string());
            let mut staging = self.staging.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            if staging.is_none() {
                *staging = Staging::new().ok();
            }
            match (staging.as_ref(), unconfirmed) {
                (Some(staging), Ok(unconfirmed)) => {
                    swap_to_library(set, library, staging, lock, &unconfirmed)
                }
                (None, _) => Err("cannot create a directory for the new build's copy".to_owned()),
                (_, Err(error)) => Err(error),
            }
        };
        match outcome {
            Ok(report) => {
                eprintln!(
                    "{cause}: swapped provider version {} -> {} ({} calls draining on the old one; {} unconfirmed leases handed over)",
                    report.from, report.to, report.draining, report.imported
                );
                self.reports.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).push(report);
            }
            Err(reason) => {
                eprintln!("{cause}: swap refused: {reason}; the active version stays");
                self.refused.fetch_add(1, Ordering::SeqCst);
            }
        }
    }

    /// The figures of the swaps so far.
    pub fn figures(&self) -> SwapFigures {
        let reports = self.reports.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        SwapFigures {
            done: reports.len(),
            refused: self.refused.load(Ordering::SeqCst),
            drained: reports.iter().map(|report| report.draining).collect(),
            longest_wait: reports.iter().map(|report| report.blocked_for).max().unwrap_or_default(),
        }
    }
}
