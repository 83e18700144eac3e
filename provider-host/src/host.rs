//! The host's side of each lease hook: every call is recorded in the
//! [`LeaseStore`] before and after it, and the seed's defensive policy applies.
//!
//! The policy ("CreateOS process cleanup is unconfirmed; destroy this lease
//! before reusing it."): a release that fails with
//! [`ErrorKind::CLEANUP_UNCONFIRMED`] falls back to destroy; a lease the ledger
//! knows as unconfirmed is destroyed, never released for reuse or resumed.
//! Each such event is logged as a warning naming the lease id (never the key).
//!
//! The host knows hooks and error kinds, never a provider's configuration
//! keys: what a release did comes from the provider (`release_lease_reporting`,
//! or `inspect_lease` for a 1.1 provider), what is secret from its schema
//! ([`SecretFields`]), and a created sandbox is recorded the moment the
//! provider reports it (`acquire_lease_recording`), before the provider goes on.

use crate::{
    hosted::HookSupport,
    ledger::{LeaseEnv, LeaseRecord, LeaseState, LedgerError, Owner},
    request::HarnessConfig,
    secrets::SecretFields,
    store::LeaseStore,
};
use provider_abi::{
    AcquireParams, AsyncCreationRecorder, CreationRecorder, EnvironmentParams, ErrorKind, ExecuteParams,
    ExecuteResult, Hook, HookFuture, HookResult, Lease, LeaseParams, OutputSink, OutputStream, OwnedByteSink,
    OwnedByteSource, ProbeReport, ProviderError, ReleaseReport, SyncParams, SyncResult, Workspace,
};
use serde_json::Value;
use std::future::Future;
use tokio::sync::{mpsc, oneshot};

/// What a lease the ledger knows as unconfirmed is refused with (a command,
/// a sync), and why a release destroyed it instead: the seed's sentence, word
/// for word, as users search for it.
pub const UNCONFIRMED_MESSAGE: &str =
    "CreateOS process cleanup is unconfirmed; destroy this lease before reusing it.";

/// How a [`Host`] calls the hooks that wait on the network.
///
/// The policy is the same either way (every method of [`Host`] is written
/// once, as `async`); only the provider call differs. The blocking methods
/// (`acquire`...) run it with [`Calls::Blocking`] on the calling thread; the
/// `_with` methods take the mode, for a host on an async runtime.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Calls {
    /// The blocking hooks: a call holds the calling thread until it returns.
    Blocking,
    /// The async hooks (ABI 1.7 and later) where the provider has them: a
    /// call holds no thread while it waits, and dropping the host's future
    /// cancels it with the guarantees release gives. A hook without an async
    /// variant (an older provider, a worker process) is called blocking, on
    /// the thread polling the future.
    Async,
}

/// A provider, a ledger and an environment: the hooks as a host calls them.
pub struct Host<'a> {
    provider: &'a dyn HookSupport,
    ledger: &'a dyn LeaseStore,
    env: EnvironmentParams,
    lease_env: LeaseEnv,
    owner: Owner,
    run_id: String,
}

/// A lease the host holds: its ledger row and the lease itself.
#[derive(Debug, Clone, PartialEq)]
pub struct HeldLease {
    /// The ledger row.
    pub row: i64,
    /// The lease as the provider returned it.
    pub lease: Lease,
    /// True when the row was made for a lease the ledger had never seen
    /// (a lease file from elsewhere): a hook that refuses the lease before
    /// any request removes the row again.
    pub provisional: bool,
}

impl HeldLease {
    /// A lease held under ledger row `row`.
    pub fn new(row: i64, lease: Lease) -> Self {
        Self { row, lease, provisional: false }
    }

    /// The provider lease id, if any.
    pub fn id(&self) -> Option<&str> {
        self.lease.provider_lease_id.as_ref().map(|id| id.as_str()).into_option()
    }
}

/// How a release ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Released {
    /// Given back for reuse (paused).
    Kept,
    /// Deleted by the provider (the configuration does not reuse leases).
    Deleted,
    /// Not reusable: destroyed instead, because of this (the seed's fallback).
    DestroyedInstead(ProviderError),
}

/// True for errors a provider returns before sending any request on the
/// lease's behalf (a malformed lease, another environment's lease, a bad
/// configuration): nothing remote changed.
fn refused_before_any_request(error: &ProviderError) -> bool {
    matches!(
        error.kind,
        ErrorKind::INVALID_INPUT | ErrorKind::NOT_THIS_ENVIRONMENT | ErrorKind::INVALID_CONFIG
    )
}

/// True for errors of `acquire_lease` or `probe` after which a sandbox may
/// exist that the provider could not name or delete.
fn may_have_left_a_sandbox(error: &ProviderError) -> bool {
    matches!(
        error.kind,
        ErrorKind::CREATION_UNCONFIRMED | ErrorKind::CLEANUP_UNCONFIRMED | ErrorKind::INTERNAL
    ) || error.kind.name() == "unknown"
}

