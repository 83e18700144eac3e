//! Versions side by side, hot swap and drain.
//!
//! A [`ProviderSet`] holds the loaded versions of one provider and one active
//! version, and is itself a [`Provider`]: each hook call goes to the version
//! active when the call starts and finishes there. [`ProviderSet::swap_to`]
//! makes a newly loaded version active at once; the old version is *retired*,
//! and once its last call in flight returns it gets `shutdown` (on a thread
//! of its own, so that call returns at once) and its instance is dropped
//! (its library stays mapped: abi_stable never unloads).
//!
//! The active version sits behind a `RwLock<Arc<_>>`: a call holds the read
//! lock only to clone the `Arc`, a swap holds the write lock only to replace
//! it, so a swap adds no more than a lock hand-over to a concurrent call.

use crate::{loader::LoadedProvider, lock, read, write};
use provider_abi::{Hook, HookFuture, HookResult, LeaseParams, Manifest, Provider};
use scopeguard::guard;
use std::{
    path::PathBuf,
    sync::{
        atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering},
        Arc, Mutex, RwLock,
    },
    time::{Duration, Instant},
};

/// One loaded version and the calls it has in flight.
pub struct Version {
    provider: Mutex<Option<Arc<LoadedProvider>>>,
    manifest: Manifest,
    path: PathBuf,
    in_flight: AtomicUsize,
    retired: AtomicBool,
}

impl Version {
    fn new(provider: LoadedProvider) -> Self {
        Version {
            manifest: provider.manifest(),
            path: provider.path().to_path_buf(),
            provider: Mutex::new(Some(Arc::new(provider))),
            in_flight: AtomicUsize::new(0),
            retired: AtomicBool::new(false),
        }
    }

    /// The provider's id (from its manifest).
    pub fn id(&self) -> &str {
        &self.manifest.id
    }

    /// Where the library was loaded from.
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// Calls in flight on this version.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    /// True once a swap replaced this version.
    pub fn is_retired(&self) -> bool {
        self.retired.load(Ordering::SeqCst)
    }

    /// True once the retired version has no call in flight and was shut down.
    pub fn is_drained(&self) -> bool {
        lock(&self.provider).is_none()
    }

    fn loaded(&self) -> Arc<LoadedProvider> {
        Arc::clone(
            lock(&self.provider)
                .as_ref()
                .expect("a version is dropped only once drained, after its last call"),
        )
    }

    /// Hands `leases` to this version as unconfirmed; returns how many it took.
    fn import(&self, leases: &[LeaseParams]) -> usize {
        let provider = self.loaded();
        leases.iter().filter(|lease| crate::unconfirmed_handover::hand_over(&*provider, lease)).count()
    }

    /// Grants this version `share` of its request budget (0: none granted
    /// yet; a version without the hook keeps its whole budget).
    fn grant_share(&self, share: u32) {
        let provider = self.loaded();
        if share > 0 && provider.supports(Hook::GrantRequestShare) {
            let _ = provider.grant_request_share(share).inspect_err(|error| {
                tracing::warn!(version = %self.manifest.version, kind = %error.kind, "the new version did not take its request share");
            });
        }
    }

    /// Shuts a retired version down once nothing runs on it, exactly once
    /// (whoever takes its instance).
    fn drain_if_idle(&self) {
        if !self.is_retired() || self.in_flight() > 0 {
            return;
        }
        let Some(provider) = lock(&self.provider).take() else { return };
        // Off the path of the call that drained it, which returns at once;
        // in place only when no thread can be started.
        let (background, version) = (Arc::clone(&provider), self.manifest.version.to_string());
        let spawned =
            std::thread::Builder::new().name("drain".into()).spawn(move || shut_down(&background, &version));
        if spawned.is_err() {
            shut_down(&provider, &self.manifest.version);
        }
    }
}

/// Shuts a drained version down, logging a failure.
fn shut_down(provider: &LoadedProvider, version: &str) {
    if let Err(error) = provider.shutdown() {
        tracing::warn!(%version, kind = %error.kind, "a drained version's shutdown failed");
    }
}

/// Why a swap was refused; the active version stays in place.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SwapError {
    /// The new library is another provider.
    #[error("cannot swap provider `{active}` for a library of provider `{offered}`")]
    OtherProvider {
        /// The active provider's id.
        active: String,
        /// The offered library's provider id.
        offered: String,
    },
    /// The set already retains as many versions as it may.
    #[error("cannot swap: {limit} versions are retained with calls still in flight")]
    TooManyVersions {
        /// The bound.
        limit: usize,
    },
}

/// What one swap did.
#[derive(Debug, Clone, PartialEq)]
pub struct SwapReport {
    /// The version that was active.
    pub from: String,
    /// The version now active.
    pub to: String,
    /// Calls the old version still had in flight at the swap (they finish there).
    pub draining: usize,
    /// How long the swap held the lock new calls wait on.
    pub blocked_for: Duration,
    /// Unconfirmed leases the new version took over before its first call
    /// (`import_unconfirmed`; 0 when it lacks the hook).
    pub imported: usize,
    /// Memory entries the new version took from the old one before its
    /// first call (`export_memory` and `import_memory`, [`crate::memory`];
    /// 0 when either lacks its hook).
    pub remembered: usize,
}

/// The loaded versions of one provider, one of them active.
pub struct ProviderSet {
    active: RwLock<Arc<Version>>,
    retained: Mutex<Vec<Arc<Version>>>,
    limit: usize,
    swaps: AtomicU64,
    /// The request share last granted (ppm; 0: none), which a newly active
    /// version gets before its first call.
    share: AtomicU32,
}

/// How many versions a set retains (active and draining) by default.
pub const DEFAULT_RETAINED_VERSIONS: usize = 8;

