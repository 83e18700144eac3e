//! The worker's side: load the library, say hello, serve hooks until the
//! host closes the socket.
//!
//! One reader thread reads frames; `health` and `validate_config` run on it
//! (checks that send no request, so their round trip is one thread hop
//! shorter; they delay the dispatch of other calls only while they run),
//! every other hook on a thread of a pool that grows to the number of hooks in flight. A
//! recording hook's thread sends the created lease and blocks until the
//! reader hands it the host's answer, so a write-ahead record still commits
//! before the provider goes on.

use super::{
    protocol::{self, Call, Hello, Reply, ToHost, ToWorker},
    spawn::WORKER_FD,
};
use provider_abi::{
    CreationRecorder, Hook, HookResult, Lease, LoadedProvider, OutputSink, OutputStream, Provider,
    ProviderError,
};
use std::{
    collections::HashMap,
    io::{self, BufReader},
    os::{fd::FromRawFd, unix::net::UnixStream},
    path::Path,
    process::ExitCode,
    sync::{
        atomic::{AtomicUsize, Ordering},
        mpsc, Arc, Mutex,
    },
};

/// Stack size of the pool's hook threads: hooks block on the provider's own
/// runtime, so they need little; a thousand hooks in flight stay cheap.
const HOOK_THREAD_STACK: usize = 1 << 20;

/// Runs the worker: serves the provider library at `library` on the socket
/// at file descriptor 3 (see [`super::spawn`]). Returns when the host closes
/// the socket; 2 when the library cannot be loaded or the socket is missing.
pub fn serve_worker(library: &Path) -> ExitCode {
    // SAFETY: fstat on a descriptor number only reads its status.
    let mut status = unsafe { std::mem::zeroed::<libc::stat>() };
    if unsafe { libc::fstat(WORKER_FD, &mut status) } != 0 || status.st_mode & libc::S_IFMT != libc::S_IFSOCK
    {
        eprintln!("host-harness __worker: no socket on file descriptor {WORKER_FD}; the worker is started by the host (--isolate)");
        return ExitCode::from(2);
    }
    // SAFETY: descriptor 3 is a socket (checked) that the spawner handed to
    // this process alone; nothing else in the process owns it.
    let socket = unsafe { UnixStream::from_raw_fd(WORKER_FD) };
    match Worker::start(library, socket) {
        Ok(Some((worker, reader))) => {
            worker.serve(reader);
            ExitCode::SUCCESS
        }
        // The host got the load error in the hello and reports it.
        Ok(None) => ExitCode::from(2),
        Err(error) => {
            eprintln!("host-harness __worker: {error}");
            ExitCode::from(2)
        }
    }
}

