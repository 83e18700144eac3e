//! Plugs the worker-process provider ([`crate::isolation`]) into the host
//! library's [`HostedProvider`](crate::hosted::HostedProvider).

use crate::isolation::{is_worker_failure, IsolatedProvider};
use provider_abi::{Hook, ProviderError};
use provider_host::hosted::{HookSupport, OutOfProcess};
use std::path::Path;

impl HookSupport for IsolatedProvider {
    /// The hooks of the library's table, but `grant_request_share`, which
    /// the worker protocol does not carry: an isolated provider keeps its
    /// whole request budget.
    fn supports(&self, hook: Hook) -> bool {
        IsolatedProvider::supports(self, hook)
    }

    fn is_transport_failure(&self, error: &ProviderError) -> bool {
        is_worker_failure(error)
    }
}

impl OutOfProcess for IsolatedProvider {
    fn library(&self) -> &Path {
        IsolatedProvider::library(self)
    }

    fn crashes(&self) -> u64 {
        IsolatedProvider::crashes(self)
    }

    fn hooks(&self) -> &dyn HookSupport {
        self
    }
}
