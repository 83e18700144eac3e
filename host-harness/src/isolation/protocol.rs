//! The worker protocol: the messages each way and their framing.
//!
//! Frames are a little-endian `u32` length followed by that many bytes of
//! postcard (serde's compact binary form: varint integers, no field names),
//! over one Unix stream socket. Calls carry an id, so many hooks run at once
//! on one connection; everything the worker sends about a call (output
//! chunks, created leases to record, the reply) names it.
//!
//! The exchange:
//! 1. worker → host [`ToHost::Hello`]: the library loaded (its manifest and
//!    the hooks this build can call on it), or why not;
//! 2. host → worker [`ToWorker::Start`]: the environment variables the
//!    provider's schema names (`x-env`) and the host's `setup` parameters;
//!    worker → host [`ToHost::Ready`] with `setup`'s outcome;
//! 3. then any number of [`ToWorker::Call`]s, each answered by
//!    [`ToHost::Reply`], after [`ToHost::Chunk`]s (execute's output, as it
//!    arrives) and [`ToHost::Record`]s (a created lease; the hook waits for
//!    the host's [`ToWorker::Recorded`]).
//!
//! The host closing its end ends the worker.

use provider_abi::{
    AcquireParams, EnvironmentParams, ExecuteParams, ExecuteResult, HealthReport, Hook, Lease, LeaseParams,
    LeaseStatus, Manifest, OutputStream, ProbeReport, ProviderError, ReleaseReport, SetupParams,
    ValidationReport, Workspace,
};
use serde::{de::DeserializeOwned, Deserialize, Serialize};
use std::{
    borrow::Cow,
    io::{self, Read, Write},
};

/// The largest frame either side accepts (execute's stdin travels in one).
pub const MAX_FRAME: usize = 256 << 20;

