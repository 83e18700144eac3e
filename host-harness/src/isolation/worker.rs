//! The worker's side: load the library, say hello, serve hooks until the
//! host closes the control socket.
//!
//! The main thread receives call sockets on the control socket and serves
//! each on a thread of its own (see [`super::protocol`]): it reads a call,
//! runs the hook on that thread, writes output chunks and created leases as
//! they come (a creating hook then reads the host's answer on the same
//! socket, so a write-ahead record still commits before the provider goes
//! on) and the reply. The provider's log events go back on the control
//! socket.

use super::{
    fd_pass,
    protocol::{self, Call, Hello, LogEvent, Reply, ToHost, ToWorker},
    spawn::WORKER_FD,
};
use provider_abi::{
    ByteSink, CreationRecorder, Hook, HookResult, Lease, LoadedProvider, LogLevel, LogRecord, LogSink,
    OutputSink, OutputStream, Provider, ProviderError, SetupParams,
};
use provider_host::staging::load_expecting;
use std::{
    io::{self, BufReader, Write},
    os::{fd::FromRawFd, unix::net::UnixStream},
    path::Path,
    process::ExitCode,
    sync::{Arc, Mutex},
};

/// Stack size of the threads serving call sockets: hooks block on the
/// provider's own runtime, so they need little; a thousand calls in flight
/// stay cheap.
const CALL_THREAD_STACK: usize = 1 << 20;

