//! An async facade for tokio hosts: each hook is awaited without blocking
//! the runtime.
//!
//! With a provider that has the async hooks (ABI 1.7; file sync from 1.8) a
//! call takes no thread of the host's: the provider runs the work on its own
//! runtime and the host awaits an FFI-safe future. Dropping the future
//! cancels the call with the guarantees release gives (see
//! `Provider::acquire_lease_async`...). With an older provider (or one out of
//! process) the call falls back to tokio's blocking pool, at most
//! [`BLOCKING_CALLS`] at a time per facade, so the
//! threads a host pays stay bounded whatever the concurrency. `execute` hands
//! its output over a channel as it arrives, so a host can stream it while
//! awaiting the result.

use provider_abi::{
    unsupported, AcquireParams, ByteSink, EnvironmentParams, ExecuteParams, ExecuteResult, HealthReport,
    Hook, HookFuture, HookResult, Lease, LeaseParams, OutputSink, OutputStream, OwnedByteSink, ProbeReport,
    Provider, ProviderError, ReleaseReport, SyncParams, SyncResult, ValidationReport, Workspace,
};
use std::{future::Future, sync::Arc};
use tokio::sync::{mpsc, Semaphore};

/// How many blocking calls one facade runs at once when a hook has no async
/// variant (calls beyond it wait for a slot, holding no thread).
pub const BLOCKING_CALLS: usize = 64;

/// A provider whose hooks are `async`.
pub struct AsyncProvider<P: ?Sized> {
    inner: Arc<P>,
    blocking: Arc<Semaphore>,
}

impl<P: ?Sized> Clone for AsyncProvider<P> {
    fn clone(&self) -> Self {
        AsyncProvider { inner: Arc::clone(&self.inner), blocking: Arc::clone(&self.blocking) }
    }
}

/// A running `execute`: its output as it arrives, and its result.
pub struct Execution {
    /// Chunks as the command wrote them, in the order the provider delivered
    /// them; closed when the command ends.
    pub output: mpsc::UnboundedReceiver<(OutputStream, Vec<u8>)>,
    result: HookFuture<ExecuteResult>,
}

impl Execution {
    /// The command's result, once it ended. Dropping the execution before
    /// then cancels the command (through the async hook; a blocking
    /// fallback runs to its end).
    pub async fn result(self) -> HookResult<ExecuteResult> {
        self.result.await
    }
}

fn task_failed(error: tokio::task::JoinError) -> ProviderError {
    ProviderError::internal(format!(
        "the hook's task failed: {}",
        if error.is_panic() { "panic" } else { "cancelled" }
    ))
}

/// True when `result` is the answer of a provider without `hook`: nothing
/// ran, so the host may call the blocking variant instead.
pub(crate) fn lacks<T>(result: &HookResult<T>, hook: Hook) -> bool {
    matches!(result, Err(error) if *error == unsupported(hook))
}