/// A hook call and its parameters. Borrowed when the host sends it, owned
/// when the worker receives it.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub enum Call<'a> {
    /// `setup` (also replayed on every worker started later, in [`ToWorker::Start`]).
    Setup(Cow<'a, SetupParams>),
    /// `shutdown`.
    Shutdown,
    /// `health`.
    Health,
    /// `validate_config`.
    ValidateConfig(Cow<'a, EnvironmentParams>),
    /// `probe`.
    Probe(Cow<'a, EnvironmentParams>),
    /// `acquire_lease`.
    AcquireLease(Cow<'a, AcquireParams>),
    /// `resume_lease`.
    ResumeLease(Cow<'a, LeaseParams>),
    /// `release_lease`.
    ReleaseLease(Cow<'a, LeaseParams>),
    /// `destroy_lease`.
    DestroyLease(Cow<'a, LeaseParams>),
    /// `realize_workspace`.
    RealizeWorkspace(Cow<'a, LeaseParams>),
    /// `execute`; its output comes back as [`ToHost::Chunk`]s.
    Execute(Cow<'a, ExecuteParams>),
    /// `inspect_lease`.
    InspectLease(Cow<'a, LeaseParams>),
    /// `acquire_lease_recording`; created leases come back as [`ToHost::Record`]s.
    AcquireLeaseRecording(Cow<'a, AcquireParams>),
    /// `probe_recording`; as `acquire_lease_recording`.
    ProbeRecording(Cow<'a, EnvironmentParams>),
    /// `release_lease_reporting`.
    ReleaseLeaseReporting(Cow<'a, LeaseParams>),
}

impl Call<'_> {
    /// The hook called.
    pub fn hook(&self) -> Hook {
        match self {
            Call::Setup(_) => Hook::Setup,
            Call::Shutdown => Hook::Shutdown,
            Call::Health => Hook::Health,
            Call::ValidateConfig(_) => Hook::ValidateConfig,
            Call::Probe(_) => Hook::Probe,
            Call::AcquireLease(_) => Hook::AcquireLease,
            Call::ResumeLease(_) => Hook::ResumeLease,
            Call::ReleaseLease(_) => Hook::ReleaseLease,
            Call::DestroyLease(_) => Hook::DestroyLease,
            Call::RealizeWorkspace(_) => Hook::RealizeWorkspace,
            Call::Execute(_) => Hook::Execute,
            Call::InspectLease(_) => Hook::InspectLease,
            Call::AcquireLeaseRecording(_) => Hook::AcquireLeaseRecording,
            Call::ProbeRecording(_) => Hook::ProbeRecording,
            Call::ReleaseLeaseReporting(_) => Hook::ReleaseLeaseReporting,
        }
    }
}

/// What a hook returned, when it succeeded.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub enum Reply {
    /// `()`: setup, shutdown, release, destroy.
    Unit,
    /// `health`.
    Health(HealthReport),
    /// `validate_config`.
    Validation(ValidationReport),
    /// `probe`, `probe_recording`.
    Probe(ProbeReport),
    /// `acquire_lease`, `resume_lease`, `acquire_lease_recording`.
    Lease(Lease),
    /// `realize_workspace`.
    Workspace(Workspace),
    /// `execute`.
    Execute(ExecuteResult),
    /// `inspect_lease`.
    Status(LeaseStatus),
    /// `release_lease_reporting`.
    Release(ReleaseReport),
}

/// What a worker that loaded its library says first.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct Hello {
    /// The library's manifest (as the host-side loader reports it).
    pub manifest: Manifest,
    /// The hooks this worker's build can call on the library.
    pub supported: Vec<String>,
}

/// Host → worker.
// A message lives for one frame; boxing the call would cost an allocation each.
#[allow(clippy::large_enum_variant)]
#[derive(Serialize, Deserialize, Debug, Clone)]
pub enum ToWorker<'a> {
    /// Sets the environment variables the provider needs, then runs `setup`.
    Start {
        /// `(name, value)` pairs, only those the provider's schema names.
        env: Vec<(String, String)>,
        /// The host's `setup` parameters, if it called `setup`.
        setup: Option<SetupParams>,
    },
    /// Runs a hook.
    Call {
        /// The call's id, unique on the connection.
        id: u64,
        /// The hook and its parameters.
        call: Call<'a>,
    },
    /// The host's answer to a [`ToHost::Record`]: `Ok` once committed.
    Recorded {
        /// The call that created the lease.
        id: u64,
        /// The host's answer.
        result: Result<(), ProviderError>,
    },
}

/// Worker → host.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub enum ToHost {
    /// The library loaded, or the one-line reason it did not.
    Hello(Result<Hello, String>),
    /// `setup`'s outcome, after [`ToWorker::Start`].
    Ready(Result<(), ProviderError>),
    /// An output chunk of a running `execute`.
    Chunk {
        /// The call.
        id: u64,
        /// Which stream.
        stream: OutputStream,
        /// The chunk.
        text: String,
    },
    /// A lease a recording hook just created; the hook waits for
    /// [`ToWorker::Recorded`].
    Record {
        /// The call.
        id: u64,
        /// The lease, as a host would pass it to `destroy_lease`.
        lease: Lease,
    },
    /// The hook returned.
    Reply {
        /// The call.
        id: u64,
        /// Its result.
        result: Result<Reply, ProviderError>,
    },
}

/// Encodes `message` as one frame (length prefix included).
pub fn encode<T: Serialize>(message: &T) -> io::Result<Vec<u8>> {
    let mut frame = Vec::with_capacity(64);
    frame.extend_from_slice(&[0; 4]);
    let mut frame = postcard::to_extend(message, frame).map_err(invalid)?;
    let length = u32::try_from(frame.len() - 4)
        .ok()
        .filter(|&length| length as usize <= MAX_FRAME)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "frame too large"))?;
    frame[..4].copy_from_slice(&length.to_le_bytes());
    Ok(frame)
}

/// Writes `message` as one frame, in one `write_all`.
pub fn write<T: Serialize>(output: &mut impl Write, message: &T) -> io::Result<()> {
    output.write_all(&encode(message)?)
}

/// Reads one frame into `buffer` and decodes it; `Ok(None)` at a clean end
/// of stream (between frames).
pub fn read<T: DeserializeOwned>(input: &mut impl Read, buffer: &mut Vec<u8>) -> io::Result<Option<T>> {
    let mut prefix = [0; 4];
    match input.read_exact(&mut prefix) {
        Ok(()) => {}
        Err(error) if error.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(error) => return Err(error),
    }
    let length = u32::from_le_bytes(prefix) as usize;
    if length > MAX_FRAME {
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("frame of {length} bytes")));
    }
    buffer.resize(length, 0);
    input.read_exact(buffer)?;
    postcard::from_bytes(buffer).map(Some).map_err(invalid)
}

fn invalid(error: postcard::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, error)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_borrowed_calls_into_owned_ones() {
        let params = LeaseParams { run_id: "run".into(), metadata_json: "{}".into(), ..Default::default() };
        let mut bytes = Vec::new();
        write(&mut bytes, &ToWorker::Call { id: 7, call: Call::ReleaseLease(Cow::Borrowed(&params)) })
            .unwrap();
        write(&mut bytes, &ToWorker::Call { id: 8, call: Call::Health }).unwrap();
        let mut input = bytes.as_slice();
        let mut buffer = Vec::new();
        match read::<ToWorker<'static>>(&mut input, &mut buffer).unwrap() {
            Some(ToWorker::Call { id: 7, call: Call::ReleaseLease(received) }) => {
                assert_eq!(received.into_owned(), params)
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(matches!(
            read::<ToWorker<'static>>(&mut input, &mut buffer).unwrap(),
            Some(ToWorker::Call { id: 8, call: Call::Health })
        ));
        assert!(read::<ToWorker<'static>>(&mut input, &mut buffer).unwrap().is_none(), "clean end");
    }

    #[test]
    fn a_truncated_or_oversized_frame_is_an_error() {
        let frame = encode(&ToHost::Ready(Ok(()))).unwrap();
        let mut cut = &frame[..frame.len() - 1];
        assert!(read::<ToHost>(&mut cut, &mut Vec::new()).is_err());
        let huge = ((MAX_FRAME + 1) as u32).to_le_bytes();
        assert!(read::<ToHost>(&mut huge.as_slice(), &mut Vec::new()).is_err());
    }

    #[test]
    fn errors_cross_with_their_kind_status_and_operation() {
        let error = ProviderError::api(409, "sandbox lifecycle", "conflict");
        let frame = encode(&ToHost::Reply { id: 1, result: Err(error.clone()) }).unwrap();
        match read::<ToHost>(&mut &frame[..], &mut Vec::new()).unwrap() {
            Some(ToHost::Reply { id: 1, result: Err(received) }) => assert_eq!(received, error),
            other => panic!("unexpected {other:?}"),
        }
    }
}
