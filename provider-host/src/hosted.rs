//! A provider as the host holds it: loaded into this process, or served by
//! a worker process ([`IsolatedProvider`], the `isolation` feature); the
//! same [`Provider`] trait and the same question, which hooks this host can
//! call on it.

#[cfg(feature = "isolation")]
use crate::isolation::{is_worker_failure, IsolatedProvider};
use crate::{loader::LoadedProvider, provider_set::ProviderSet};
use provider_abi::{Hook, Provider, ProviderError};
use std::path::PathBuf;

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

#[cfg(feature = "isolation")]
impl HookSupport for IsolatedProvider {
    /// The hooks of the library's table, but `grant_request_share`, which
    /// the worker protocol does not carry: an isolated provider keeps its
    /// whole request budget.
    fn supports(&self, hook: Hook) -> bool {
        IsolatedProvider::supports(self, hook)
    }

    /// A worker that died or was killed under the call.
    fn is_transport_failure(&self, error: &ProviderError) -> bool {
        is_worker_failure(error)
    }
}

/// A provider in process or out of process, chosen at run time.
// One per host, held for its whole run: the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
pub enum HostedProvider {
    /// Loaded into this process: nanoseconds a call; a crash is the host's.
    Loaded(LoadedProvider),
    /// Served by worker processes: microseconds a call; a crash is a
    /// worker's.
    #[cfg(feature = "isolation")]
    Isolated(IsolatedProvider),
    /// Loaded into this process, versions side by side and one active: a
    /// running host swaps between them.
    Set(ProviderSet),
}

impl HostedProvider {
    /// The library file the provider (its active version) came from.
    pub fn path(&self) -> PathBuf {
        match self {
            HostedProvider::Loaded(provider) => provider.path().to_path_buf(),
            #[cfg(feature = "isolation")]
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

    /// Runs `call` on the provider behind the enum.
    fn with<T>(&self, call: impl FnOnce(&dyn HookSupport) -> T) -> T {
        match self {
            HostedProvider::Loaded(provider) => call(provider),
            #[cfg(feature = "isolation")]
            HostedProvider::Isolated(provider) => call(provider),
            HostedProvider::Set(set) => call(set),
        }
    }
}

impl HookSupport for HostedProvider {
    fn supports(&self, hook: Hook) -> bool {
        self.with(|provider| provider.supports(hook))
    }

    fn is_transport_failure(&self, error: &ProviderError) -> bool {
        self.with(|provider| provider.is_transport_failure(error))
    }
}

crate::forward::forward_provider!(HostedProvider, with);