impl ProviderSet {
    /// A set whose active version is `provider`.
    pub fn new(provider: LoadedProvider) -> Self {
        Self::with_limit(provider, DEFAULT_RETAINED_VERSIONS)
    }

    /// A set retaining at most `limit` versions with calls in flight.
    pub fn with_limit(provider: LoadedProvider, limit: usize) -> Self {
        let first = Arc::new(Version::new(provider));
        ProviderSet {
            active: RwLock::new(Arc::clone(&first)),
            retained: Mutex::new(vec![first]),
            limit: limit.max(1),
            swaps: AtomicU64::new(0),
            share: AtomicU32::new(0),
        }
    }

    /// The active version.
    pub fn active(&self) -> Arc<Version> {
        Arc::clone(&read(&self.active))
    }

    /// How many swaps happened.
    pub fn swaps(&self) -> u64 {
        self.swaps.load(Ordering::SeqCst)
    }

    /// The versions still retained (the active one and those draining).
    pub fn versions(&self) -> Vec<Arc<Version>> {
        lock(&self.retained).clone()
    }

    /// Makes `next` the active version: new calls go to it at once, calls
    /// already running on the old one finish there, and the old one is shut
    /// down when its last call returns. Refused (the active version stays)
    /// when `next` is another provider, or when too many versions are still
    /// draining.
    pub fn swap_to(&self, next: LoadedProvider) -> Result<SwapReport, SwapError> {
        self.swap_to_importing(next, &[])
    }

    /// Like [`ProviderSet::swap_to`], first handing `unconfirmed` (the
    /// leases the host knows as unconfirmed, see [`crate::unconfirmed_handover`]) to the
    /// new version through `import_unconfirmed`, before it takes any call,
    /// so the version itself refuses to reuse them. A lease the new version
    /// does not accept is logged; the host's own ledger check still stands.
    pub fn swap_to_importing(
        &self,
        next: LoadedProvider,
        unconfirmed: &[LeaseParams],
    ) -> Result<SwapReport, SwapError> {
        let next = Arc::new(Version::new(next));
        let mut retained = lock(&self.retained);
        retained.retain(|version| !version.is_drained());
        let current = self.active();
        if next.manifest.id != current.manifest.id {
            return Err(SwapError::OtherProvider {
                active: current.manifest.id.to_string(),
                offered: next.manifest.id.to_string(),
            });
        }
        if retained.len() >= self.limit {
            return Err(SwapError::TooManyVersions { limit: self.limit });
        }
        let imported = next.import(unconfirmed);
        let remembered = crate::memory::hand_over(&*current.loaded(), &*next.loaded());
        next.grant_share(self.share.load(Ordering::SeqCst));
        retained.push(Arc::clone(&next));
        drop(retained);
        let started = Instant::now();
        let old = {
            let mut active = write(&self.active);
            std::mem::replace(&mut *active, Arc::clone(&next))
        };
        let blocked_for = started.elapsed();
        old.retired.store(true, Ordering::SeqCst);
        let draining = old.in_flight();
        old.drain_if_idle();
        self.swaps.fetch_add(1, Ordering::SeqCst);
        tracing::info!(from = %old.manifest.version, to = %next.manifest.version, draining, "swapped provider version");
        Ok(SwapReport {
            from: old.manifest.version.to_string(),
            to: next.manifest.version.to_string(),
            draining,
            blocked_for,
            imported,
            remembered,
        })
    }

    /// Runs `call` on the active version, counting it in flight there until
    /// it returns.
    pub fn call<T>(&self, call: impl FnOnce(&LoadedProvider) -> T) -> T {
        let (provider, _in_flight) = self.enter();
        call(&provider)
    }

    /// Starts an async hook on the active version, counting it in flight
    /// there until its future completes or is dropped (a retired version is
    /// drained only after that).
    pub fn call_async<T: Send + 'static>(
        &self,
        call: impl FnOnce(&LoadedProvider) -> HookFuture<T>,
    ) -> HookFuture<T> {
        let entered = self.enter();
        let future = call(&entered.0);
        Box::pin(async move {
            let outcome = future.await;
            drop(entered);
            outcome
        })
    }

    /// A call in flight on the active version: its instance, and what
    /// counts the call there until dropped (then drains a retired version
    /// it was the last call of).
    fn enter(&self) -> (Arc<LoadedProvider>, impl Send + 'static) {
        let version = {
            let active = read(&self.active);
            active.in_flight.fetch_add(1, Ordering::SeqCst);
            Arc::clone(&active)
        };
        let in_flight = guard(version, |version| {
            version.in_flight.fetch_sub(1, Ordering::SeqCst);
            version.drain_if_idle();
        });
        (in_flight.loaded(), in_flight)
    }
}

impl Provider for ProviderSet {
    fn manifest(&self) -> Manifest {
        self.active().manifest.clone()
    }

    /// Shuts every version not drained yet down; the first failure.
    fn shutdown(&self) -> HookResult<()> {
        self.versions()
            .iter()
            .filter_map(|version| lock(&version.provider).clone())
            .map(|provider| provider.shutdown())
            .fold(Ok(()), Result::and)
    }

    /// Granted to the active version, and remembered for the versions
    /// swapped in later.
    fn grant_request_share(&self, parts_per_million: u32) -> HookResult<()> {
        self.share.store(parts_per_million, Ordering::SeqCst);
        self.call(|provider| provider.grant_request_share(parts_per_million))
    }

    crate::forward::forward_provider!(@hooks call, call_async);
}

impl crate::hosted::HookSupport for ProviderSet {
    /// True when the active version can answer `hook`.
    fn supports(&self, hook: Hook) -> bool {
        self.call(|provider| provider.supports(hook))
    }
}