/// Whether a host that stopped with its row in `state` may have sent the
/// lease's DELETE: a probe deletes its own sandbox and an acquire the one it
/// could not prepare (both still `acquiring`), a release without reuse
/// deletes (`releasing`), and so do `destroying` and a failed cleanup.
fn delete_may_have_gone_out(state: LeaseState) -> bool {
    matches!(
        state,
        LeaseState::Acquiring | LeaseState::Releasing | LeaseState::Destroying | LeaseState::CleanupFailed
    )
}

/// What the ledger stores of `config`: the provider's normalised form when it
/// validates (its own spelling of every value), else `config` as given, and
/// in either case without the properties the provider's schema marks secret.
pub fn storable_config(provider: &dyn HookSupport, env: &EnvironmentParams, config: &Value) -> Value {
    let normalized = provider
        .validate_config(env)
        .ok()
        .filter(|report| report.ok)
        .and_then(|report| report.normalized_config_json.into_option())
        .and_then(|text| serde_json::from_str::<Value>(&text).ok())
        .filter(Value::is_object);
    SecretFields::of(&provider.manifest()).strip(normalized.as_ref().unwrap_or(config))
}

fn ledger_error(error: LedgerError) -> ProviderError {
    ProviderError::internal(format!("cannot record the lease: {error}"))
}

/// Awaits `call` while handing each message `messages` receives to `serve`
/// (a command's output, a created lease to record), in the order sent; the
/// messages sent before `call` ended are all served before it returns.
async fn serving<T, M>(
    call: impl Future<Output = T>,
    mut messages: mpsc::UnboundedReceiver<M>,
    mut serve: impl FnMut(M),
) -> T {
    let mut call = std::pin::pin!(call);
    loop {
        tokio::select! {
            biased;
            Some(message) = messages.recv() => serve(message),
            result = &mut call => {
                while let Ok(message) = messages.try_recv() {
                    serve(message);
                }
                return result;
            }
        }
    }
}

/// A creating hook's variants (`acquire_lease`, `probe`), each with the hook
/// that says whether the provider has it: see [`Host::creating`].
struct CreatingHook<RecordingAsync, Recording, PlainAsync, Plain> {
    recording_async: (Hook, RecordingAsync),
    recording: (Hook, Recording),
    plain_async: (Hook, PlainAsync),
    plain: Plain,
}

/// A lease an async creating hook reports created, and where to answer
/// whether its record is committed. Boxed: a channel allocates its slots 32
/// at a time, for every acquire in flight.
type CreatedLease = Box<(Lease, oneshot::Sender<HookResult<()>>)>;

/// The write-ahead callback of an async creating hook (ABI 1.8): each lease
/// goes to the host's future, which commits it and answers. The provider
/// polls the answer on its own runtime; a channel needs none. Once the host
/// stopped waiting (its future dropped), the answer is an error, and the
/// provider deletes what it created.
fn async_recorder() -> (AsyncCreationRecorder, mpsc::UnboundedReceiver<CreatedLease>) {
    let (sender, created) = mpsc::unbounded_channel::<CreatedLease>();
    let recorder = AsyncCreationRecorder::new(move |lease: &Lease| -> HookFuture<()> {
        let (answer, answered) = oneshot::channel();
        let sent = sender.send(Box::new((lease.clone(), answer)));
        Box::pin(async move {
            let gone = || ProviderError::internal("The host stopped waiting for the created lease's record.");
            sent.map_err(|_| gone())?;
            answered.await.unwrap_or_else(|_| Err(gone()))
        })
    });
    (recorder, created)
}

impl<'a> Host<'a> {
    /// A host acting for `config`, recording leases as `owner`'s with `run_id`.
    /// `embedded_sim` marks an API served by a simulator inside this process.
    pub fn new(
        provider: &'a dyn HookSupport,
        ledger: &'a dyn LeaseStore,
        config: &HarnessConfig,
        owner: Owner,
        run_id: &str,
        embedded_sim: bool,
    ) -> Self {
        let env = config.environment(&provider.manifest().driver_key);
        let lease_env = LeaseEnv {
            driver_key: env.driver_key.to_string(),
            company_id: config.company_id.clone(),
            environment_id: config.environment_id.clone(),
            config: storable_config(provider, &env, &config.config),
            embedded_sim,
        };
        Host { provider, ledger, env, lease_env, owner, run_id: run_id.to_owned() }
    }

