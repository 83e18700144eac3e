//! The host's side of each lease hook: every call is recorded in the
//! [`LeaseStore`] before and after it, and the release rule's defensive policy applies.
//!
//! The policy ("CreateOS process cleanup is unconfirmed; destroy this lease
//! before reusing it."): a release that fails with
//! [`ErrorKind::CLEANUP_UNCONFIRMED`] falls back to destroy; a lease the ledger
//! knows as unconfirmed is destroyed, never released for reuse or resumed.
//! Each such event is logged as a warning naming the lease id (never the key).
//!
//! The host knows hooks and error kinds, never a provider's configuration
//! keys: what a release did comes from the provider's report, what is secret
//! from its schema ([`SecretFields`]), and a creation is recorded at the two
//! moments the provider reports through its [`CreationRecorder`] (the request
//! is about to leave; the reply named the lease), each durable before the
//! provider goes on.
//!
//! Every method that calls the network is `async`; a blocking caller runs
//! it with [`crate::wait`].

use crate::{
    command::{CommandOutcome, RemoteCommand},
    environment::Environment,
    file_transfer::{FileTransfer, TransferOutcome},
    hosted::HookSupport,
    secrets::SecretFields,
    store::{Done, LeaseStore, Write},
    store::{LeaseEnv, LeaseRecord, LeaseState, LedgerError, Owner},
};
use provider_abi::{
    AcquireParams, ByteSink, ByteSource, CreationRecorder, EnvironmentParams, ErrorKind, Hook, HookFuture,
    HookResult, Lease, LeaseParams, OutputStream, ProbeReport, ProviderError, RecordCreation, Workspace,
};
use scopeguard::{guard, ScopeGuard};
use serde_json::Value;
use std::{
    future::Future,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, OnceLock,
    },
};
use tokio::sync::{mpsc, oneshot};

/// What a lease the ledger knows as unconfirmed is refused with (a command,
/// a sync), and why a release destroyed it instead: the seed's sentence, word
/// for word, as users search for it.
pub const UNCONFIRMED_MESSAGE: &str =
    "CreateOS process cleanup is unconfirmed; destroy this lease before reusing it.";

/// The most of a command's output [`Host::execute`] holds for its `output`
/// callback (16 CreateOS journals): a reader that falls further behind loses
/// the rest of the output, as it would at the API, and the call fails with
/// [`OUTPUT_DROPPED_MESSAGE`] once the command ended; memory stays bounded
/// however long the command writes.
pub const OUTPUT_BACKLOG: usize = 16 << 20;

