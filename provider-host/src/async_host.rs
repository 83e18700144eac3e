//! An async facade for tokio hosts: each hook is awaited without blocking
//! the runtime. Today's ABI hooks block their calling thread, so a call runs
//! on tokio's blocking pool (`spawn_blocking`); `execute` hands its output
//! over a channel as it arrives, so a host can stream it while awaiting the
//! result.

use provider_abi::{
    AcquireParams, EnvironmentParams, ExecuteParams, ExecuteResult, HealthReport, HookResult, Lease,
    LeaseParams, OutputSink, OutputStream, ProbeReport, Provider, ProviderError, ValidationReport, Workspace,
};
use std::{future::Future, sync::Arc};
use tokio::sync::mpsc;

/// A provider whose hooks are `async`.
pub struct AsyncProvider<P: ?Sized> {
    inner: Arc<P>,
}

impl<P: ?Sized> Clone for AsyncProvider<P> {
    fn clone(&self) -> Self {
        AsyncProvider { inner: Arc::clone(&self.inner) }
    }
}

/// A running `execute`: its output as it arrives, and its result.
pub struct Execution {
    /// Chunks in the order the provider delivered them; closed when the
    /// command ends.
    pub output: mpsc::UnboundedReceiver<(OutputStream, String)>,
    result: tokio::task::JoinHandle<HookResult<ExecuteResult>>,
}

impl Execution {
    /// The command's result, once it ended.
    pub async fn result(self) -> HookResult<ExecuteResult> {
        self.result.await.unwrap_or_else(|error| Err(task_failed(error)))
    }
}

fn task_failed(error: tokio::task::JoinError) -> ProviderError {
    ProviderError::internal(format!(
        "the hook's task failed: {}",
        if error.is_panic() { "panic" } else { "cancelled" }
    ))
}

impl<P: Provider + ?Sized> AsyncProvider<P> {
    /// Wraps a shared provider (a `LoadedProvider`, a `ProviderSet`...).
    pub fn new(provider: Arc<P>) -> Self {
        AsyncProvider { inner: provider }
    }

    /// The provider itself, for blocking calls.
    pub fn blocking(&self) -> &Arc<P> {
        &self.inner
    }

    /// Runs `hook` on the blocking pool.
    fn call<T: Send + 'static>(
        &self,
        hook: impl FnOnce(&P) -> HookResult<T> + Send + 'static,
    ) -> impl Future<Output = HookResult<T>> + Send + 'static {
        let inner = Arc::clone(&self.inner);
        let task = tokio::task::spawn_blocking(move || hook(&inner));
        async move { task.await.unwrap_or_else(|error| Err(task_failed(error))) }
    }

    /// `health`.
    pub async fn health(&self) -> HookResult<HealthReport> {
        self.call(|provider| provider.health()).await
    }

    /// `validate_config`.
    pub async fn validate_config(&self, params: EnvironmentParams) -> HookResult<ValidationReport> {
        self.call(move |provider| provider.validate_config(&params)).await
    }

    /// `probe`.
    pub async fn probe(&self, params: EnvironmentParams) -> HookResult<ProbeReport> {
        self.call(move |provider| provider.probe(&params)).await
    }

    /// `acquire_lease`.
    pub async fn acquire_lease(&self, params: AcquireParams) -> HookResult<Lease> {
        self.call(move |provider| provider.acquire_lease(&params)).await
    }

    /// `resume_lease`.
    pub async fn resume_lease(&self, params: LeaseParams) -> HookResult<Lease> {
        self.call(move |provider| provider.resume_lease(&params)).await
    }

    /// `release_lease`.
    pub async fn release_lease(&self, params: LeaseParams) -> HookResult<()> {
        self.call(move |provider| provider.release_lease(&params)).await
    }

    /// `destroy_lease`.
    pub async fn destroy_lease(&self, params: LeaseParams) -> HookResult<()> {
        self.call(move |provider| provider.destroy_lease(&params)).await
    }

    /// `realize_workspace`.
    pub async fn realize_workspace(&self, params: LeaseParams) -> HookResult<Workspace> {
        self.call(move |provider| provider.realize_workspace(&params)).await
    }

    /// Starts `execute`: await [`Execution::result`] for its result, and
    /// read [`Execution::output`] meanwhile for its output as it arrives.
    pub fn execute(&self, params: ExecuteParams) -> Execution
    where
        P: 'static,
    {
        let (sender, output) = mpsc::unbounded_channel();
        let inner = Arc::clone(&self.inner);
        let result = tokio::task::spawn_blocking(move || {
            let mut forward =
                |stream: OutputStream, chunk: &str| drop(sender.send((stream, chunk.to_owned())));
            inner.execute(&params, &mut OutputSink::new(&mut forward))
        });
        Execution { output, result }
    }
}