    /// The provider.
    pub fn provider(&self) -> &'a dyn HookSupport {
        self.provider
    }

    /// The ledger.
    pub fn ledger(&self) -> &'a dyn LeaseStore {
        self.ledger
    }

    /// The hook parameters of this environment.
    pub fn env(&self) -> &EnvironmentParams {
        &self.env
    }

    /// The parameters of a hook acting on `lease`.
    pub fn params(&self, lease: &Lease) -> LeaseParams {
        LeaseParams {
            env: self.env.clone(),
            run_id: self.run_id.as_str().into(),
            provider_lease_id: lease.provider_lease_id.clone(),
            metadata_json: lease.metadata_json.clone(),
        }
    }

    fn record(
        &self,
        row: i64,
        state: LeaseState,
        hook: &str,
        error: Option<&ProviderError>,
    ) -> HookResult<()> {
        self.ledger.set_state(row, state, hook, error).map_err(ledger_error)
    }

    /// `validate_config`.
    pub fn validate(&self) -> HookResult<provider_abi::ValidationReport> {
        self.provider.validate_config(&self.env)
    }

    /// Runs `call_async` when `calls` is async and the provider has `hook`,
    /// else (or when the version answering lacks it after all, as after a
    /// swap) the blocking `call`.
    async fn network<T>(
        &self,
        calls: Calls,
        hook: Hook,
        call_async: impl FnOnce() -> HookFuture<T>,
        call: impl FnOnce() -> HookResult<T>,
    ) -> HookResult<T> {
        if calls == Calls::Async && self.provider.supports(hook) {
            let result = call_async().await;
            if !crate::async_host::lacks(&result, hook) {
                return result;
            }
        }
        call()
    }

    /// Runs a creating hook through its best variant the provider has:
    /// async with the write-ahead record (ABI 1.8, when `calls` is async),
    /// blocking with it (1.2), async without it (1.7, when `calls` is
    /// async), blocking without it. Each lease a recording variant reports
    /// created is committed to row `row` (as by hook `record_as`) before the
    /// provider goes on with it.
    async fn creating<T, RecordingAsync, Recording, PlainAsync, Plain>(
        &self,
        calls: Calls,
        (row, record_as): (i64, &str),
        hook: CreatingHook<RecordingAsync, Recording, PlainAsync, Plain>,
    ) -> HookResult<T>
    where
        RecordingAsync: FnOnce(AsyncCreationRecorder) -> HookFuture<T>,
        Recording: FnOnce(&mut CreationRecorder<'_>) -> HookResult<T>,
        PlainAsync: FnOnce() -> HookFuture<T>,
        Plain: FnOnce() -> HookResult<T>,
    {
        let (recording_async, call) = hook.recording_async;
        if calls == Calls::Async && self.provider.supports(recording_async) {
            let (recorder, created) = async_recorder();
            let record = |created: CreatedLease| {
                let (lease, answer) = *created;
                drop(answer.send(self.record_created(row, record_as, &lease)));
            };
            let result = serving(call(recorder), created, record).await;
            if !crate::async_host::lacks(&result, recording_async) {
                return result;
            }
        }
        let (recording, call) = hook.recording;
        if self.provider.supports(recording) {
            let mut record = |lease: &Lease| self.record_created(row, record_as, lease);
            return call(&mut CreationRecorder::new(&mut record));
        }
        let (plain_async, call_async) = hook.plain_async;
        self.network(calls, plain_async, call_async, hook.plain).await
    }

    /// `probe`, recorded as a probe row: `acquiring` until it returns, then
    /// `destroyed` unless the error says a sandbox may remain; a probe the
    /// provider refused before any request leaves no row.
    pub fn probe(&self) -> HookResult<ProbeReport> {
        pollster::block_on(self.probe_with(Calls::Blocking))
    }

    /// [`Host::probe`], calling the provider as `calls` says.
    pub async fn probe_with(&self, calls: Calls) -> HookResult<ProbeReport> {
        let hook = Hook::Probe.name();
        let row = self.ledger.begin(Owner::Probe, "probe", &self.lease_env, hook).map_err(ledger_error)?;
        let outcome = self
            .creating(
                calls,
                (row, hook),
                CreatingHook {
                    recording_async: (Hook::ProbeRecordingAsync, |recorder| {
                        self.provider.probe_recording_async(self.env.clone(), recorder)
                    }),
                    recording: (Hook::ProbeRecording, |recorder: &mut CreationRecorder<'_>| {
                        self.provider.probe_recording(&self.env, recorder)
                    }),
                    plain_async: (Hook::ProbeAsync, || self.provider.probe_async(self.env.clone())),
                    plain: || self.provider.probe(&self.env),
                },
            )
            .await;
        let error = outcome.as_ref().err();
        let state = match error {
            Some(error) if refused_before_any_request(error) => {
                self.forget_refused(row);
                return outcome;
            }
            Some(error) if may_have_left_a_sandbox(error) => LeaseState::Acquiring,
            _ => LeaseState::Destroyed,
        };
        self.record(row, state, "probe", error)?;
        if let Some(error) = error.filter(|_| state == LeaseState::Acquiring) {
            self.destroy_if_creator_lost(calls, row, error).await;
        }
        outcome
    }

    /// Write-ahead: commits a lease the provider just created to row `row`
    /// (still `acquiring`) before the provider goes on with it.
    fn record_created(&self, row: i64, hook: &str, lease: &Lease) -> HookResult<()> {
        self.ledger.set_lease(row, LeaseState::Acquiring, hook, lease).map_err(ledger_error)
    }

    /// `acquire_lease`, recorded `acquiring` before the call, with the lease
    /// id the moment the provider reports the sandbox created (ABI 1.2), and
    /// `active` after it; an acquire the provider refused before any request
    /// (an invalid configuration) leaves no row.
    pub fn acquire(&self) -> HookResult<HeldLease> {
        pollster::block_on(self.acquire_with(Calls::Blocking))
    }

    /// [`Host::acquire`], calling the provider as `calls` says.
    pub async fn acquire_with(&self, calls: Calls) -> HookResult<HeldLease> {
        let hook = Hook::AcquireLease.name();
        let row = self.ledger.begin(self.owner, &self.run_id, &self.lease_env, hook).map_err(ledger_error)?;
        let params = AcquireParams {
            env: self.env.clone(),
            run_id: self.run_id.as_str().into(),
            requested_expires_at: None.into(),
        };
        let outcome = self
            .creating(
                calls,
                (row, hook),
                CreatingHook {
                    recording_async: (Hook::AcquireLeaseRecordingAsync, |recorder| {
                        self.provider.acquire_lease_recording_async(params.clone(), recorder)
                    }),
                    recording: (Hook::AcquireLeaseRecording, |recorder: &mut CreationRecorder<'_>| {
                        self.provider.acquire_lease_recording(&params, recorder)
                    }),
                    plain_async: (Hook::AcquireLeaseAsync, || {
                        self.provider.acquire_lease_async(params.clone())
                    }),
                    plain: || self.provider.acquire_lease(&params),
                },
            )
            .await;
        match outcome {
            Ok(lease) => {
                self.ledger.set_lease(row, LeaseState::Active, hook, &lease).map_err(ledger_error)?;
                Ok(HeldLease::new(row, lease))
            }
            Err(error) if refused_before_any_request(&error) => {
                self.forget_refused(row);
                Err(error)
            }
            Err(error) => {
                let state = if may_have_left_a_sandbox(&error) {
                    LeaseState::Acquiring
                } else {
                    LeaseState::Destroyed
                };
                self.record(row, state, hook, Some(&error))?;
                if state == LeaseState::Acquiring {
                    self.destroy_if_creator_lost(calls, row, &error).await;
                }
                Err(error)
            }
        }
    }

    /// After a creating hook failed with `error`, leaving row `row`
    /// `acquiring`: when the way to the provider failed under it (a worker
    /// process died), the provider's own clean-up of what it created died
    /// with it, so the host destroys the sandbox the row recorded, as the
    /// provider would have. A sandbox that cannot be destroyed now is named
    /// in a warning: `sweep` destroys it later.
    async fn destroy_if_creator_lost(&self, calls: Calls, row: i64, error: &ProviderError) {
        if !self.provider.is_transport_failure(error) {
            return;
        }
        let record = match self.ledger.get(row) {
            Ok(Some(record)) if record.provider_lease_id.is_some() => record,
            _ => return,
        };
        let held = HeldLease::new(row, record.lease());
        match self.destroy_left_behind_with(calls, &held, LeaseState::Acquiring).await {
            Ok(()) => tracing::warn!(
                lease = held.id().unwrap_or("-"),
                "destroyed the sandbox whose creation the provider could not finish"
            ),
            Err(destroy) => tracing::warn!(
                lease = held.id().unwrap_or("-"),
                kind = %destroy.kind,
                "a sandbox whose creation the provider could not finish is left running; `sweep` destroys it"
            ),
        }
    }

    /// Holds a lease acquired by an earlier run: its latest ledger row, taken
    /// over by this process, or a new row when the ledger never saw it.
    pub fn hold(&self, lease: Lease) -> HookResult<HeldLease> {
        let id = lease.provider_lease_id.as_ref().map(|id| id.to_string()).into_option();
        let known = match &id {
            Some(id) => self
                .ledger
                .find(id, &self.lease_env.company_id, &self.lease_env.environment_id)
                .map_err(ledger_error)?,
            None => None,
        };
        match known {
            Some(record) => {
                self.ledger.adopt(record.id).map_err(ledger_error)?;
                Ok(HeldLease::new(record.id, lease))
            }
            None => {
                let row = self
                    .ledger
                    .begin(self.owner, &self.run_id, &self.lease_env, "hold")
                    .map_err(ledger_error)?;
                let state = if lease.expired { LeaseState::Destroyed } else { LeaseState::Active };
                self.ledger.set_lease(row, state, "hold", &lease).map_err(ledger_error)?;
                Ok(HeldLease { row, lease, provisional: true })
            }
        }
    }

    /// After a hook that changes no state failed with `error`: see
    /// [`Host::undo_if_refused`].
    fn forget_if_refused(&self, held: &HeldLease, error: ProviderError) -> ProviderError {
        self.undo_if_refused(held, None, error)
    }

    /// After a hook failed with `error`: a call the provider refused before
    /// any request changes nothing. A lease the ledger first saw in this call
    /// leaves no row; a row the ledger knew goes back to `before` (as it was
    /// before the hook's write-ahead record). Returns `error` for the caller
    /// to pass on.
    fn undo_if_refused(
        &self,
        held: &HeldLease,
        before: Option<&LeaseRecord>,
        error: ProviderError,
    ) -> ProviderError {
        if !refused_before_any_request(&error) {
            return error;
        }
        match (held.provisional, before) {
            (true, _) => self.forget_refused(held.row),
            (false, Some(before)) => {
                if let Err(ledger) = self.ledger.restore(before) {
                    tracing::warn!(row = held.row, error = %ledger, "cannot put back a refused call's row");
                }
            }
            (false, None) => {}
        }
        error
    }

    /// Removes row `row`, written for a call the provider refused before any request.
    fn forget_refused(&self, row: i64) {
        if let Err(ledger) = self.ledger.forget(row) {
            tracing::warn!(row, error = %ledger, "cannot remove a refused call's row");
        }
    }

    /// Row `held.row` as it stands.
    fn row(&self, held: &HeldLease) -> HookResult<Option<LeaseRecord>> {
        self.ledger.get(held.row).map_err(ledger_error)
    }

    fn state(&self, held: &HeldLease) -> HookResult<Option<LeaseState>> {
        Ok(self.row(held)?.map(|record| record.state))
    }

    /// The seed's policy for a lease that must not be reused: log, destroy.
    async fn destroy_poisoned(&self, calls: Calls, held: &HeldLease, instead_of: &str) -> HookResult<()> {
        tracing::warn!(
            lease = held.id().unwrap_or("-"),
            "lease cleanup is unconfirmed; destroying it instead of {instead_of}"
        );
        self.destroy_with(calls, held).await
    }

    /// Marks the lease unconfirmed (after `error`) and destroys it.
    async fn poisoned_by(
        &self,
        calls: Calls,
        held: &HeldLease,
        hook: &str,
        error: &ProviderError,
        instead_of: &str,
    ) -> HookResult<()> {
        self.record(held.row, LeaseState::Unconfirmed, hook, Some(error))?;
        self.destroy_poisoned(calls, held, instead_of).await
    }

    /// `resume_lease`. A lease the ledger knows as unconfirmed (or that the
    /// provider refuses as unconfirmed) is destroyed instead, and comes back
    /// expired: the caller must acquire a new one.
    pub fn resume(&self, held: &HeldLease) -> HookResult<Lease> {
        pollster::block_on(self.resume_with(Calls::Blocking, held))
    }

    /// [`Host::resume`], calling the provider as `calls` says.
    pub async fn resume_with(&self, calls: Calls, held: &HeldLease) -> HookResult<Lease> {
        let hook = Hook::ResumeLease.name();
        let gone = Lease { provider_lease_id: None.into(), expired: true, ..held.lease.clone() };
        let before = self.row(held)?;
        if before.as_ref().map(|record| record.state) == Some(LeaseState::Unconfirmed) {
            self.destroy_poisoned(calls, held, "resuming it").await?;
            return Ok(gone);
        }
        // Recorded as active before the call: a resume cut short may leave it running.
        self.record(held.row, LeaseState::Active, hook, None)?;
        let params = self.params(&held.lease);
        let outcome = self
            .network(
                calls,
                Hook::ResumeLeaseAsync,
                || self.provider.resume_lease_async(params.clone()),
                || self.provider.resume_lease(&params),
            )
            .await;
        match outcome {
            Ok(lease) if lease.expired => {
                // An expired lease's sandbox may still exist (the configuration
                // changed, or its marker did not read back): give it back
                // rather than leak it. A failed destroy leaves the row for
                // `sweep`.
                if let Err(error) = self.destroy_with(calls, held).await {
                    tracing::warn!(lease = ?held.id(), error = %error, "destroying an expired lease failed");
                }
                Ok(lease)
            }
            Ok(lease) => {
                self.ledger.set_lease(held.row, LeaseState::Active, hook, &lease).map_err(ledger_error)?;
                Ok(lease)
            }
            Err(error) if error.kind == ErrorKind::CLEANUP_UNCONFIRMED => {
                self.poisoned_by(calls, held, hook, &error, "resuming it").await?;
                Ok(gone)
            }
            Err(error) if refused_before_any_request(&error) => {
                Err(self.undo_if_refused(held, before.as_ref(), error))
            }
            Err(error) => {
                self.record(held.row, LeaseState::Active, hook, Some(&error))?;
                Err(error)
            }
        }
    }

    /// Whether a release of a provider without `release_lease_reporting`
    /// kept the lease: a 1.1 provider is asked (`inspect_lease`: it still
    /// exists and is not unconfirmed); a 1.0 provider cannot say, so the
    /// lease is treated as gone (never resumed) and destroyed to be sure.
    fn kept_by_unreporting_release(&self, held: &HeldLease) -> HookResult<bool> {
        if self.provider.supports(Hook::InspectLease) {
            if let Ok(status) = self.provider.inspect_lease(&self.params(&held.lease)) {
                return Ok(status.exists && !status.unconfirmed);
            }
        }
        self.provider.destroy_lease(&self.params(&held.lease)).map(|()| false)
    }

    /// The blocking release: reporting (ABI 1.2), else plain and asked after.
    fn release_reporting(&self, held: &HeldLease, params: &LeaseParams) -> HookResult<ReleaseReport> {
        let kept = if self.provider.supports(Hook::ReleaseLeaseReporting) {
            self.provider.release_lease_reporting(params).map(|report| report.kept)
        } else {
            self.provider.release_lease(params).and_then(|()| self.kept_by_unreporting_release(held))
        };
        kept.map(|kept| ReleaseReport { kept })
    }

    /// `release_lease` for reuse, with the seed's fallback: an unconfirmed
    /// lease (known to the ledger, or reported by the release) is destroyed.
    pub fn release(&self, held: &HeldLease) -> HookResult<Released> {
        pollster::block_on(self.release_with(Calls::Blocking, held))
    }

    /// [`Host::release`], calling the provider as `calls` says.
    pub async fn release_with(&self, calls: Calls, held: &HeldLease) -> HookResult<Released> {
        let hook = Hook::ReleaseLease.name();
        let before = self.row(held)?;
        if before.as_ref().map(|record| record.state) == Some(LeaseState::Unconfirmed) {
            self.destroy_poisoned(calls, held, "releasing it for reuse").await?;
            let cause = ProviderError::new(ErrorKind::CLEANUP_UNCONFIRMED, UNCONFIRMED_MESSAGE);
            return Ok(Released::DestroyedInstead(cause));
        }
        self.record(held.row, LeaseState::Releasing, hook, None)?;
        let params = self.params(&held.lease);
        let kept = self
            .network(
                calls,
                Hook::ReleaseLeaseAsync,
                || self.provider.release_lease_async(params.clone()),
                || self.release_reporting(held, &params),
            )
            .await
            .map(|report| report.kept);
        match kept {
            Ok(true) => {
                self.record(held.row, LeaseState::Paused, hook, None)?;
                Ok(Released::Kept)
            }
            Ok(false) => {
                self.record(held.row, LeaseState::Destroyed, hook, None)?;
                Ok(Released::Deleted)
            }
            Err(error) if error.kind == ErrorKind::CLEANUP_UNCONFIRMED => {
                self.poisoned_by(calls, held, hook, &error, "releasing it for reuse").await?;
                Ok(Released::DestroyedInstead(error))
            }
            Err(error) if refused_before_any_request(&error) => {
                Err(self.undo_if_refused(held, before.as_ref(), error))
            }
            Err(error) => {
                self.record(held.row, LeaseState::CleanupFailed, hook, Some(&error))?;
                Err(error)
            }
        }
    }

    /// `destroy_lease`: `destroying` before, `destroyed` or `cleanup_failed`
    /// after; a destroy the provider refused before any request leaves the
    /// row as it was.
    pub fn destroy(&self, held: &HeldLease) -> HookResult<()> {
        pollster::block_on(self.destroy_with(Calls::Blocking, held))
    }

    /// [`Host::destroy`], calling the provider as `calls` says.
    pub async fn destroy_with(&self, calls: Calls, held: &HeldLease) -> HookResult<()> {
        let hook = Hook::DestroyLease.name();
        let before = self.row(held)?;
        self.record(held.row, LeaseState::Destroying, hook, None)?;
        let params = self.params(&held.lease);
        let outcome = self
            .network(
                calls,
                Hook::DestroyLeaseAsync,
                || self.provider.destroy_lease_async(params.clone()),
                || self.provider.destroy_lease(&params),
            )
            .await;
        match outcome {
            Ok(()) => self.record(held.row, LeaseState::Destroyed, hook, None),
            Err(error) if refused_before_any_request(&error) => {
                Err(self.undo_if_refused(held, before.as_ref(), error))
            }
            Err(error) => {
                self.record(held.row, LeaseState::CleanupFailed, hook, Some(&error))?;
                Err(error)
            }
        }
    }

    /// Destroys a lease a gone host left behind in `state`. Where that host
    /// may already have sent the DELETE ([`delete_may_have_gone_out`]), the
    /// provider is asked first whether the lease still exists
    /// (`inspect_lease`, ABI 1.1): one already gone is recorded destroyed
    /// without a second DELETE. Otherwise, or when it cannot say, destroys.
    pub fn destroy_left_behind(&self, held: &HeldLease, state: LeaseState) -> HookResult<()> {
        pollster::block_on(self.destroy_left_behind_with(Calls::Blocking, held, state))
    }

    /// [`Host::destroy_left_behind`], calling the provider as `calls` says.
    pub async fn destroy_left_behind_with(
        &self,
        calls: Calls,
        held: &HeldLease,
        state: LeaseState,
    ) -> HookResult<()> {
        if delete_may_have_gone_out(state) && self.provider.supports(Hook::InspectLease) {
            if let Ok(status) = self.provider.inspect_lease(&self.params(&held.lease)) {
                if !status.exists {
                    tracing::info!(lease = ?held.id(), %state, "a lease left behind was already gone");
                    return self.record(held.row, LeaseState::Destroyed, Hook::InspectLease.name(), None);
                }
            }
        }
        self.destroy_with(calls, held).await
    }

    /// `realize_workspace` (no state change).
    pub fn realize(&self, held: &HeldLease) -> HookResult<Workspace> {
        self.provider
            .realize_workspace(&self.params(&held.lease))
            .map_err(|error| self.forget_if_refused(held, error))
    }

    /// Whether the provider implements `execute`.
    pub fn can_execute(&self) -> bool {
        self.provider.supports(Hook::Execute)
            && self.provider.manifest().hooks.iter().any(|hook| hook == Hook::Execute.name())
    }

    /// `execute` in the lease. A lease the ledger knows as unconfirmed is
    /// refused. After a failure the provider is asked (`inspect_lease`)
    /// whether the lease's cleanup became unconfirmed, and the ledger notes it.
    pub fn execute(
        &self,
        held: &HeldLease,
        params: ExecuteParams,
        output: &mut OutputSink<'_>,
    ) -> HookResult<ExecuteResult> {
        let params = self.before_execute(held, params)?;
        let outcome = self.provider.execute(&params, output);
        self.after_execute(held, &params, outcome)
    }

    /// [`Self::execute`], handing `output` the raw bytes the command wrote:
    /// through `execute_bytes` (ABI 1.3) when the provider has it, else
    /// through `execute` (a 1.0–1.2 provider delivers text, as its UTF-8).
    pub fn execute_bytes(
        &self,
        held: &HeldLease,
        params: ExecuteParams,
        output: &mut (dyn FnMut(OutputStream, &[u8]) + Send),
    ) -> HookResult<ExecuteResult> {
        pollster::block_on(self.execute_bytes_with(Calls::Blocking, held, params, output))
    }

    /// [`Host::execute_bytes`], calling the provider as `calls` says: the
    /// async `execute` (ABI 1.7) streams the output to `output` as it
    /// arrives, and dropping the future stops the command.
    pub async fn execute_bytes_with(
        &self,
        calls: Calls,
        held: &HeldLease,
        params: ExecuteParams,
        output: &mut (dyn FnMut(OutputStream, &[u8]) + Send),
    ) -> HookResult<ExecuteResult> {
        let params = self.before_execute(held, params)?;
        // Boxed chunks: a channel allocates its slots 32 at a time.
        let (sender, chunks) = mpsc::unbounded_channel::<Box<(OutputStream, Vec<u8>)>>();
        let call_async = || {
            let sink = OwnedByteSink::new(move |stream, chunk: &[u8]| {
                drop(sender.send(Box::new((stream, chunk.to_vec()))))
            });
            self.provider.execute_async(params.clone(), sink)
        };
        let outcome = match calls == Calls::Async && self.provider.supports(Hook::ExecuteAsync) {
            true => serving(call_async(), chunks, |chunk| output(chunk.0, &chunk.1)).await,
            false => Err(provider_abi::unsupported(Hook::ExecuteAsync)),
        };
        let outcome = match crate::async_host::lacks(&outcome, Hook::ExecuteAsync) {
            true => crate::async_host::execute_blocking(self.provider, &params, output),
            false => outcome,
        };
        self.after_execute(held, &params, outcome)
    }

    /// Whether the provider pulls a command's standard input as it sends it
    /// (`execute_stdin_async`, ABI 1.9), so input of any size costs bounded
    /// memory: see [`Self::execute_pulling_stdin`].
    pub fn can_pull_stdin(&self) -> bool {
        self.provider.supports(Hook::ExecuteStdinAsync)
    }

    /// [`Self::execute_bytes`], the command's standard input pulled from
    /// `stdin` as the provider sends it on (`execute_stdin_async`, ABI 1.9;
    /// `unsupported` without it, before anything is read). Blocks the calling
    /// thread; the output reaches `output` on it as it arrives.
    pub fn execute_pulling_stdin(
        &self,
        held: &HeldLease,
        params: ExecuteParams,
        stdin: OwnedByteSource,
        output: &mut (dyn FnMut(OutputStream, &[u8]) + Send),
    ) -> HookResult<ExecuteResult> {
        if !self.can_pull_stdin() {
            return Err(provider_abi::unsupported(Hook::ExecuteStdinAsync));
        }
        let params = self.before_execute(held, params)?;
        // Boxed chunks: a channel allocates its slots 32 at a time.
        let (sender, chunks) = mpsc::unbounded_channel::<Box<(OutputStream, Vec<u8>)>>();
        let sink = OwnedByteSink::new(move |stream, chunk: &[u8]| {
            drop(sender.send(Box::new((stream, chunk.to_vec()))))
        });
        let call = self.provider.execute_stdin_async(params.clone(), stdin, sink);
        let outcome = pollster::block_on(serving(call, chunks, |chunk| output(chunk.0, &chunk.1)));
        self.after_execute(held, &params, outcome)
    }

    /// Refuses, before any call, a lease the ledger knows as unconfirmed:
    /// a command or a sync must not run where processes may still be running.
    fn refuse_if_unconfirmed(&self, held: &HeldLease) -> HookResult<()> {
        match self.state(held)? {
            Some(LeaseState::Unconfirmed) => {
                Err(ProviderError::new(ErrorKind::CLEANUP_UNCONFIRMED, UNCONFIRMED_MESSAGE))
            }
            _ => Ok(()),
        }
    }

    /// Before an execute hook: refuses a lease the ledger knows as
    /// unconfirmed, and points the parameters at the held lease.
    fn before_execute(&self, held: &HeldLease, mut params: ExecuteParams) -> HookResult<ExecuteParams> {
        self.refuse_if_unconfirmed(held)?;
        params.lease = self.params(&held.lease);
        Ok(params)
    }

    /// After an execute hook: the ledger's policy for its outcome.
    fn after_execute(
        &self,
        held: &HeldLease,
        params: &ExecuteParams,
        outcome: HookResult<ExecuteResult>,
    ) -> HookResult<ExecuteResult> {
        let outcome = outcome.map_err(|error| self.forget_if_refused(held, error));
        if let Err(error) = &outcome {
            // A worker that died under the command took its cleanup with it:
            // the command's processes may still run. So may a process whose
            // creation is unknown. (After a swap, `inspect_lease` asks the
            // version now active, which may not be the one that ran the call.)
            let unconfirmed = error.kind == ErrorKind::CLEANUP_UNCONFIRMED
                || error.kind == ErrorKind::CREATION_UNCONFIRMED
                || self.provider.is_transport_failure(error)
                || (self.provider.supports(Hook::InspectLease)
                    && self.provider.inspect_lease(&params.lease).is_ok_and(|status| status.unconfirmed));
            if unconfirmed {
                tracing::warn!(
                    lease = held.id().unwrap_or("-"),
                    "command cleanup is unconfirmed on the lease"
                );
                self.record(held.row, LeaseState::Unconfirmed, Hook::Execute.name(), Some(error))?;
                self.hand_over_unconfirmed(&params.lease);
            }
        }
        outcome
    }

    /// Tells the provider version answering new calls that `lease`'s cleanup
    /// is unconfirmed (`import_unconfirmed`, ABI 1.5): a call still running on
    /// a version a swap retired marks the lease there only, so the version
    /// now active learns it from the host and itself refuses reuse.
    fn hand_over_unconfirmed(&self, lease: &LeaseParams) {
        if !self.provider.supports(Hook::ImportUnconfirmed) {
            return;
        }
        if let Err(error) = self.provider.import_unconfirmed(lease) {
            let id = lease.provider_lease_id.as_ref().map(|id| id.to_string());
            tracing::warn!(lease = ?id, kind = %error.kind, "the provider did not take an unconfirmed lease");
        }
    }

    /// Whether the provider implements file sync (`sync_in` and `sync_out`, ABI 1.4).
    pub fn can_sync(&self) -> bool {
        self.provider.supports(Hook::SyncIn) && self.provider.supports(Hook::SyncOut)
    }

    /// `sync_in` into the lease: host files in, then the post-upload
    /// commands. An older provider is refused with `unsupported`, and a lease
    /// the ledger knows as unconfirmed is refused, both before any call.
    pub fn sync_in(&self, held: &HeldLease, params: SyncParams) -> HookResult<SyncResult> {
        pollster::block_on(self.sync_with(Calls::Blocking, held, params, Hook::SyncIn))
    }

    /// `sync_out` from the lease: lease files to the host; refused as
    /// [`Host::sync_in`] is.
    pub fn sync_out(&self, held: &HeldLease, params: SyncParams) -> HookResult<SyncResult> {
        pollster::block_on(self.sync_with(Calls::Blocking, held, params, Hook::SyncOut))
    }

    /// [`Host::sync_in`] (`hook` [`Hook::SyncIn`]) or [`Host::sync_out`]
    /// ([`Hook::SyncOut`]), calling the provider as `calls` says: the async
    /// variant (ABI 1.8) holds no thread, and dropping it stops the sync.
    pub async fn sync_with(
        &self,
        calls: Calls,
        held: &HeldLease,
        mut params: SyncParams,
        hook: Hook,
    ) -> HookResult<SyncResult> {
        if !self.provider.supports(hook) {
            return Err(provider_abi::unsupported(hook));
        }
        self.refuse_if_unconfirmed(held)?;
        params.lease = self.params(&held.lease);
        let outcome = match hook {
            Hook::SyncIn => {
                let call_async = || self.provider.sync_in_async(params.clone());
                self.network(calls, Hook::SyncInAsync, call_async, || self.provider.sync_in(&params)).await
            }
            _ => {
                let call_async = || self.provider.sync_out_async(params.clone());
                self.network(calls, Hook::SyncOutAsync, call_async, || self.provider.sync_out(&params)).await
            }
        };
        outcome.map_err(|error| self.forget_if_refused(held, error))
    }
}
