//! The worker protocol: the messages each way and their framing.
//!
//! Frames are a little-endian `u32` length followed by that many bytes of
//! postcard (serde's compact binary form: varint integers, no field names),
//! over Unix stream sockets.
//!
//! A worker has one *control* socket (its file descriptor 3) and any number
//! of *call* sockets; each direction of each carries one type of message:
//! 1. control, worker → host, first: the [`Hello`], the library loaded (its
//!    manifest, whose hook list is the library's table), or why not;
//! 2. control, host → worker, once: the [`Environment`], the variables the
//!    provider's schema names (`x-env`); a worker started after the host's
//!    `setup` gets it (with the log level the host wants) as its first
//!    call;
//! 3. then the host passes the worker one end of each new call socket over
//!    the control socket (`SCM_RIGHTS`, one byte each), and the worker serves
//!    each call socket on threads of its own: one call at a time, a
//!    [`ToWorker::Call`] (a hook's name and the postcard of its parameters)
//!    answered by [`ToHost::Reply`] (the postcard of its value).
//!    While the hook runs, the worker sends [`ToHost::Bytes`] (execute's
//!    output, as it arrives), [`ToHost::StdinWanted`] (execute pulls its
//!    standard input; the host answers [`ToWorker::Answer`]) and the
//!    recorder's two moments, [`ToHost::Sending`] and [`ToHost::Created`]
//!    (a creating hook waits for the host's [`ToWorker::Answer`] after
//!    each), and the host may send [`ToWorker::Cancel`] (it dropped the
//!    call's future: the worker drops the hook's future, which cancels it,
//!    and replies). A calling host thread writes its call and reads its
//!    reply itself.
//! 4. The provider's log events come back on the control socket after the
//!    hello, each a [`LogEvent`].
//!
//! The host closing the control socket ends the worker.

use super::lock;
use provider_abi::{Lease, LogLevel, Manifest, OutputStream, ProviderError};
use serde::{de::DeserializeOwned, Deserialize, Serialize};
use std::{
    borrow::Cow,
    io::{self, Read, Write},
    os::unix::net::UnixStream,
    sync::Mutex,
};

/// The largest frame either side accepts.
pub const MAX_FRAME: usize = 256 << 20;

/// The most standard input the worker asks for in one [`ToHost::StdinWanted`].
pub const MAX_STDIN_CHUNK: u32 = 1 << 20;

/// Control socket, worker → host, first: the library loaded (its manifest,
/// whose `hooks` list is the library's table), or the one-line reason it
/// did not.
pub type Hello = Result<Manifest, String>;

/// Control socket, host → worker, after a hello: the environment variables
/// the provider needs, `(name, value)` pairs, only those the provider's
/// schema names.
pub type Environment = Vec<(String, String)>;

/// Call socket, host → worker.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub enum ToWorker<'a> {
    /// Runs the hook of this name with these parameters (the
    /// postcard of the hook's arguments but its recorder, input and output;
    /// `setup`'s with its log level). Borrowed when the host sends it.
    ///
    /// `manifest` never crosses (the hello carries it), nor does
    /// `grant_request_share` (every worker paces its own requests, so a
    /// share granted to one would not bound the others), nor do
    /// `export_memory` and `import_memory` (what a worker learns stays in
    /// that worker).
    Call(Cow<'a, str>, Cow<'a, [u8]>),
    /// The host's answer to the running call's request: to
    /// [`ToHost::Sending`] or [`ToHost::Created`], empty once the moment is
    /// durable; to [`ToHost::StdinWanted`], the next bytes of execute's
    /// standard input (empty at its end).
    Answer(Result<Vec<u8>, ProviderError>),
    /// The host dropped the call's future; the worker drops the
    /// hook's (which cancels it) and replies. Ignored once the hook ended.
    Cancel,
}

/// Control socket, worker → host, after the hello: one log event of the
/// provider.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct LogEvent {
    /// Its level.
    pub level: LogLevel,
    /// Its target.
    pub target: String,
    /// Its message.
    pub message: String,
    /// Its other fields, `(name, value as text)`.
    pub fields: Vec<(String, String)>,
}

/// Call socket, worker → host.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub enum ToHost {
    /// An output chunk of a running `execute`.
    Bytes {
        /// Which stream.
        stream: OutputStream,
        /// The chunk, byte for byte (postcard writes a `u8` as one byte).
        bytes: Vec<u8>,
    },
    /// `execute` wants at most this many more bytes of its
    /// standard input; the host answers [`ToWorker::Answer`].
    StdinWanted(u32),
    /// A creating hook's request is about to leave; the hook
    /// waits for [`ToWorker::Answer`].
    Sending,
    /// A lease a creating hook just made; the hook waits for
    /// [`ToWorker::Answer`].
    Created(Lease),
    /// The hook returned: the postcard of its value, or its error.
    Reply(Result<Vec<u8>, ProviderError>),
}

/// The postcard of a hook's parameters or value.
pub fn to_bytes<T: Serialize>(value: &T) -> Result<Vec<u8>, ProviderError> {
    postcard::to_stdvec(value)
        .map_err(|error| ProviderError::internal(format!("cannot encode a hook call: {error}")))
}