/// Runs the worker: serves the provider library at `library` on the control
/// socket at file descriptor 3 (see [`super::spawn`]), loading it only if
/// its SHA-256 is `sha256` when given. Returns when the host closes the
/// socket; 2 when the library cannot be loaded or the socket is missing.
pub fn serve_worker(library: &Path, sha256: Option<&str>) -> ExitCode {
    // SAFETY: fstat on a descriptor number only reads its status.
    let mut status = unsafe { std::mem::zeroed::<libc::stat>() };
    if unsafe { libc::fstat(WORKER_FD, &mut status) } != 0 || status.st_mode & libc::S_IFMT != libc::S_IFSOCK
    {
        eprintln!("host-harness __worker: no socket on file descriptor {WORKER_FD}; the worker is started by the host (--isolate)");
        return ExitCode::from(2);
    }
    // SAFETY: descriptor 3 is a socket (checked) that the spawner handed to
    // this process alone; nothing else in the process owns it.
    let control = unsafe { UnixStream::from_raw_fd(WORKER_FD) };
    match Worker::start(library, sha256, control) {
        Ok(Some((worker, control))) => {
            worker.serve(control);
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

struct Worker {
    provider: LoadedProvider,
    /// The control socket's writing side: log events.
    control: Arc<Mutex<UnixStream>>,
}

impl Worker {
    /// Loads the library, says hello and runs the handshake; `None` when
    /// the library did not load (the hello told the host why).
    fn start(
        library: &Path,
        sha256: Option<&str>,
        control: UnixStream,
    ) -> io::Result<Option<(Arc<Worker>, UnixStream)>> {
        let mut writer = control.try_clone()?;
        let loaded = match sha256 {
            Some(sha256) => load_expecting(library, sha256),
            None => LoadedProvider::load(library),
        };
        let provider = match loaded {
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
        let Some(ToWorker::Start { env, setup, logs }) =
            protocol::read::<ToWorker<'static>>(&mut &control, &mut buffer)?
        else {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "the host did not start the worker"));
        };
        for (name, value) in env {
            // Before any hook runs; Rust's own readers of the environment
            // (the provider's `std::env::var`) take the same lock.
            std::env::set_var(name, value);
        }
        let worker = Arc::new(Worker { provider, control: Arc::new(Mutex::new(writer)) });
        let ready = match (setup, logs) {
            (Some(params), Some(level)) => worker.setup_with_logs(&params, level),
            (Some(params), None) => worker.provider.setup(&params),
            (None, _) => Ok(()),
        };
        protocol::write(&mut *lock(&worker.control), &ToHost::Ready(ready))?;
        Ok(Some((worker, control)))
    }

    /// Serves every call socket the host hands over until it closes the
    /// control socket (or it breaks).
    fn serve(self: Arc<Self>, control: UnixStream) {
        while let Ok(Some(socket)) = fd_pass::receive_socket(&control) {
            let worker = Arc::clone(&self);
            let started = std::thread::Builder::new()
                .name("call".into())
                .stack_size(CALL_THREAD_STACK)
                .spawn(move || worker.serve_calls(socket));
            // Without a thread the socket is dropped: the host's call sees
            // its end and reports the worker's death once it is killed.
            if started.is_err() {
                break;
            }
        }
        // The host is gone or closed the connection: nothing more to do.
        // Hooks still running would answer no one.
        std::process::exit(0);
    }

    /// Serves one call socket: one call at a time until the host closes it.
    fn serve_calls(&self, socket: UnixStream) {
        let Ok(reader) = socket.try_clone() else { return };
        let mut connection = Connection {
            reader: BufReader::new(reader),
            writer: socket,
            buffer: Vec::new(),
            frame: Vec::new(),
        };
        while let Ok(Some(ToWorker::Call(call))) =
            protocol::read::<ToWorker<'static>>(&mut connection.reader, &mut connection.buffer)
        {
            let result = self.run(call, &mut connection);
            if connection.send(&ToHost::Reply(result)).is_err() {
                return;
            }
        }
    }

    /// `setup_with_logs`, the provider's events going back on the control socket.
    fn setup_with_logs(&self, params: &SetupParams, level: LogLevel) -> HookResult<()> {
        let control = Arc::clone(&self.control);
        let sink = LogSink::new(move |record: &LogRecord<'_>| {
            let event = LogEvent {
                level: record.level,
                target: record.target.to_string(),
                message: record.message.to_string(),
                fields: record.fields.iter().map(|f| (f.name.to_string(), f.value.to_string())).collect(),
            };
            // A host that went away ends the worker through the control socket.
            if let Ok(frame) = protocol::encode(&ToHost::Log(event)) {
                let _ = lock(&control).write_all(&frame);
            }
        });
        self.provider.setup_with_logs(params, sink, level)
    }

    /// Runs one hook, its output and created leases going to `connection`.
    fn run(&self, call: Call<'static>, connection: &mut Connection) -> HookResult<Reply> {
        let provider = &self.provider;
        match call {
            Call::Setup(params) => provider.setup(&params).map(|()| Reply::Unit),
            Call::SetupWithLogs(params, level) => self.setup_with_logs(&params, level).map(|()| Reply::Unit),
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
                    // A host that went away ends the worker through the control socket.
                    let _ = connection.send(&ToHost::Chunk { stream, text: text.to_owned() });
                };
                provider.execute(&params, &mut OutputSink::new(&mut chunk)).map(Reply::Execute)
            }
            Call::ExecuteBytes(params) => {
                let mut chunk = |stream: OutputStream, bytes: &[u8]| {
                    let _ = connection.send(&ToHost::Bytes { stream, bytes: bytes.to_vec() });
                };
                provider.execute_bytes(&params, &mut ByteSink::new(&mut chunk)).map(Reply::Execute)
            }
            Call::InspectLease(params) => provider.inspect_lease(&params).map(Reply::Status),
            Call::AcquireLeaseRecording(params) => {
                let mut record = |lease: &Lease| connection.record(lease);
                provider
                    .acquire_lease_recording(&params, &mut CreationRecorder::new(&mut record))
                    .map(Reply::Lease)
            }
            Call::ProbeRecording(params) => {
                let mut record = |lease: &Lease| connection.record(lease);
                provider.probe_recording(&params, &mut CreationRecorder::new(&mut record)).map(Reply::Probe)
            }
            Call::ReleaseLeaseReporting(params) => {
                provider.release_lease_reporting(&params).map(Reply::Release)
            }
            Call::SyncIn(params) => provider.sync_in(&params).map(Reply::Sync),
            Call::SyncOut(params) => provider.sync_out(&params).map(Reply::Sync),
            Call::ImportUnconfirmed(params) => provider.import_unconfirmed(&params).map(|()| Reply::Unit),
        }
    }
}

/// One call socket, with the buffers its frames reuse.
struct Connection {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    buffer: Vec<u8>,
    frame: Vec<u8>,
}

impl Connection {
    fn send(&mut self, message: &ToHost) -> io::Result<()> {
        protocol::encode_into(message, &mut self.frame)?;
        self.writer.write_all(&self.frame)
    }

    /// Hands `lease` to the host and waits for its answer.
    fn record(&mut self, lease: &Lease) -> HookResult<()> {
        let lost =
            || ProviderError::internal("The host closed the worker's connection while recording a lease.");
        self.send(&ToHost::Record(lease.clone())).map_err(|_| lost())?;
        match protocol::read::<ToWorker<'static>>(&mut self.reader, &mut self.buffer) {
            Ok(Some(ToWorker::Recorded(result))) => result,
            _ => Err(lost()),
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