impl<P: Provider + ?Sized + 'static> AsyncProvider<P> {
    /// Wraps a shared provider (a `LoadedProvider`, a `ProviderSet`...).
    pub fn new(provider: Arc<P>) -> Self {
        AsyncProvider { inner: provider, blocking: Arc::new(Semaphore::new(BLOCKING_CALLS)) }
    }

    /// The provider itself, for blocking calls.
    pub fn blocking(&self) -> &Arc<P> {
        &self.inner
    }

    /// Runs `hook` on the blocking pool once one of the facade's
    /// [`BLOCKING_CALLS`] slots is free.
    fn call<T: Send + 'static>(
        &self,
        hook: impl FnOnce(&P) -> HookResult<T> + Send + 'static,
    ) -> impl Future<Output = HookResult<T>> + Send + 'static {
        let (inner, slots) = (Arc::clone(&self.inner), Arc::clone(&self.blocking));
        async move {
            let slot = slots
                .acquire_owned()
                .await
                .map_err(|_| ProviderError::internal("the blocking pool closed"))?;
            let task = tokio::task::spawn_blocking(move || {
                let _slot = slot;
                hook(&inner)
            });
            task.await.unwrap_or_else(|error| Err(task_failed(error)))
        }
    }

    /// Awaits the async variant `hook` of a call, or runs `blocking` on the
    /// bounded pool when the provider lacks it. The provider stays alive
    /// until the call ends.
    async fn either<T: Send + 'static>(
        &self,
        hook: Hook,
        call_async: impl FnOnce(&P) -> HookFuture<T>,
        blocking: impl FnOnce(&P) -> HookResult<T> + Send + 'static,
    ) -> HookResult<T> {
        let inner = Arc::clone(&self.inner);
        let result = call_async(&inner).await;
        drop(inner);
        match lacks(&result, hook) {
            true => self.call(blocking).await,
            false => result,
        }
    }

    /// `health`.
    pub async fn health(&self) -> HookResult<HealthReport> {
        self.either(Hook::HealthAsync, |provider| provider.health_async(), |provider| provider.health()).await
    }

    /// `validate_config` (sends no request: on the blocking pool).
    pub async fn validate_config(&self, params: EnvironmentParams) -> HookResult<ValidationReport> {
        self.call(move |provider| provider.validate_config(&params)).await
    }

    /// `probe`.
    pub async fn probe(&self, params: EnvironmentParams) -> HookResult<ProbeReport> {
        let copy = params.clone();
        self.either(
            Hook::ProbeAsync,
            |provider| provider.probe_async(copy),
            move |provider| provider.probe(&params),
        )
        .await
    }

    /// `acquire_lease`. Dropped before it is ready (async provider), it
    /// leaves no lease behind.
    pub async fn acquire_lease(&self, params: AcquireParams) -> HookResult<Lease> {
        let copy = params.clone();
        self.either(
            Hook::AcquireLeaseAsync,
            |provider| provider.acquire_lease_async(copy),
            move |provider| provider.acquire_lease(&params),
        )
        .await
    }

    /// `resume_lease`.
    pub async fn resume_lease(&self, params: LeaseParams) -> HookResult<Lease> {
        let copy = params.clone();
        self.either(
            Hook::ResumeLeaseAsync,
            |provider| provider.resume_lease_async(copy),
            move |provider| provider.resume_lease(&params),
        )
        .await
    }

    /// `release_lease`.
    pub async fn release_lease(&self, params: LeaseParams) -> HookResult<()> {
        self.release_lease_reporting(params).await.map(|_| ())
    }

    /// `release_lease_reporting`: whether the lease was kept for reuse.
    pub async fn release_lease_reporting(&self, params: LeaseParams) -> HookResult<ReleaseReport> {
        let copy = params.clone();
        self.either(
            Hook::ReleaseLeaseAsync,
            |provider| provider.release_lease_async(copy),
            move |provider| match provider.release_lease_reporting(&params) {
                result if lacks(&result, Hook::ReleaseLeaseReporting) => {
                    provider.release_lease(&params).map(|()| ReleaseReport { kept: false })
                }
                result => result,
            },
        )
        .await
    }

    /// `destroy_lease`.
    pub async fn destroy_lease(&self, params: LeaseParams) -> HookResult<()> {
        let copy = params.clone();
        self.either(
            Hook::DestroyLeaseAsync,
            |provider| provider.destroy_lease_async(copy),
            move |provider| provider.destroy_lease(&params),
        )
        .await
    }

    /// `sync_in`. Dropped before it is ready (async provider), the sync
    /// stops as release stops it (see `Provider::sync_in_async`).
    pub async fn sync_in(&self, params: SyncParams) -> HookResult<SyncResult> {
        let copy = params.clone();
        self.either(
            Hook::SyncInAsync,
            |provider| provider.sync_in_async(copy),
            move |provider| provider.sync_in(&params),
        )
        .await
    }

    /// `sync_out`. Dropped before it is ready (async provider), the sync
    /// stops as release stops it (see `Provider::sync_out_async`).
    pub async fn sync_out(&self, params: SyncParams) -> HookResult<SyncResult> {
        let copy = params.clone();
        self.either(
            Hook::SyncOutAsync,
            |provider| provider.sync_out_async(copy),
            move |provider| provider.sync_out(&params),
        )
        .await
    }

    /// `realize_workspace` (sends no request: on the blocking pool).
    pub async fn realize_workspace(&self, params: LeaseParams) -> HookResult<Workspace> {
        self.call(move |provider| provider.realize_workspace(&params)).await
    }

    /// Starts `execute`: await [`Execution::result`] for its result, and
    /// read [`Execution::output`] meanwhile for its output as it arrives.
    /// Must be called within a tokio runtime.
    pub fn execute(&self, params: ExecuteParams) -> Execution {
        let (sender, output) = mpsc::unbounded_channel();
        let forward = sender.clone();
        let sink =
            OwnedByteSink::new(move |stream, chunk: &[u8]| drop(forward.send((stream, chunk.to_vec()))));
        let mut started = self.inner.execute_async(params.clone(), sink);
        let result: HookFuture<ExecuteResult> = match poll_once(&mut started) {
            Some(result) if lacks(&result, Hook::ExecuteAsync) => {
                let mut forward = move |stream, chunk: &[u8]| drop(sender.send((stream, chunk.to_vec())));
                let fallback = tokio::spawn(
                    self.call(move |provider| execute_blocking(provider, &params, &mut forward)),
                );
                Box::pin(async move { fallback.await.unwrap_or_else(|error| Err(task_failed(error))) })
            }
            Some(result) => Box::pin(std::future::ready(result)),
            None => {
                let inner = Arc::clone(&self.inner);
                Box::pin(async move {
                    let result = started.await;
                    drop(inner);
                    result
                })
            }
        };
        Execution { output, result }
    }
}

/// Polls a hook's future once: an async hook the provider lacks answers at
/// once, without having started anything.
fn poll_once<T>(future: &mut HookFuture<T>) -> Option<HookResult<T>> {
    let mut context = std::task::Context::from_waker(std::task::Waker::noop());
    match future.as_mut().poll(&mut context) {
        std::task::Poll::Ready(result) => Some(result),
        std::task::Poll::Pending => None,
    }
}

/// The blocking `execute`, handing `output` the raw bytes the command wrote:
/// through `execute_bytes` (ABI 1.3), or `execute` where the provider lacks
/// it (a 1.0–1.2 provider delivers text, as its UTF-8).
pub(crate) fn execute_blocking<P: Provider + ?Sized>(
    provider: &P,
    params: &ExecuteParams,
    output: &mut (dyn FnMut(OutputStream, &[u8]) + Send),
) -> HookResult<ExecuteResult> {
    match provider
        .execute_bytes(params, &mut ByteSink::new(&mut |stream, chunk: &[u8]| output(stream, chunk)))
    {
        result if lacks(&result, Hook::ExecuteBytes) => {
            let mut text = |stream: OutputStream, chunk: &str| output(stream, chunk.as_bytes());
            provider.execute(params, &mut OutputSink::new(&mut text))
        }
        result => result,
    }
}