/// What a command whose output was dropped ([`OUTPUT_BACKLOG`]) fails with.
pub const OUTPUT_DROPPED_MESSAGE: &str =
    "The command's output was read too slowly: more than 16 MiB of it waited, and the rest was dropped. Write bulk output to a file in the sandbox.";

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
    /// Not reusable: destroyed instead, because of this (the release rule's fallback).
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
/// could not prepare (both still `creating`), a release without reuse
/// deletes (`releasing`), and so do `destroying` and a failed cleanup.
fn delete_may_have_gone_out(state: LeaseState) -> bool {
    matches!(
        state,
        LeaseState::Creating | LeaseState::Releasing | LeaseState::Destroying | LeaseState::CleanupFailed
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

/// The error of a lease the ledger knows as unconfirmed.
fn unconfirmed() -> ProviderError {
    ProviderError::new(ErrorKind::CLEANUP_UNCONFIRMED, UNCONFIRMED_MESSAGE)
}

fn ledger_error(error: LedgerError) -> ProviderError {
    ProviderError::internal(format!("cannot record the lease: {error}"))
}

/// Awaits `call` while handing each message `messages` receives to `serve`
/// (a command's output, a creation moment to record), in the order sent; the
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

/// The write a moment a creating hook reported asks for (see
/// [`CreationRecorder`]), and where its outcome goes once durable. Boxed: a
/// channel allocates its slots 32 at a time, for every creation in flight.
type Reported = Box<(Write, Done)>;

/// Who learnt first how a creation's `sending` record ended, set once by
/// whoever did: the provider (`true`: told it is durable, it sends its
/// request) or the host (`false`: it stopped waiting before the provider was
/// told). So a request the host gave up on while its record was being
/// committed never leaves, and the host can say so in the ledger.
type SendingClaim = Arc<OnceLock<bool>>;

/// The recorder a creating hook reports to: each moment's write to the row
/// goes to the host's future over a channel, which submits it to the ledger
/// (the recorder cannot hold the borrowed ledger), and the ledger's answer
/// comes back once it is durable. The provider polls the answer on its own
/// runtime; a channel needs none. Once the host stopped waiting (its future
/// dropped), the answer is an error, and the provider sends nothing more or
/// deletes what it created.
struct ChannelRecorder {
    moments: mpsc::UnboundedSender<Reported>,
    claim: SendingClaim,
    /// The row and hook the moments are recorded on.
    row: i64,
    hook: String,
}

impl ChannelRecorder {
    /// Sends `write` to be recorded, and answers once it is durable.
    fn report(&self, write: Write) -> HookFuture<()> {
        let sending = matches!(write, Write::SetState { .. });
        let (answer, answered) = oneshot::channel();
        let sent = self.moments.send(Box::new((write, Box::new(move |done| drop(answer.send(done))))));
        let claim = Arc::clone(&self.claim);
        Box::pin(async move {
            let gone = || ProviderError::internal("The host stopped waiting for the creation's record.");
            sent.map_err(|_| gone())?;
            answered.await.map_err(|_| gone())?.map_err(ledger_error)?;
            // Heard, unless the host stopped waiting first: then the request must not leave.
            if sending && !*claim.get_or_init(|| true) {
                return Err(gone());
            }
            Ok(())
        })
    }
}

impl RecordCreation for ChannelRecorder {
    fn sending(&mut self) -> HookFuture<()> {
        let (row, hook) = (self.row, self.hook.clone());
        self.report(Write::SetState { row, state: LeaseState::Creating, hook, error: None })
    }

    fn created(&mut self, lease: &Lease) -> HookFuture<()> {
        let (row, hook, lease) = (self.row, self.hook.clone(), lease.clone());
        self.report(Write::SetLease { row, state: LeaseState::Creating, hook, lease })
    }
}

/// A chunk of a command's output. Boxed: a channel allocates its slots 32
/// at a time.
type Chunk = Box<(OutputStream, Vec<u8>)>;

impl<'a> Host<'a> {
    /// A host acting for `config`, recording leases as `owner`'s with `run_id`.
    pub fn new(
        provider: &'a dyn HookSupport,
        ledger: &'a dyn LeaseStore,
        config: &Environment,
        owner: Owner,
        run_id: &str,
    ) -> Self {
        let env = config.params(&provider.manifest().driver_key);
        let lease_env = LeaseEnv {
            driver_key: env.driver_key.to_string(),
            company_id: config.company_id.clone(),
            environment_id: config.environment_id.clone(),
            config: storable_config(provider, &env, &config.config),
            api_in_process: config.api_in_process,
        };
        Host { provider, ledger, env, lease_env, owner, run_id: run_id.to_owned() }
    }

    /// The hook parameters of this environment.
    pub fn env(&self) -> &EnvironmentParams {
        &self.env
    }

    /// The parameters of a hook acting on `lease`.
    pub fn params(&self, lease: &Lease) -> LeaseParams {
        LeaseParams::new(self.env.clone(), self.run_id.as_str(), lease)
    }

    async fn record(
        &self,
        row: i64,
        state: LeaseState,
        hook: &str,
        error: Option<&ProviderError>,
    ) -> HookResult<()> {
        let write = Write::SetState { row, state, hook: hook.to_owned(), error: error.cloned() };
        self.ledger.committed(write).await.map(drop).map_err(ledger_error)
    }

    /// Records `lease` on row `row`, now `active`.
    async fn record_lease(&self, row: i64, hook: &str, lease: &Lease) -> HookResult<()> {
        let write =
            Write::SetLease { row, state: LeaseState::Active, hook: hook.into(), lease: lease.clone() };
        self.ledger.committed(write).await.map(drop).map_err(ledger_error)
    }

    /// `validate_config`.
    pub fn validate(&self) -> HookResult<provider_abi::ValidationReport> {
        self.provider.validate_config(&self.env)
    }

    /// Runs a creating hook (`call`, given the recorder) on a new row of
    /// `owner`'s run `run_id`, and returns the row with the hook's value.
    /// The row is `acquiring` first: queued, not awaited until durable.
    /// Nothing exists remotely until the provider reports its creation
    /// request leaving, and that report's write (or, for a call that sends
    /// nothing, the write after it returns) is durable only once this row
    /// is. Each moment the hook reports is committed (as by hook `hook`)
    /// before the provider goes on: `creating` when the request is about to
    /// leave, the lease the moment the reply names it. A failed hook's row
    /// is left as [`Host::after_failed_creation`] says.
    async fn creating<T>(
        &self,
        owner: Owner,
        run_id: &str,
        hook: &str,
        call: impl FnOnce(CreationRecorder) -> HookFuture<T>,
    ) -> HookResult<(i64, T)> {
        let env = self.lease_env.clone();
        let begin = Write::Begin { owner, run_id: run_id.to_owned(), env, hook: hook.to_owned() };
        let row = self.ledger.queued(begin).await.map_err(ledger_error)?;
        let (sender, moments) = mpsc::unbounded_channel::<Reported>();
        let claim = SendingClaim::default();
        // Armed once the `creating` record is submitted: if the host's future
        // is dropped before the provider heard it is durable, the request
        // never left, and the row goes back to `acquiring` (a sweep then
        // closes it without a word instead of reporting a creation that may
        // exist). Submitted after the `creating` record, so committed after it.
        let mut unsent = guard(false, |armed| {
            if armed && claim.set(false).is_ok() {
                let write =
                    Write::SetState { row, state: LeaseState::Acquiring, hook: hook.to_owned(), error: None };
                self.ledger.submit(write, Box::new(drop));
            }
        });
        let record = |reported: Reported| {
            let (write, done) = *reported;
            // The `creating` record of a request about to leave arms `unsent`.
            *unsent |= matches!(write, Write::SetState { .. });
            self.ledger.submit(write, done);
        };
        let recorder =
            ChannelRecorder { moments: sender, claim: Arc::clone(&claim), row, hook: hook.to_owned() };
        let outcome = serving(call(CreationRecorder::new(recorder)), moments, record).await;
        ScopeGuard::into_inner(unsent);
        match outcome {
            Ok(value) => Ok((row, value)),
            Err(error) => self.after_failed_creation(row, hook, error).await,
        }
    }

    /// After a creating hook on row `row` failed with `error`: a call the
    /// provider refused before any request leaves no row; one that may have
    /// left a sandbox stays `creating` (destroyed now when the way to the
    /// provider failed under it); any other is over. Returns `error` for
    /// the caller to pass on.
    async fn after_failed_creation<T>(&self, row: i64, hook: &str, error: ProviderError) -> HookResult<T> {
        if refused_before_any_request(&error) {
            self.forget_refused(row);
        } else if !may_have_left_a_sandbox(&error) {
            self.record(row, LeaseState::Destroyed, hook, Some(&error)).await?;
        } else {
            self.record(row, LeaseState::Creating, hook, Some(&error)).await?;
            self.destroy_if_creator_lost(row, &error).await;
        }
        Err(error)
    }

    /// `probe`, recorded as a probe row: `acquiring` until the provider
    /// reports its creation request leaving, then `creating`, and `destroyed`
    /// once it returns unless the error says a sandbox may remain; a probe
    /// the provider refused before any request leaves no row.
    pub async fn probe(&self) -> HookResult<ProbeReport> {
        let hook = Hook::Probe.name();
        let probe = |recorder| self.provider.probe(self.env.clone(), recorder);
        let (row, report) = self.creating(Owner::Probe, "probe", hook, probe).await?;
        self.record(row, LeaseState::Destroyed, hook, None).await?;
        Ok(report)
    }

    /// `acquire_lease`, recorded `acquiring` before the call, `creating`
    /// once the provider reports its creation request leaving, with the
    /// lease id the moment the reply names it, and `active` after; an
    /// acquire the provider refused before any request leaves no row.
    pub async fn acquire(&self) -> HookResult<HeldLease> {
        let hook = Hook::AcquireLease.name();
        let params = AcquireParams {
            env: self.env.clone(),
            run_id: self.run_id.as_str().into(),
            requested_expires_at: None.into(),
        };
        let acquire = |recorder| self.provider.acquire_lease(params, recorder);
        let (row, lease) = self.creating(self.owner, &self.run_id, hook, acquire).await?;
        // Dropped before the lease reaches the caller, it is destroyed.
        let unclaimed = guard(self.params(&lease), |params| self.destroy_unclaimed(row, params));
        self.record_lease(row, hook, &lease).await?;
        ScopeGuard::into_inner(unclaimed);
        Ok(HeldLease::new(row, lease))
    }

    /// Destroys the lease of `params`, acquired on row `row`, that has not
    /// reached the host's caller: the caller dropped the host's future while
    /// it awaited the lease's `active` record, or that record failed, so
    /// nobody holds the lease. Waits on the dropping thread (`Drop` cannot
    /// await) and records the outcome after the `active` record:
    /// `destroyed`, or `cleanup_failed` (which `sweep` destroys) when the
    /// destroy failed.
    fn destroy_unclaimed(&self, row: i64, params: LeaseParams) {
        let id = params.provider_lease_id.as_ref().map(|id| id.to_string()).into_option();
        let hook = Hook::DestroyLease.name().to_owned();
        let (state, error) = match crate::wait(self.provider.destroy_lease(params)) {
            Ok(()) => {
                tracing::warn!(lease = ?id, "destroyed a lease acquired for a caller that stopped waiting");
                (LeaseState::Destroyed, None)
            }
            Err(error) => {
                tracing::warn!(
                    lease = ?id,
                    kind = %error.kind,
                    "a lease acquired for a caller that stopped waiting is left running; `sweep` destroys it"
                );
                (LeaseState::CleanupFailed, Some(error))
            }
        };
        // Submitted after the `active` record, so committed after it.
        self.ledger.submit(Write::SetState { row, state, hook, error }, Box::new(drop));
    }

    /// After a creating hook failed with `error`, leaving row `row`
    /// `creating`: when the way to the provider failed under it (a worker
    /// process died), the provider's own clean-up of what it created died
    /// with it, so the host destroys the sandbox the row recorded, as the
    /// provider would have. A sandbox that cannot be destroyed now is named
    /// in a warning: `sweep` destroys it later.
    async fn destroy_if_creator_lost(&self, row: i64, error: &ProviderError) {
        if !self.provider.is_transport_failure(error) {
            return;
        }
        let record = self.ledger.get(row).ok().flatten();
        let Some(record) = record.filter(|record| record.provider_lease_id.is_some()) else { return };
        let held = HeldLease::new(row, record.lease());
        match self.destroy_left_behind(&held, LeaseState::Creating).await {
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
        let (company, environment) = (&self.lease_env.company_id, &self.lease_env.environment_id);
        let id = lease.provider_lease_id.as_ref().into_option();
        let known = id.map(|id| self.ledger.find(id, company, environment)).transpose();
        match known.map_err(ledger_error)?.flatten() {
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
        if refused_before_any_request(&error) {
            if held.provisional {
                self.forget_refused(held.row);
            } else if let Some(Err(ledger)) = before.map(|before| self.ledger.restore(before)) {
                tracing::warn!(row = held.row, error = %ledger, "cannot put back a refused call's row");
            }
        }
        error
    }

    /// After `hook` failed with `error`: undone as [`Host::undo_if_refused`]
    /// says when the provider refused it before any request, else recorded
    /// on the row, which goes to `state`.
    async fn failed<T>(
        &self,
        held: &HeldLease,
        before: Option<LeaseRecord>,
        hook: &str,
        state: LeaseState,
        error: ProviderError,
    ) -> HookResult<T> {
        if !refused_before_any_request(&error) {
            self.record(held.row, state, hook, Some(&error)).await?;
        }
        Err(self.undo_if_refused(held, before.as_ref(), error))
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

    /// Calls `call`, a hook (`hook`) that would reuse `held`, under the
    /// release rule. The row is `during` while it runs, and `failed` after
    /// an error ([`Host::failed`]). A lease the ledger knows as unconfirmed,
    /// or that the hook finds so (then recorded unconfirmed), is logged and
    /// destroyed instead of `instead_of`: `Ok(Err(why))`.
    async fn reuse<T, F: Future<Output = HookResult<T>>>(
        &self,
        held: &HeldLease,
        hook: &str,
        (during, failed): (LeaseState, LeaseState),
        instead_of: &str,
        call: impl FnOnce() -> F,
    ) -> HookResult<Result<T, ProviderError>> {
        let before = self.row(held)?;
        let why = if before.as_ref().is_some_and(|record| record.state == LeaseState::Unconfirmed) {
            unconfirmed()
        } else {
            self.record(held.row, during, hook, None).await?;
            match call().await {
                Ok(value) => return Ok(Ok(value)),
                Err(error) if error.kind == ErrorKind::CLEANUP_UNCONFIRMED => {
                    self.record(held.row, LeaseState::Unconfirmed, hook, Some(&error)).await?;
                    error
                }
                Err(error) => return self.failed(held, before, hook, failed, error).await,
            }
        };
        tracing::warn!(
            lease = held.id().unwrap_or("-"),
            "lease cleanup is unconfirmed; destroying it instead of {instead_of}"
        );
        self.destroy(held).await?;
        Ok(Err(why))
    }

    /// `resume_lease`. A lease the ledger knows as unconfirmed (or that the
    /// provider refuses as unconfirmed) is destroyed instead, and comes back
    /// expired: the caller must acquire a new one.
    pub async fn resume(&self, held: &HeldLease) -> HookResult<Lease> {
        let hook = Hook::ResumeLease.name();
        let resume = || self.provider.resume_lease(self.params(&held.lease));
        // Recorded as active before the call: a resume cut short may leave it running.
        let states = (LeaseState::Active, LeaseState::Active);
        match self.reuse(held, hook, states, "resuming it", resume).await? {
            Err(_) => Ok(Lease { provider_lease_id: None.into(), expired: true, ..held.lease.clone() }),
            Ok(lease) if lease.expired => {
                // An expired lease's sandbox may still exist (the configuration
                // changed, or its marker did not read back): give it back
                // rather than leak it. A failed destroy leaves the row for
                // `sweep`.
                if let Err(error) = self.destroy(held).await {
                    tracing::warn!(lease = ?held.id(), error = %error, "destroying an expired lease failed");
                }
                Ok(lease)
            }
            Ok(lease) => {
                self.record_lease(held.row, hook, &lease).await?;
                Ok(lease)
            }
        }
    }

    /// `release_lease` for reuse, with the release rule's fallback: an unconfirmed
    /// lease (known to the ledger, or reported by the release) is destroyed.
    pub async fn release(&self, held: &HeldLease) -> HookResult<Released> {
        let hook = Hook::ReleaseLease.name();
        let release = || self.provider.release_lease(self.params(&held.lease));
        let states = (LeaseState::Releasing, LeaseState::CleanupFailed);
        let (state, released) =
            match self.reuse(held, hook, states, "releasing it for reuse", release).await? {
                Ok(report) if report.kept => (LeaseState::Paused, Released::Kept),
                Ok(_) => (LeaseState::Destroyed, Released::Deleted),
                Err(why) => return Ok(Released::DestroyedInstead(why)),
            };
        self.record(held.row, state, hook, None).await?;
        Ok(released)
    }

    /// `destroy_lease`: `destroying` before, `destroyed` or `cleanup_failed`
    /// after; a destroy the provider refused before any request leaves the
    /// row as it was.
    pub async fn destroy(&self, held: &HeldLease) -> HookResult<()> {
        let hook = Hook::DestroyLease.name();
        let before = self.row(held)?;
        self.record(held.row, LeaseState::Destroying, hook, None).await?;
        match self.provider.destroy_lease(self.params(&held.lease)).await {
            Ok(()) => self.record(held.row, LeaseState::Destroyed, hook, None).await,
            Err(error) => self.failed(held, before, hook, LeaseState::CleanupFailed, error).await,
        }
    }

    /// Destroys a lease a gone host left behind in `state`. Where that host
    /// may already have sent the DELETE (`delete_may_have_gone_out`), the
    /// provider is asked first whether the lease still exists
    /// (`inspect_lease`): one already gone is recorded destroyed without a
    /// second DELETE. Otherwise, or when it cannot say, destroys.
    pub async fn destroy_left_behind(&self, held: &HeldLease, state: LeaseState) -> HookResult<()> {
        let gone = delete_may_have_gone_out(state)
            && self.provider.supports(Hook::InspectLease)
            && self.provider.inspect_lease(self.params(&held.lease)).await.is_ok_and(|status| !status.exists);
        if !gone {
            return self.destroy(held).await;
        }
        tracing::info!(lease = ?held.id(), %state, "a lease left behind was already gone");
        self.record(held.row, LeaseState::Destroyed, Hook::InspectLease.name(), None).await
    }

    /// `realize_workspace` (no state change).
    pub fn realize(&self, held: &HeldLease) -> HookResult<Workspace> {
        self.provider
            .realize_workspace(&self.params(&held.lease))
            .map_err(|error| self.undo_if_refused(held, None, error))
    }

    /// `execute` in the lease: the command's standard input pulled from
    /// `stdin` as the provider sends it on, its output handed to `output` as
    /// it arrives (raw bytes, as the command wrote them; past
    /// [`OUTPUT_BACKLOG`] bytes waiting for `output`, the rest is dropped
    /// and the call fails); dropping the future stops the command. A lease
    /// the ledger knows as unconfirmed is refused before any call. After a failure the provider is asked
    /// (`inspect_lease`) whether the lease's cleanup became unconfirmed, and
    /// the ledger notes it.
    pub async fn execute(
        &self,
        held: &HeldLease,
        command: RemoteCommand,
        stdin: ByteSource,
        output: &mut (dyn FnMut(OutputStream, &[u8]) + Send),
    ) -> HookResult<CommandOutcome> {
        self.refuse_if_unconfirmed(held)?;
        let lease = self.params(&held.lease);
        // The output chunks go over a channel to this future, which counts
        // the bytes waiting (a chunk alone always fits). Once one is dropped,
        // so is every later one; the bytes of those are never taken back.
        let (sender, chunks) = mpsc::unbounded_channel::<Chunk>();
        let waiting = Arc::new(AtomicUsize::new(0));
        let queued = Arc::clone(&waiting);
        let mut dropping = false;
        let sink = ByteSink::new(move |stream, chunk: &[u8]| {
            let before = queued.fetch_add(chunk.len(), Ordering::SeqCst);
            if !dropping && before > 0 && before + chunk.len() > OUTPUT_BACKLOG {
                dropping = true;
                tracing::warn!(
                    limit = OUTPUT_BACKLOG,
                    "the command's output is read too slowly: the rest is dropped"
                );
            }
            if !dropping {
                drop(sender.send(Box::new((stream, chunk.to_vec()))));
            }
        });
        let call = self.provider.execute(command.into_params(lease.clone()), stdin, sink);
        let serve = |chunk: Chunk| {
            output(chunk.0, &chunk.1);
            waiting.fetch_sub(chunk.1.len(), Ordering::SeqCst);
        };
        let error = match serving(call, chunks, serve).await {
            Ok(_) if waiting.load(Ordering::SeqCst) > 0 => {
                return Err(ProviderError::internal(OUTPUT_DROPPED_MESSAGE))
            }
            Ok(result) => return Ok(result.into()),
            Err(error) => self.undo_if_refused(held, None, error),
        };
        // A worker that died under the command took its cleanup with it:
        // the command's processes may still run. So may a process whose
        // creation is unknown. (After a swap, `inspect_lease` asks the
        // version now active, which may not be the one that ran the call.)
        let unconfirmed = error.kind == ErrorKind::CLEANUP_UNCONFIRMED
            || error.kind == ErrorKind::CREATION_UNCONFIRMED
            || self.provider.is_transport_failure(&error)
            || (self.provider.supports(Hook::InspectLease)
                && self.provider.inspect_lease(lease.clone()).await.is_ok_and(|status| status.unconfirmed));
        if unconfirmed {
            tracing::warn!(lease = held.id().unwrap_or("-"), "command cleanup is unconfirmed on the lease");
            self.record(held.row, LeaseState::Unconfirmed, Hook::Execute.name(), Some(&error)).await?;
            // A call still running on a version a swap retired marks the
            // lease there only: the version now active learns it here.
            crate::unconfirmed_handover::hand_over(self.provider, &lease);
        }
        Err(error)
    }

    /// Refuses, before any call, a lease the ledger knows as unconfirmed:
    /// a command or a sync must not run where processes may still be running.
    fn refuse_if_unconfirmed(&self, held: &HeldLease) -> HookResult<()> {
        match self.row(held)? {
            Some(record) if record.state == LeaseState::Unconfirmed => Err(unconfirmed()),
            _ => Ok(()),
        }
    }

    /// Whether the provider implements file sync (`sync_files`).
    pub fn can_sync(&self) -> bool {
        self.provider.supports(Hook::SyncFiles)
    }

    /// `sync_files` into or out of the lease, as `params.direction` says
    /// (inbound: host files in, then the post-upload commands). A provider
    /// without it is refused with `unsupported`, and a lease the ledger
    /// knows as unconfirmed is refused, both before any call; dropping the
    /// future stops the sync.
    pub async fn sync(&self, held: &HeldLease, transfer: FileTransfer) -> HookResult<TransferOutcome> {
        if !self.can_sync() {
            return Err(provider_abi::unsupported(Hook::SyncFiles));
        }
        self.refuse_if_unconfirmed(held)?;
        let params = transfer.into_params(self.params(&held.lease));
        let outcome = self.provider.sync_files(params).await;
        outcome.map(TransferOutcome::from).map_err(|error| self.undo_if_refused(held, None, error))
    }
}