/// A hook's parameters or value out of its postcard.
pub fn from_bytes<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ProviderError> {
    postcard::from_bytes(bytes)
        .map_err(|error| ProviderError::internal(format!("cannot decode a hook call: {error}")))
}

/// `message` as one frame, its length prefix included.
fn encode<T: Serialize>(message: &T) -> io::Result<Vec<u8>> {
    let mut frame = postcard::to_extend(message, vec![0; 4]).map_err(invalid)?;
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

/// A socket's writing side, shared by the threads that write on it: each
/// frame is encoded first, then written whole under the lock.
pub struct Writer(Mutex<UnixStream>);

impl Writer {
    /// Writes on `socket`.
    pub fn new(socket: UnixStream) -> Writer {
        Writer(Mutex::new(socket))
    }

    /// Writes `message` as one frame.
    pub fn send<T: Serialize>(&self, message: &T) -> io::Result<()> {
        let frame = encode(message)?;
        lock(&self.0).write_all(&frame)
    }
}

/// Reads one frame into `buffer` and decodes it; `Ok(None)` at a clean end
/// of stream (between frames).
pub fn read<T: DeserializeOwned>(input: &mut impl Read, buffer: &mut Vec<u8>) -> io::Result<Option<T>> {
    let mut prefix = [0; 4];
    if let Err(error) = input.read_exact(&mut prefix) {
        return if error.kind() == io::ErrorKind::UnexpectedEof { Ok(None) } else { Err(error) };
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
    use provider_abi::{LeaseParams, SyncParams};

    #[test]
    fn frames_round_trip_borrowed_calls_into_owned_ones() {
        let params = LeaseParams { run_id: "run".into(), metadata_json: "{}".into(), ..Default::default() };
        let encoded = to_bytes(&params).unwrap();
        let mut bytes = Vec::new();
        write(&mut bytes, &ToWorker::Call("release_lease".into(), Cow::Borrowed(&encoded))).unwrap();
        write(&mut bytes, &ToWorker::Call("health".into(), Cow::Borrowed(&[]))).unwrap();
        let mut input = bytes.as_slice();
        let mut buffer = Vec::new();
        match read::<ToWorker<'static>>(&mut input, &mut buffer).unwrap() {
            Some(ToWorker::Call(hook, received)) if hook == "release_lease" => {
                assert_eq!(from_bytes::<LeaseParams>(&received).unwrap(), params)
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(matches!(
            read::<ToWorker<'static>>(&mut input, &mut buffer).unwrap(),
            Some(ToWorker::Call(hook, params)) if hook == "health" && params.is_empty()
        ));
        assert!(read::<ToWorker<'static>>(&mut input, &mut buffer).unwrap().is_none(), "clean end");
    }

    #[test]
    fn bytes_travel_as_one_byte_string_and_sync_parameters_round_trip() {
        let bytes = (0..=255u8).collect::<Vec<_>>();
        let frame = encode(&ToHost::Bytes { stream: OutputStream::Stderr, bytes: bytes.clone() }).unwrap();
        assert!(frame.len() < bytes.len() + 16, "a byte each, not a varint: {}", frame.len());
        match read::<ToHost>(&mut &frame[..], &mut Vec::new()).unwrap() {
            Some(ToHost::Bytes { stream: OutputStream::Stderr, bytes: received }) => {
                assert_eq!(received, bytes)
            }
            other => panic!("unexpected {other:?}"),
        }
        let params = SyncParams::single(
            LeaseParams::default(),
            provider_abi::SyncDirection::Out,
            "op",
            "file",
            "/a",
            "/b",
        );
        let encoded = to_bytes(&params).unwrap();
        let frame = encode(&ToWorker::Call("sync_files".into(), Cow::Borrowed(&encoded))).unwrap();
        assert!(frame.len() < encoded.len() + 32, "the parameters travel byte for byte: {}", frame.len());
        match read::<ToWorker<'static>>(&mut &frame[..], &mut Vec::new()).unwrap() {
            Some(ToWorker::Call(_, received)) => {
                assert_eq!(from_bytes::<SyncParams>(&received).unwrap(), params)
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn a_truncated_or_oversized_frame_is_an_error() {
        let frame = encode(&ToHost::Reply(Ok(vec![1, 2, 3]))).unwrap();
        let mut cut = &frame[..frame.len() - 1];
        assert!(read::<ToHost>(&mut cut, &mut Vec::new()).is_err());
        let huge = ((MAX_FRAME + 1) as u32).to_le_bytes();
        assert!(read::<ToHost>(&mut huge.as_slice(), &mut Vec::new()).is_err());
    }

    #[test]
    fn errors_cross_with_their_kind_status_and_operation() {
        let error = ProviderError::api(409, "sandbox lifecycle", "conflict");
        let frame = encode(&ToHost::Reply(Err(error.clone()))).unwrap();
        match read::<ToHost>(&mut &frame[..], &mut Vec::new()).unwrap() {
            Some(ToHost::Reply(Err(received))) => assert_eq!(received, error),
            other => panic!("unexpected {other:?}"),
        }
    }
}
