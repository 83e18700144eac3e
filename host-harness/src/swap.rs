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
use provider_abi::Provider;
use provider_host::{
    loader::LoadedProvider,
    pin_file::LockFile,
    provider_set::{ProviderSet, SwapError},
    staging::Staging,
    store::LeaseStore,
    sweep::SweepSecrets,
    unconfirmed_handover::unconfirmed_leases,
};
use std::{
    path::{Path, PathBuf},
    sync::{Mutex, MutexGuard},
    time::Duration,
};

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

/// Swaps a run's provider set on request and keeps what the swaps did; one
/// swap or check at a time.
#[derive(Default)]
pub struct Swapper(Mutex<Swaps>);

#[derive(Default)]
struct Swaps {
    /// The secrets lent to the unconfirmed leases handed to a new version.
    secrets: SweepSecrets,
    /// The directory of the new builds' copies, made on first use.
    staging: Option<Staging>,
    figures: SwapFigures,
}

impl Swaps {
    /// Checks `library` as a swap of `set` to it would (staged, pinned by
    /// `lock` when one applies, loaded, the same provider), without
    /// swapping. Returns the loaded version, not yet set up, and the
    /// library's canonical path.
    fn check(
        &mut self,
        set: &ProviderSet,
        library: &Path,
        lock: Option<&LockFile>,
    ) -> Result<(LoadedProvider, PathBuf), String> {
        if self.staging.is_none() {
            self.staging = Staging::new().ok();
        }
        let staging = self.staging.as_ref().ok_or("cannot create a directory for the new build's copy")?;
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
}

impl Swapper {
    fn swaps(&self) -> MutexGuard<'_, Swaps> {
        self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The configuration whose secrets the unconfirmed leases handed to a new
    /// version are lent (rows of the same account only), once the run knows it.
    pub fn lend_secrets(&self, secrets: SweepSecrets) {
        self.swaps().secrets = secrets;
    }

    /// Checks `library` as a swap of `set` to it would, without swapping: a
    /// mistyped `--swap-to` is refused before the first lifecycle rather
    /// than at every swap.
    pub fn check(&self, set: &ProviderSet, library: &Path, lock: Option<&LockFile>) -> Result<(), String> {
        self.swaps().check(set, library, lock).map(drop)
    }

    /// Swaps `set` to `library`, handing the new version the leases `store`
    /// knows as unconfirmed first, and says the outcome in one line on
    /// stderr, naming what asked for it (`SIGHUP`, `--swap-to`). Refused,
    /// with the active version left in place, when `lock` does not pin the
    /// library, when it does not load (another ABI major version, not a
    /// provider...) or when it is another provider.
    pub fn swap(
        &self,
        cause: &str,
        set: &ProviderSet,
        library: &Path,
        lock: Option<&LockFile>,
        store: &dyn LeaseStore,
    ) {
        let mut swaps = self.swaps();
        let unconfirmed = unconfirmed_leases(store, set, &swaps.secrets).map_err(|error| error.to_string());
        let outcome = unconfirmed.and_then(|unconfirmed| {
            let (next, path) = swaps.check(set, library, lock)?;
            set_up(&next, &path).map_err(|error| error.to_string())?;
            set.swap_to_importing(next, &unconfirmed).map_err(|error| error.to_string())
        });
        let figures = &mut swaps.figures;
        match outcome {
            Ok(report) => {
                eprintln!(
                    "{cause}: swapped provider version {} -> {} ({} calls draining on the old one; {} unconfirmed leases handed over)",
                    report.from, report.to, report.draining, report.imported
                );
                figures.done += 1;
                figures.drained.push(report.draining);
                figures.longest_wait = figures.longest_wait.max(report.blocked_for);
            }
            Err(reason) => {
                eprintln!("{cause}: swap refused: {reason}; the active version stays");
                figures.refused += 1;
            }
        }
    }

    /// The figures of the swaps so far.
    pub fn figures(&self) -> SwapFigures {
        self.swaps().figures.clone()
    }
}
