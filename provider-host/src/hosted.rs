//! A provider as the host holds it: loaded into this process, or served
//! elsewhere (a worker process the embedder plugs in behind
//! [`OutOfProcess`]); the same [`Provider`] trait and the same question,
//! which hooks this host can call on it.

use crate::{loader::LoadedProvider, provider_set::ProviderSet};
use provider_abi::{Hook, Provider, ProviderError};
use std::path::{Path, PathBuf};

/// A provider the host can ask which hooks it can call: the optional ones
/// are in its table or not.
pub trait HookSupport: Provider {
    /// True when this host can call `hook` on the provider.
    fn supports(&self, hook: Hook) -> bool;

    /// True when `error` says the way to the provider failed (a worker
    /// process died under the call), not the provider: whatever the hook
    /// had started, its cleanup is unknown.
    fn is_transport_failure(&self, _error: &ProviderError) -> bool {
        false
    }
}

impl HookSupport for LoadedProvider {
    fn supports(&self, hook: Hook) -> bool {
        LoadedProvider::supports(self, hook)
    }
}

/// A provider served outside this process (host-harness plugs in its
/// worker-process isolation here).
pub trait OutOfProcess: HookSupport {
    /// The library file the provider came from.
    fn library(&self) -> &Path;

    /// How many times the process serving it crashed.
    fn crashes(&self) -> u64;

    /// The provider as the host calls it (`self`).
    fn hooks(&self) -> &dyn HookSupport;
}

/// A provider in process or out of process, chosen at run time.
// One per host, held for its whole run: the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
pub enum HostedProvider {
    /// Loaded into this process: nanoseconds a call; a crash is the host's.
    Loaded(LoadedProvider),
    /// Served by another process (a worker): microseconds a call; a crash is
    /// that process's.
    Isolated(Box<dyn OutOfProcess>),
    /// Loaded into this process, versions side by side and one active: a
    /// running host swaps between them.
    Set(ProviderSet),
}

impl HostedProvider {
    /// The library file the provider (its active version) came from.
    pub fn path(&self) -> PathBuf {
        match self {
            HostedProvider::Loaded(provider) => provider.path().to_path_buf(),
            HostedProvider::Isolated(provider) => provider.library().to_path_buf(),
            HostedProvider::Set(set) => set.active().path().to_path_buf(),
        }
    }

    /// The same provider, swappable: a loaded one becomes the first version
    /// of a [`ProviderSet`]; one out of process stays as it is.
    pub fn swappable(self) -> HostedProvider {
        match self {
            HostedProvider::Loaded(provider) => HostedProvider::Set(ProviderSet::new(provider)),
            other => other,
        }
    }

    /// The provider set, when the provider is swappable.
    pub fn provider_set(&self) -> Option<&ProviderSet> {
        match self {
            HostedProvider::Set(set) => Some(set),
            _ => None,
        }
    }

    /// The provider behind the enum.
    fn inner(&self) -> &dyn HookSupport {
        match self {
            HostedProvider::Loaded(provider) => provider,
            HostedProvider::Isolated(provider) => provider.hooks(),
            HostedProvider::Set(set) => set,
        }
    }
}

impl HookSupport for HostedProvider {
    fn supports(&self, hook: Hook) -> bool {
        self.inner().supports(hook)
    }

    fn is_transport_failure(&self, error: &ProviderError) -> bool {
        self.inner().is_transport_failure(error)
    }
}

crate::forward::forward_provider!(HostedProvider, |this| this.inner());
