//! The provider's hooks through the `Provider` trait, against the CreateOS
//! simulator: the write-ahead moments of the creating hooks, the byte
//! source and sink of `execute`, both directions of `sync_files` and the
//! seed's release semantics.

use createos_provider::CreateosProvider;
use createos_sim::{SimConfig, Simulator};
use provider_abi::{
    AcquireParams, ByteSink, ByteSource, CreationRecorder, EnvironmentParams, ErrorKind, ExecuteParams,
    HookFuture, Lease, LeaseParams, OutputStream, Provider, ProviderError, RecordCreation, SyncDirection,
    SyncParams,
};
use std::sync::{Arc, Mutex};

/// A simulator without rate limit, and the environment of a provider using it.
fn simulator(reuse_lease: bool) -> (Arc<Simulator>, EnvironmentParams) {
    let sim = Simulator::start(SimConfig { rate_limit: None, ..SimConfig::default() }).expect("simulator");
    let env = EnvironmentParams {
        driver_key: "createos".into(),
        company_id: "company".into(),
        environment_id: "environment".into(),
        config_json: sim.provider_config(reuse_lease).to_string().into(),
        ..Default::default()
    };
    (Arc::new(sim), env)
}

fn acquire_params(env: &EnvironmentParams) -> AcquireParams {
    AcquireParams { env: env.clone(), run_id: "run".into(), requested_expires_at: None.into() }
}

fn lease_params(env: &EnvironmentParams, lease: &Lease) -> LeaseParams {
    LeaseParams {
        env: env.clone(),
        run_id: "run".into(),
        provider_lease_id: lease.provider_lease_id.clone(),
        metadata_json: lease.metadata_json.clone(),
    }
}

/// The moments a [`Journal`] heard, each with the creations seen by then.
type Heard = Arc<Mutex<Vec<(String, usize)>>>;

/// The chunks a sink received, in order.
type Written = Arc<Mutex<Vec<(OutputStream, Vec<u8>)>>>;

/// Keeps each moment it hears with the number of sandbox creations the
/// simulator had received by then; refuses the moment `refuse` names.
struct Journal {
    sim: Arc<Simulator>,
    heard: Heard,
    refuse: Option<&'static str>,
}

impl Journal {
    fn note(&mut self, moment: &str) -> HookFuture<()> {
        let creations = self.sim.ledger().count("POST", "/v1/sandboxes");
        self.heard.lock().unwrap().push((moment.to_owned(), creations));
        let answer = match self.refuse == Some(moment) {
            true => Err(ProviderError::internal("the ledger is read-only")),
            false => Ok(()),
        };
        provider_abi::ready(answer)
    }
}

impl RecordCreation for Journal {
    fn sending(&mut self) -> HookFuture<()> {
        self.note("sending")
    }

    fn created(&mut self, lease: &Lease) -> HookFuture<()> {
        assert!(lease.provider_lease_id.is_some(), "the recorded lease names its sandbox");
        self.note("created")
    }
}

fn journal(sim: &Arc<Simulator>, refuse: Option<&'static str>) -> (CreationRecorder, Heard) {
    let heard = Arc::new(Mutex::new(Vec::new()));
    let recorder = CreationRecorder::new(Journal { sim: Arc::clone(sim), heard: Arc::clone(&heard), refuse });
    (recorder, heard)
}

fn moments(heard: &Heard) -> Vec<(String, usize)> {
    heard.lock().unwrap().clone()
}