/// The pool's job: a hook call.
type Job = (u64, Call<'static>);

struct Worker {
    provider: LoadedProvider,
    writer: Mutex<UnixStream>,
    /// Recording hooks waiting for the host's answer, by call id.
    waiting: Mutex<HashMap<u64, mpsc::Sender<HookResult<()>>>>,
    idle: AtomicUsize,
    jobs: Mutex<mpsc::Receiver<Job>>,
    queue: mpsc::Sender<Job>,
}

impl Worker {
    /// Loads the library, says hello and runs the handshake; `None` when
    /// the library did not load (the hello told the host why).
    fn start(library: &Path, socket: UnixStream) -> io::Result<Option<(Arc<Worker>, BufReader<UnixStream>)>> {
        let mut writer = socket.try_clone()?;
        let mut reader = BufReader::new(socket.try_clone()?);
        let provider = match LoadedProvider::load(library) {
            Ok(provider) => provider,
            Err(error) => {
                protocol::write(&mut writer, &ToHost::Hello(Err(error.to_string())))?;
                return Ok(None);
            }
        };
        let supported = Hook::ALL.iter().filter(|hook| provider.supports(**hook)).map(|h| h.name().into());
        let hello = Hello { manifest: provider.manifest(), supported: supported.collect() };
        protocol::write(&mut writer, &ToHost::Hello(Ok(hello)))?;
        let mut buffer = Vec::new();
        let Some(ToWorker::Start { env, setup }) =
            protocol::read::<ToWorker<'static>>(&mut reader, &mut buffer)?
        else {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "the host did not start the worker"));
        };
        for (name, value) in env {
            // Before any hook runs; Rust's own readers of the environment
            // (the provider's `std::env::var`) take the same lock.
            std::env::set_var(name, value);
        }
        let ready = setup.map_or(Ok(()), |params| provider.setup(&params));
        protocol::write(&mut writer, &ToHost::Ready(ready))?;
        let (queue, jobs) = mpsc::channel();
        let worker = Worker {
            provider,
            writer: Mutex::new(writer),
            waiting: Mutex::new(HashMap::new()),
            idle: AtomicUsize::new(0),
            jobs: Mutex::new(jobs),
            queue,
        };
        Ok(Some((Arc::new(worker), reader)))
    }

    fn send(&self, message: &ToHost) -> io::Result<()> {
        let frame = protocol::encode(message)?;
        let mut writer = self.writer.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        io::Write::write_all(&mut *writer, &frame)
    }

    /// Reads frames until the host closes the socket (or it breaks).
    fn serve(self: Arc<Self>, mut reader: BufReader<UnixStream>) {
        let mut buffer = Vec::new();
        while let Ok(Some(message)) = protocol::read::<ToWorker<'static>>(&mut reader, &mut buffer) {
            match message {
                ToWorker::Call { id, call: call @ (Call::Health | Call::ValidateConfig(_)) } => {
                    let result = self.run(id, call);
                    if self.send(&ToHost::Reply { id, result }).is_err() {
                        break;
                    }
                }
                ToWorker::Call { id, call } => self.dispatch((id, call)),
                ToWorker::Recorded { id, result } => {
                    let waiter =
                        self.waiting.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).remove(&id);
                    if let Some(waiter) = waiter {
                        let _ = waiter.send(result);
                    }
                }
                ToWorker::Start { .. } => break,
            }
        }
        // The host is gone or closed the connection: nothing more to do.
        // Hooks still running would answer no one.
        std::process::exit(0);
    }

    /// Hands a call to an idle pool thread, or a new one.
    fn dispatch(self: &Arc<Self>, job: Job) {
        let claimed = self.idle.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |idle| idle.checked_sub(1));
        if claimed.is_err() {
            let worker = Arc::clone(self);
            let started = std::thread::Builder::new()
                .name("hook".into())
                .stack_size(HOOK_THREAD_STACK)
                .spawn(move || worker.pool_thread());
            if let Err(error) = started {
                let result = Err(ProviderError::internal(format!(
                    "the provider worker cannot start a thread: {error}"
                )));
                let _ = self.send(&ToHost::Reply { id: job.0, result });
                return;
            }
        }
        let _ = self.queue.send(job);
    }

    fn pool_thread(self: Arc<Self>) {
        loop {
            let job = self.jobs.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).recv();
            let Ok((id, call)) = job else { return };
            let result = self.run(id, call);
            if self.send(&ToHost::Reply { id, result }).is_err() {
                return;
            }
            self.idle.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Hands `lease` to the host and waits for its answer.
    fn record(&self, id: u64, lease: &Lease) -> HookResult<()> {
        let (answer, answered) = mpsc::channel();
        self.waiting.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).insert(id, answer);
        let lost =
            || ProviderError::internal("The host closed the worker's connection while recording a lease.");
        self.send(&ToHost::Record { id, lease: lease.clone() }).map_err(|_| lost())?;
        answered.recv().unwrap_or_else(|_| Err(lost()))
    }

    /// Runs one hook.
    fn run(&self, id: u64, call: Call<'static>) -> HookResult<Reply> {
        let provider = &self.provider;
        let mut record = |lease: &Lease| self.record(id, lease);
        match call {
            Call::Setup(params) => provider.setup(&params).map(|()| Reply::Unit),
            Call::Shutdown => provider.shutdown().map(|()| Reply::Unit),
            Call::Health => provider.health().map(Reply::Health),
            Call::ValidateConfig(params) => provider.validate_config(&params).map(Reply::Validation),
            Call::Probe(params) => provider.probe(&params).map(Reply::Probe),
            Call::AcquireLease(params) => provider.acquire_lease(&params).map(Reply::Lease),
            Call::ResumeLease(params) => provider.resume_lease(&params).map(Reply::Lease),
            Call::ReleaseLease(params) => provider.release_lease(&params).map(|()| Reply::Unit),
            Call::DestroyLease(params) => provider.destroy_lease(&params).map(|()| Reply::Unit),
            Call::RealizeWorkspace(params) => provider.realize_workspace(&params).map(Reply::Workspace),
            Call::Execute(params) => {
                let mut chunk = |stream: OutputStream, text: &str| {
                    // A host that went away ends the worker through the reader.
                    let _ = self.send(&ToHost::Chunk { id, stream, text: text.to_owned() });
                };
                provider.execute(&params, &mut OutputSink::new(&mut chunk)).map(Reply::Execute)
            }
            Call::InspectLease(params) => provider.inspect_lease(&params).map(Reply::Status),
            Call::AcquireLeaseRecording(params) => provider
                .acquire_lease_recording(&params, &mut CreationRecorder::new(&mut record))
                .map(Reply::Lease),
            Call::ProbeRecording(params) => {
                provider.probe_recording(&params, &mut CreationRecorder::new(&mut record)).map(Reply::Probe)
            }
            Call::ReleaseLeaseReporting(params) => {
                provider.release_lease_reporting(&params).map(Reply::Release)
            }
        }
    }
}
