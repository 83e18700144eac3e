//! Swapping a running host's provider to the library at a path (`soak
//! --swap-to`, and `SIGHUP` in `soak` and `lifecycle`).
//!
//! The library is checked as at load: staged as a private copy named by its
//! SHA-256 ([`provider_host::staging`]: opened non-blocking, regular files
//! only), that hash pinned by the lock file when one applies, then the copy
//! loaded (ABI, layout, provider id), set up, and made the active version of
//! the [`ProviderSet`]. A new build dropped at the same path is a new
//! version, and swapping back to a build already loaded reuses its copy (a
//! process never loads two files from one path).

use crate::plugin::set_up;
use provider_abi::{LeaseParams, Provider};
use provider_host::{
    loader::{LoadError, LoadedProvider},
    pin_file::LockFile,
    provider_set::{ProviderSet, SwapError, SwapReport},
    staging::Staging,
    store::LeaseStore,
    sweep::SweepSecrets,
    unconfirmed_handover::unconfirmed_leases,
};
use std::{
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicUsize, Ordering},
        Mutex,
    },
    time::Duration,
};

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
    let (next, path) = check_library(set, library, staging, lock)?;
    set_up(&next).map_err(|error| LoadError::ProviderFailed { path, error }.to_string())?;
    set.swap_to_importing(next, unconfirmed).map_err(|error| error.to_string())
}

/// Checks `library` as a swap of `set` to it would (staged, pinned by
/// `lock` when one applies, loaded, the same provider), without swapping: a
/// mistyped `--swap-to` is refused before the first lifecycle rather than
/// at every swap. Returns the loaded version, not yet set up, and the
/// library's canonical path.
pub fn check_library(
    set: &ProviderSet,
    library: &Path,
    staging: &Staging,
    lock: Option<&LockFile>,
) -> Result<(LoadedProvider, PathBuf), String> {
    let staged = staging.stage(library).map_err(|error| error.to_string())?;
    if let Some(lock) = lock {
        lock.pin_of(library, staged.sha256()).map_err(|error| error.to_string())?;
    }
    let next = staged.load().map_err(|error| error.to_string())?;
    let (offered, active) = (next.manifest().id.to_string(), set.active().id().to_owned());
    if offered != active {
        return Err(SwapError::OtherProvider { active, offered }.to_string());
    }
    Ok((next, staged.source().to_path_buf()))
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

    /// Checks `library` as a swap to it would ([`check_library`]).
    pub fn check(&self, set: &ProviderSet, library: &Path, lock: Option<&LockFile>) -> Result<(), String> {
        self.with_staging(|staging| check_library(set, library, staging, lock).map(drop))
    }

    /// Runs `work` with this swapper's staging directory, made on first use.
    fn with_staging<T>(&self, work: impl FnOnce(&Staging) -> Result<T, String>) -> Result<T, String> {
        let mut staging = self.staging.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if staging.is_none() {
            *staging = Staging::new().ok();
        }
        match staging.as_ref() {
            Some(staging) => work(staging),
            None => Err("cannot create a directory for the new build's copy".to_owned()),
        }
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
            unconfirmed.and_then(|unconfirmed| {
                self.with_staging(|staging| swap_to_library(set, library, staging, lock, &unconfirmed))
            })
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