#[tokio::test(flavor = "multi_thread")]
async fn acquire_announces_its_request_before_it_leaves_and_records_the_sandbox_it_names() {
    let (sim, env) = simulator(false);
    let provider = CreateosProvider::default();
    let (recorder, heard) = journal(&sim, None);
    let lease = provider.acquire_lease(acquire_params(&env), recorder).await.unwrap();
    assert_eq!(moments(&heard), [("sending".to_owned(), 0), ("created".to_owned(), 1)]);
    let id = lease.provider_lease_id.clone().unwrap().to_string();
    assert_eq!(sim.live_sandboxes(), [id]);
    provider.destroy_lease(lease_params(&env, &lease)).await.unwrap();
    assert!(sim.live_sandboxes().is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_refused_announcement_creates_nothing_and_fails_with_the_hosts_error() {
    let (sim, env) = simulator(false);
    let provider = CreateosProvider::default();
    let (recorder, heard) = journal(&sim, Some("sending"));
    let error = provider.acquire_lease(acquire_params(&env), recorder).await.unwrap_err();
    assert_eq!(error, ProviderError::internal("the ledger is read-only"));
    assert_eq!(moments(&heard), [("sending".to_owned(), 0)]);
    assert_eq!(sim.ledger().count("POST", "/v1/sandboxes"), 0, "the creation request never left");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_refused_record_deletes_the_sandbox_before_anything_else() {
    let (sim, env) = simulator(false);
    let provider = CreateosProvider::default();
    let (recorder, heard) = journal(&sim, Some("created"));
    let error = provider.acquire_lease(acquire_params(&env), recorder).await.unwrap_err();
    assert_eq!(error.kind, ErrorKind::INTERNAL);
    assert!(
        error.message.ends_with("because the host could not record it: the ledger is read-only"),
        "{error:?}"
    );
    assert_eq!(moments(&heard), [("sending".to_owned(), 0), ("created".to_owned(), 1)]);
    assert!(sim.live_sandboxes().is_empty());
    assert_eq!(sim.ledger().count("POST", "/v1/sandboxes/*/exec"), 0, "no workspace was prepared");
}

#[tokio::test(flavor = "multi_thread")]
async fn probe_announces_and_records_its_sandbox_and_deletes_it() {
    let (sim, env) = simulator(false);
    let provider = CreateosProvider::default();
    let (recorder, heard) = journal(&sim, None);
    let report = provider.probe(env, recorder).await.unwrap();
    assert!(report.ok, "{}", report.message);
    assert_eq!(moments(&heard), [("sending".to_owned(), 0), ("created".to_owned(), 1)]);
    assert!(sim.live_sandboxes().is_empty());
}

/// Collects what the sink receives.
fn collecting() -> (ByteSink, Written) {
    let written = Arc::new(Mutex::new(Vec::new()));
    let kept = Arc::clone(&written);
    let sink = ByteSink::new(move |stream, chunk: &[u8]| kept.lock().unwrap().push((stream, chunk.to_vec())));
    (sink, written)
}

fn stream_bytes(written: &Written, stream: OutputStream) -> Vec<u8> {
    written.lock().unwrap().iter().filter(|(s, _)| *s == stream).flat_map(|(_, b)| b.clone()).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn execute_reads_stdin_from_the_source_and_writes_raw_bytes_to_the_sink() {
    let (_sim, env) = simulator(false);
    let provider = CreateosProvider::default();
    let lease = provider.acquire_lease(acquire_params(&env), CreationRecorder::discard()).await.unwrap();
    let params = ExecuteParams {
        lease: lease_params(&env, &lease),
        command: "/bin/sh".into(),
        args: vec!["-c".into(), "cat; printf '\\377' >&2".into()].into(),
        ..Default::default()
    };
    let input = b"caf\xc3\xa9 \x00 binary\n".to_vec();
    let (sink, written) = collecting();
    let result = provider.execute(params.clone(), ByteSource::from_bytes(input.clone()), sink).await.unwrap();
    assert_eq!(result.exit_code.into_option(), Some(0));
    assert_eq!(stream_bytes(&written, OutputStream::Stdout), input);
    assert_eq!(stream_bytes(&written, OutputStream::Stderr), b"\xff", "bytes as written, not decoded");
    assert_eq!(result.stdout.as_str(), "café \0 binary\n");
    assert_eq!(result.stderr.as_str(), "\u{fffd}");

    // An empty source: the command reads end of input at once.
    let (sink, written) = collecting();
    let result = provider.execute(params, ByteSource::empty(), sink).await.unwrap();
    assert_eq!(result.exit_code.into_option(), Some(0));
    assert_eq!(stream_bytes(&written, OutputStream::Stdout), b"");
    provider.destroy_lease(lease_params(&env, &lease)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn sync_files_moves_a_file_in_and_back_out_as_its_direction_says() {
    let (_sim, env) = simulator(false);
    let provider = CreateosProvider::default();
    let lease = provider.acquire_lease(acquire_params(&env), CreationRecorder::discard()).await.unwrap();
    let host = tempfile::tempdir().unwrap();
    let (source, back) = (host.path().join("in.bin"), host.path().join("out.bin"));
    std::fs::write(&source, b"\x00\x01 sync").unwrap();
    let remote = "/paperclip-workspace/moved.bin";
    let params = lease_params(&env, &lease);
    let sync_in =
        SyncParams::single(params.clone(), SyncDirection::In, "in", "file", source.to_str().unwrap(), remote);
    let moved = provider.sync_files(sync_in).await.unwrap();
    assert_eq!(moved.operations[0].bytes_transferred, 7);
    let sync_out =
        SyncParams::single(params.clone(), SyncDirection::Out, "out", "file", remote, back.to_str().unwrap());
    let moved = provider.sync_files(sync_out).await.unwrap();
    assert_eq!(moved.operations[0].files_transferred, 1);
    assert_eq!(std::fs::read(&back).unwrap(), b"\x00\x01 sync");
    provider.destroy_lease(params).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn release_follows_the_seed_an_unconfirmed_lease_is_only_destroyed() {
    let (sim, env) = simulator(true);
    let provider = CreateosProvider::default();
    let lease = provider.acquire_lease(acquire_params(&env), CreationRecorder::discard()).await.unwrap();
    let params = lease_params(&env, &lease);
    let report = provider.release_lease(params.clone()).await.unwrap();
    assert!(report.kept, "reuse pauses the sandbox");
    let resumed = provider.resume_lease(params.clone()).await.unwrap();
    assert!(!resumed.expired);

    provider.import_unconfirmed(&params).unwrap();
    let error = provider.release_lease(params.clone()).await.unwrap_err();
    assert_eq!(error.kind, ErrorKind::CLEANUP_UNCONFIRMED);
    assert_eq!(
        error.message.as_str(),
        "CreateOS process cleanup is unconfirmed; destroy this lease before reusing it."
    );
    assert_eq!(sim.live_sandboxes().len(), 1, "refused before any request");
    provider.destroy_lease(params.clone()).await.unwrap();
    assert!(sim.live_sandboxes().is_empty());
    assert!(!provider.release_lease(params).await.unwrap().kept, "a deleted lease is not kept");
}

/// Waits (bounded) until `condition` holds on the simulator's ledger: the
/// provider finishes a cancelled call's cleanup on its own runtime.
async fn wait_for_ledger(sim: &Simulator, what: &str, condition: impl Fn(&createos_sim::Ledger) -> bool) {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    while !condition(&sim.ledger()) {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

/// Awaits `future` until `reached` holds on the simulator's ledger, then
/// drops it; `Some(result)` if it completed first.
async fn drop_when<T>(
    sim: &Simulator,
    future: HookFuture<T>,
    reached: impl Fn(&createos_sim::Ledger) -> bool,
) -> Option<provider_abi::HookResult<T>> {
    let mut future = future;
    let mut tick = tokio::time::interval(std::time::Duration::from_millis(1));
    loop {
        tokio::select! {
            result = &mut future => return Some(result),
            _ = tick.tick() => if reached(&sim.ledger()) {
                return None;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_acquire_dropped_once_its_sandbox_exists_deletes_it() {
    let (sim, env) = simulator(false);
    let provider = CreateosProvider::default();
    let (recorder, heard) = journal(&sim, None);
    let acquire = provider.acquire_lease(acquire_params(&env), recorder);
    let outcome = drop_when(&sim, acquire, |ledger| ledger.sandboxes.len() == 1).await;
    assert!(outcome.is_none(), "dropped before the acquire ended");
    wait_for_ledger(&sim, "the dropped acquire's sandbox deleted", |ledger| ledger.leaked().is_empty()).await;
    assert_eq!(moments(&heard)[0], ("sending".to_owned(), 0));
}

#[tokio::test(flavor = "multi_thread")]
async fn an_execute_dropped_while_its_command_runs_terminates_the_process_and_keeps_the_lease() {
    let (sim, env) = simulator(true);
    let provider = CreateosProvider::default();
    let lease = provider.acquire_lease(acquire_params(&env), CreationRecorder::discard()).await.unwrap();
    let command = |command: &str, args: &[&str]| ExecuteParams {
        lease: lease_params(&env, &lease),
        command: command.into(),
        args: args.iter().map(|arg| (*arg).into()).collect(),
        // Beyond the wait's bound: only the cancellation can end it in time.
        timeout_ms: Some(120_000).into(),
        ..Default::default()
    };
    let sleep = provider.execute(command("/bin/sleep", &["300"]), ByteSource::empty(), ByteSink::discard());
    let started =
        |ledger: &createos_sim::Ledger| ledger.count("GET", "/v1/sandboxes/*/processes/*/connect") == 1;
    assert!(drop_when(&sim, sleep, started).await.is_none(), "a 300 s command does not end by itself");
    wait_for_ledger(&sim, "the dropped command's process terminated", |ledger| {
        ledger.unterminated_processes() == 0
    })
    .await;
    let (sink, written) = collecting();
    let again = provider.execute(command("/bin/echo", &["again"]), ByteSource::empty(), sink).await.unwrap();
    assert_eq!(stream_bytes(&written, OutputStream::Stdout), b"again\n", "the lease is still usable");
    assert_eq!(again.exit_code.into_option(), Some(0));
    provider.destroy_lease(lease_params(&env, &lease)).await.unwrap();
    assert!(sim.ledger().leaked().is_empty());
}
