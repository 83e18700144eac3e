//! Incremental decoder of a managed process's NDJSON output stream
//! (`GET .../processes/{pid}/connect?after=SEQ`).
//!
//! Feed it the body's chunks as they arrive ([`OutputDecoder::feed`]); it
//! splits lines, parses frames, checks sequence numbers, decodes UTF-8 per
//! stream across frames, hands every decoded piece of text to a callback
//! exactly once, and keeps the tail of each stream.
//!
//! # Rules
//!
//! - One JSON object a line, `\n`-terminated. A line longer than
//!   [`MAX_LINE_BYTES`] (1 MiB, the `\n` excluded) is a protocol error, found
//!   as soon as the buffered partial line exceeds it. Blank lines are
//!   skipped.
//! - Frames: `{"type":"heartbeat"}`;
//!   `{"type":"data","seq":N,"stream":"stdout"|"stderr","data_base64":"..."}`;
//!   `{"type":"exit","exit_code":N}` or `{"type":"exit","signal":"NAME"}`;
//!   `{"type":"error","error":"..."}`. Extra fields are ignored.
//! - A data frame's `seq` must be exactly `cursor + 1`, and then becomes the
//!   cursor. `seq <= cursor` is a replay and is skipped; a larger one is a
//!   gap. A reconnect resumes with `after = cursor` ([`OutputDecoder::cursor`]).
//! - The exit frame ends the output: it flushes the UTF-8 decoders (an
//!   incomplete character becomes U+FFFD) and everything after it is
//!   ignored. `exit_code` wins when both statuses are present; an exit with
//!   neither (or with `null`s) is a protocol error. `exit_code` must fit an
//!   `i32`; `signal` is a non-empty name (an integer is accepted as its
//!   number).
//! - An error frame fails the stream: `output_offset_expired` is
//!   [`Error::OutputEvicted`], anything else [`Error::OutputStreamError`].
//! - Malformed JSON, a non-object, an unknown `type`, a data frame with a
//!   missing or ill-typed field, an unknown stream or invalid base64, a gap:
//!   [`Error::protocol`]`(output connection)`. After an error the decoder
//!   must not be fed again (the command is over).
//! - Base64 is the standard alphabet; padding is optional.
//! - UTF-8 is decoded per stream as `String::from_utf8_lossy` would decode
//!   the stream's whole byte sequence: complete characters are emitted as
//!   soon as they are complete, a character split across frames is joined,
//!   and each maximal invalid subsequence becomes one U+FFFD.
//! - Each stream keeps at most its last `tail_limit` characters
//!   ([`MAX_TAIL_CHARS`] = 4 Mi by default) and remembers whether it dropped
//!   any. Trimming is amortised: the buffer may briefly hold a quarter more.
//! - A byte emitter ([`ByteEmit`]) gets each frame's bytes and nothing is
//!   decoded as they arrive: the stream keeps its last `tail_limit` bytes
//!   instead, decoded once by [`OutputDecoder::finish`] (a character the cut
//!   split is dropped whole), so binary output costs a copy, not a decoding
//!   per byte. Its tail then holds at most `tail_limit` characters, fewer
//!   when they are multibyte.

use std::mem;

use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use base64::Engine as _;
use provider_abi::OutputStream;
use serde_json::Value;

use crate::error::{op, Error};

/// Longest accepted line, without its `\n`.
pub const MAX_LINE_BYTES: usize = 1 << 20;
/// Characters of tail kept per stream.
pub const MAX_TAIL_CHARS: usize = 4 << 20;
/// The error frame text meaning "the output after the cursor was evicted".
pub const OFFSET_EXPIRED: &str = "output_offset_expired";

const BASE64: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// How a process ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExitStatus {
    /// It exited with a code.
    Code(i32),
    /// A signal killed it (e.g. `SIGKILL`).
    Signal(String),
}

/// One parsed line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// Keep-alive.
    Heartbeat,
    /// A piece of output.
    Data {
        /// Sequence number (from 1).
        seq: u64,
        /// Which stream.
        stream: OutputStream,
        /// The raw bytes.
        data: Vec<u8>,
    },
    /// The process ended.
    Exit(ExitStatus),
    /// The server reports an error.
    Error {
        /// True for `output_offset_expired`.
        evicted: bool,
    },
}

fn protocol() -> Error {
    Error::protocol(op::OUTPUT_CONNECTION)
}

/// Parses one line (without its `\n`).
pub fn parse_frame(line: &[u8]) -> Result<Frame, Error> {
    let value: Value = serde_json::from_slice(line).map_err(|_| protocol())?;
    let object = value.as_object().ok_or_else(protocol)?;
    let field = |name: &str| object.get(name).filter(|v| !v.is_null());
    match object.get("type").and_then(Value::as_str) {
        Some("heartbeat") => Ok(Frame::Heartbeat),
        Some("data") => {
            let seq = field("seq").and_then(Value::as_u64).ok_or_else(protocol)?;
            let stream = match field("stream").and_then(Value::as_str) {
                Some("stdout") => OutputStream::Stdout,
                Some("stderr") => OutputStream::Stderr,
                _ => return Err(protocol()),
            };
            let encoded = field("data_base64").and_then(Value::as_str).ok_or_else(protocol)?;
            let data = BASE64.decode(encoded).map_err(|_| protocol())?;
            Ok(Frame::Data { seq, stream, data })
        }
        Some("exit") => {
            if let Some(code) = field("exit_code") {
                let code = code.as_i64().and_then(|c| i32::try_from(c).ok()).ok_or_else(protocol)?;
                return Ok(Frame::Exit(ExitStatus::Code(code)));
            }
            match field("signal") {
                Some(Value::String(name)) if !name.is_empty() => {
                    Ok(Frame::Exit(ExitStatus::Signal(name.clone())))
                }
                Some(Value::Number(n)) if n.as_u64().is_some() => {
                    Ok(Frame::Exit(ExitStatus::Signal(n.to_string())))
                }
                _ => Err(protocol()),
            }
        }
        Some("error") => {
            let evicted = field("error").and_then(Value::as_str) == Some(OFFSET_EXPIRED);
            Ok(Frame::Error { evicted })
        }
        _ => Err(protocol()),
    }
}

/// Incremental lossy UTF-8 decoding across chunk boundaries.
#[derive(Debug, Default)]
struct Utf8Decoder {
    /// The start of a character whose remaining bytes have not arrived
    /// (at most 3 bytes).
    pending: Vec<u8>,
}

impl Utf8Decoder {
    /// Decodes `bytes`, appending complete characters (and U+FFFD for
    /// invalid bytes) to `out`; keeps an incomplete trailing character.
    fn decode(&mut self, bytes: &[u8], out: &mut String) {
        let joined;
        let input: &[u8] = if self.pending.is_empty() {
            bytes
        } else {
            let mut buf = mem::take(&mut self.pending);
            buf.extend_from_slice(bytes);
            joined = buf;
            &joined
        };
        let mut chunks = input.utf8_chunks().peekable();
        while let Some(chunk) = chunks.next() {
            out.push_str(chunk.valid());
            let invalid = chunk.invalid();
            if invalid.is_empty() {
                continue;
            }
            let incomplete_at_end = chunks.peek().is_none()
                && std::str::from_utf8(invalid).err().is_some_and(|e| e.error_len().is_none());
            if incomplete_at_end {
                self.pending.extend_from_slice(invalid);
            } else {
                out.push(char::REPLACEMENT_CHARACTER);
            }
        }
    }

    /// Ends the stream: an incomplete character becomes U+FFFD.
    fn flush(&mut self, out: &mut String) {
        if !self.pending.is_empty() {
            self.pending.clear();
            out.push(char::REPLACEMENT_CHARACTER);
        }
    }
}

/// The last `limit` bytes of a stream, for a byte emitter's tail.
#[derive(Debug)]
struct ByteTail {
    bytes: Vec<u8>,
    limit: usize,
    truncated: bool,
}

impl ByteTail {
    fn new(limit: usize) -> Self {
        ByteTail { bytes: Vec::new(), limit, truncated: false }
    }

    fn push(&mut self, bytes: &[u8]) {
        if bytes.len() >= self.limit {
            self.truncated |= !self.bytes.is_empty() || bytes.len() > self.limit;
            self.bytes.clear();
            self.bytes.extend_from_slice(&bytes[bytes.len() - self.limit..]);
            return;
        }
        self.bytes.extend_from_slice(bytes);
        if self.bytes.len() > self.limit + self.limit / 4 {
            self.trim();
        }
    }

    fn trim(&mut self) {
        if self.bytes.len() > self.limit {
            self.bytes.drain(..self.bytes.len() - self.limit);
            self.truncated = true;
        }
    }

    /// The kept bytes as text (lossy), a character split by the cut dropped.
    fn finish(mut self) -> (String, bool) {
        self.trim();
        let start = match self.truncated {
            true => self.bytes.iter().take(3).take_while(|&&byte| byte & 0xC0 == 0x80).count(),
            false => 0,
        };
        (String::from_utf8_lossy(&self.bytes[start..]).into_owned(), self.truncated)
    }
}

/// The last `limit` characters of a stream.
#[derive(Debug)]
struct Tail {
    text: String,
    chars: usize,
    limit: usize,
    truncated: bool,
}

impl Tail {
    fn new(limit: usize) -> Self {
        Tail { text: String::new(), chars: 0, limit, truncated: false }
    }

    fn push(&mut self, s: &str) {
        self.text.push_str(s);
        self.chars += s.chars().count();
        if self.chars > self.limit + self.limit / 4 {
            self.trim();
        }
    }

    fn trim(&mut self) {
        if self.chars <= self.limit {
            return;
        }
        let excess = self.chars - self.limit;
        let cut = self.text.char_indices().nth(excess).map_or(self.text.len(), |(i, _)| i);
        self.text.drain(..cut);
        self.chars = self.limit;
        self.truncated = true;
    }

    fn finish(mut self) -> (String, bool) {
        self.trim();
        (self.text, self.truncated)
    }
}

#[derive(Debug)]
struct StreamState {
    utf8: Utf8Decoder,
    tail: Tail,
    bytes: ByteTail,
    scratch: String,
}

impl StreamState {
    fn new(limit: usize) -> Self {
        StreamState {
            utf8: Utf8Decoder::default(),
            tail: Tail::new(limit),
            bytes: ByteTail::new(limit),
            scratch: String::new(),
        }
    }

    /// Decodes, emits and keeps `bytes` (`None`: flush the end of stream).
    /// A byte emitter gets the raw bytes, which the byte tail keeps
    /// undecoded; a text emitter gets the text, which the tail keeps.
    fn take(&mut self, stream: OutputStream, bytes: Option<&[u8]>, emit: &mut impl Emit) {
        if !emit.wants_text() {
            if let Some(bytes) = bytes {
                emit.bytes(stream, bytes);
                self.bytes.push(bytes);
            }
            return;
        }
        self.scratch.clear();
        match bytes {
            Some(bytes) => {
                emit.bytes(stream, bytes);
                self.utf8.decode(bytes, &mut self.scratch)
            }
            None => self.utf8.flush(&mut self.scratch),
        }
        if !self.scratch.is_empty() {
            emit.text(stream, &self.scratch);
            self.tail.push(&self.scratch);
        }
    }
}

impl StreamState {
    /// The stream's tail: the text kept, or the bytes a byte emitter left,
    /// decoded now.
    fn finish(self) -> (String, bool) {
        match self.bytes.bytes.is_empty() && !self.bytes.truncated {
            true => self.tail.finish(),
            false => self.bytes.finish(),
        }
    }
}

/// Where decoded output goes: text (U+FFFD for invalid UTF-8) or raw bytes.
pub trait Emit {
    /// A piece of decoded text.
    fn text(&mut self, stream: OutputStream, text: &str);
    /// The bytes of a data frame, exactly as the command wrote them.
    fn bytes(&mut self, stream: OutputStream, bytes: &[u8]);
    /// False when [`Emit::text`] ignores what it gets: the stream's text is
    /// then decoded only once, for its tail, when the output ends.
    fn wants_text(&self) -> bool {
        true
    }
}

/// An [`Emit`] handing text to a closure.
pub struct TextEmit<F>(pub F);

impl<F: FnMut(OutputStream, &str)> Emit for TextEmit<F> {
    fn text(&mut self, stream: OutputStream, text: &str) {
        (self.0)(stream, text)
    }

    fn bytes(&mut self, _stream: OutputStream, _bytes: &[u8]) {}
}

/// An [`Emit`] handing raw bytes to a closure.
pub struct ByteEmit<F>(pub F);

impl<F: FnMut(OutputStream, &[u8])> Emit for ByteEmit<F> {
    fn text(&mut self, _stream: OutputStream, _text: &str) {}

    fn bytes(&mut self, stream: OutputStream, bytes: &[u8]) {
        if !bytes.is_empty() {
            (self.0)(stream, bytes)
        }
    }

    fn wants_text(&self) -> bool {
        false
    }
}

/// What a command printed, once the stream is over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodedOutput {
    /// The tail of standard output.
    pub stdout: String,
    /// The tail of standard error.
    pub stderr: String,
    /// True when standard output lost characters to the tail limit.
    pub stdout_truncated: bool,
    /// True when standard error lost characters to the tail limit.
    pub stderr_truncated: bool,
}

/// The incremental decoder; see the module documentation for the rules.
#[derive(Debug)]
pub struct OutputDecoder {
    /// A partial line carried to the next chunk.
    line: Vec<u8>,
    cursor: u64,
    stdout: StreamState,
    stderr: StreamState,
    exit: Option<ExitStatus>,
}

impl Default for OutputDecoder {
    fn default() -> Self {
        Self::new()
    }
}

impl OutputDecoder {
    /// A decoder keeping [`MAX_TAIL_CHARS`] per stream.
    pub fn new() -> Self {
        Self::with_tail_limit(MAX_TAIL_CHARS)
    }

    /// A decoder keeping `limit` characters per stream.
    pub fn with_tail_limit(limit: usize) -> Self {
        OutputDecoder {
            line: Vec::new(),
            cursor: 0,
            stdout: StreamState::new(limit),
            stderr: StreamState::new(limit),
            exit: None,
        }
    }

    /// The last accepted `seq`: reconnect with `after = cursor`.
    pub fn cursor(&self) -> u64 {
        self.cursor
    }

    /// The exit status, once the exit frame arrived.
    pub fn exit(&self) -> Option<&ExitStatus> {
        self.exit.as_ref()
    }

    /// A new connection starts: a partial line of the old one is dropped
    /// (its frame is replayed, since the cursor never passed it).
    pub fn reconnect(&mut self) {
        self.line.clear();
    }

    /// Feeds one body chunk. Every decoded piece of text goes to
    /// `emit(stream, text)` in order, exactly once. Returns the exit status
    /// once the exit frame has arrived (and from then on ignores input).
    pub fn feed(
        &mut self,
        chunk: &[u8],
        emit: &mut impl FnMut(OutputStream, &str),
    ) -> Result<Option<ExitStatus>, Error> {
        self.feed_to(chunk, &mut TextEmit(emit))
    }

    /// [`Self::feed`], handing each data frame to `emit` as text or as raw
    /// bytes (the tails keep the text either way).
    pub fn feed_to(&mut self, chunk: &[u8], emit: &mut impl Emit) -> Result<Option<ExitStatus>, Error> {
        let mut rest = chunk;
        while self.exit.is_none() {
            let Some(newline) = rest.iter().position(|b| *b == b'\n') else {
                if self.line.len() + rest.len() > MAX_LINE_BYTES {
                    return Err(protocol());
                }
                self.line.extend_from_slice(rest);
                break;
            };
            let (head, tail) = (&rest[..newline], &rest[newline + 1..]);
            rest = tail;
            if self.line.len() + head.len() > MAX_LINE_BYTES {
                return Err(protocol());
            }
            if self.line.is_empty() {
                self.line_done(head, emit)?;
            } else {
                let mut line = mem::take(&mut self.line);
                line.extend_from_slice(head);
                let done = self.line_done(&line, emit);
                line.clear();
                self.line = line;
                done?;
            }
        }
        Ok(self.exit.clone())
    }

    fn line_done(&mut self, line: &[u8], emit: &mut impl Emit) -> Result<(), Error> {
        if line.iter().all(u8::is_ascii_whitespace) {
            return Ok(());
        }
        match parse_frame(line)? {
            Frame::Heartbeat => Ok(()),
            Frame::Data { seq, .. } if seq <= self.cursor => Ok(()),
            Frame::Data { seq, stream, data } => {
                if seq != self.cursor + 1 {
                    return Err(protocol());
                }
                self.cursor = seq;
                self.state(stream).take(stream, Some(&data), emit);
                Ok(())
            }
            Frame::Exit(status) => {
                self.flush_to(emit);
                self.exit = Some(status);
                Ok(())
            }
            Frame::Error { evicted: true } => Err(Error::OutputEvicted),
            Frame::Error { evicted: false } => Err(Error::OutputStreamError),
        }
    }

    fn state(&mut self, stream: OutputStream) -> &mut StreamState {
        match stream {
            OutputStream::Stdout => &mut self.stdout,
            OutputStream::Stderr => &mut self.stderr,
        }
    }

    /// Ends both streams' UTF-8 decoding (an incomplete character becomes
    /// U+FFFD, emitted). Called by the exit frame; call it when the output
    /// ends otherwise (timeout) before [`Self::finish`].
    pub fn flush(&mut self, emit: &mut impl FnMut(OutputStream, &str)) {
        self.flush_to(&mut TextEmit(emit))
    }

    /// [`Self::flush`] to any [`Emit`] (a byte emitter gets nothing: the
    /// bytes went out as they arrived).
    pub fn flush_to(&mut self, emit: &mut impl Emit) {
        self.stdout.take(OutputStream::Stdout, None, emit);
        self.stderr.take(OutputStream::Stderr, None, emit);
    }

    /// The tails of both streams.
    pub fn finish(self) -> DecodedOutput {
        let (stdout, stdout_truncated) = self.stdout.finish();
        let (stderr, stderr_truncated) = self.stderr.finish();
        DecodedOutput { stdout, stderr, stdout_truncated, stderr_truncated }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;
    use proptest::prelude::*;
    use serde_json::json;

    fn data(seq: u64, stream: &str, bytes: &[u8]) -> String {
        json!({"type": "data", "seq": seq, "stream": stream, "data_base64": BASE64.encode(bytes)}).to_string()
            + "\n"
    }

    fn exit(code: i32) -> String {
        json!({"type": "exit", "exit_code": code}).to_string() + "\n"
    }

    type Seen = Vec<(OutputStream, String)>;

    fn collect(decoder: &mut OutputDecoder, chunks: &[&[u8]]) -> (Seen, Result<Option<ExitStatus>, Error>) {
        let mut seen = Vec::new();
        let mut result = Ok(None);
        for chunk in chunks {
            result = decoder.feed(chunk, &mut |s, t| seen.push((s, t.to_owned())));
            if result.is_err() {
                break;
            }
        }
        (seen, result)
    }

    fn joined(seen: &Seen, stream: OutputStream) -> String {
        seen.iter().filter(|(s, _)| *s == stream).map(|(_, t)| t.as_str()).collect()
    }

    #[test]
    fn frames_parse() {
        assert_eq!(parse_frame(br#"{"type":"heartbeat"}"#).unwrap(), Frame::Heartbeat);
        assert_eq!(
            parse_frame(br#"{"type":"data","seq":3,"stream":"stderr","data_base64":"aGk=","x":1}"#).unwrap(),
            Frame::Data { seq: 3, stream: OutputStream::Stderr, data: b"hi".to_vec() }
        );
        assert_eq!(
            parse_frame(br#"{"type":"data","seq":3,"stream":"stdout","data_base64":"aGk"}"#).unwrap(),
            Frame::Data { seq: 3, stream: OutputStream::Stdout, data: b"hi".to_vec() }
        );
        assert_eq!(
            parse_frame(br#"{"type":"exit","exit_code":-1}"#).unwrap(),
            Frame::Exit(ExitStatus::Code(-1))
        );
        assert_eq!(
            parse_frame(br#"{"type":"exit","exit_code":null,"signal":"SIGKILL"}"#).unwrap(),
            Frame::Exit(ExitStatus::Signal("SIGKILL".into()))
        );
        assert_eq!(
            parse_frame(br#"{"type":"exit","signal":9}"#).unwrap(),
            Frame::Exit(ExitStatus::Signal("9".into()))
        );
        assert_eq!(
            parse_frame(br#"{"type":"exit","exit_code":2,"signal":"SIGTERM"}"#).unwrap(),
            Frame::Exit(ExitStatus::Code(2))
        );
        assert_eq!(
            parse_frame(br#"{"type":"error","error":"output_offset_expired"}"#).unwrap(),
            Frame::Error { evicted: true }
        );
        assert_eq!(
            parse_frame(br#"{"type":"error","error":"boom"}"#).unwrap(),
            Frame::Error { evicted: false }
        );
        assert_eq!(parse_frame(br#"{"type":"error"}"#).unwrap(), Frame::Error { evicted: false });
        let bad: &[&[u8]] = &[
            b"",
            b"not json",
            b"[]",
            b"{}",
            b"\"heartbeat\"",
            br#"{"type":"hello"}"#,
            br#"{"type":3}"#,
            br#"{"type":"exit"}"#,
            br#"{"type":"exit","exit_code":null,"signal":null}"#,
            br#"{"type":"exit","signal":""}"#,
            br#"{"type":"exit","exit_code":1.5}"#,
            br#"{"type":"exit","exit_code":"1"}"#,
            br#"{"type":"exit","exit_code":4294967296}"#,
            br#"{"type":"exit","signal":-9}"#,
            br#"{"type":"exit","signal":1.5}"#,
            br#"{"type":"exit","signal":-0.5}"#,
            br#"{"type":"exit","signal":true}"#,
            br#"{"type":"exit","signal":["SIGKILL"]}"#,
            br#"{"type":"data","stream":"stdout","data_base64":""}"#,
            br#"{"type":"data","seq":-1,"stream":"stdout","data_base64":""}"#,
            br#"{"type":"data","seq":1,"stream":"stdin","data_base64":""}"#,
            br#"{"type":"data","seq":1,"stream":"stdout"}"#,
            br#"{"type":"data","seq":1,"stream":"stdout","data_base64":"***"}"#,
            b"{\"type\":\"heartbeat\"}{}",
        ];
        for line in bad {
            let err = parse_frame(line).unwrap_err();
            assert_eq!(err, Error::protocol(op::OUTPUT_CONNECTION), "{}", String::from_utf8_lossy(line));
        }
    }

    #[test]
    fn sequence_rules_replays_and_gaps() {
        let mut decoder = OutputDecoder::new();
        let stream = [
            data(1, "stdout", b"a"),
            data(2, "stderr", b"b"),
            data(1, "stdout", b"X"),
            data(2, "stdout", b"Y"),
            data(3, "stdout", b"c"),
        ]
        .concat();
        let (seen, result) = collect(&mut decoder, &[stream.as_bytes()]);
        assert_eq!(result.unwrap(), None);
        assert_eq!(joined(&seen, OutputStream::Stdout), "ac");
        assert_eq!(joined(&seen, OutputStream::Stderr), "b");
        assert_eq!(decoder.cursor(), 3);

        let gap = data(5, "stdout", b"z");
        let (_, result) = collect(&mut decoder, &[gap.as_bytes()]);
        assert_eq!(result.unwrap_err().kind(), ErrorKind::Protocol);
        assert_eq!(decoder.cursor(), 3);
    }

    #[test]
    fn exit_ends_the_stream_and_flushes_split_characters() {
        let mut decoder = OutputDecoder::new();
        let euro = "€".as_bytes();
        let body = [
            data(1, "stdout", &euro[..1]),
            data(2, "stdout", &euro[1..]),
            data(3, "stderr", &euro[..2]),
            exit(3),
        ]
        .concat();
        let after = data(4, "stdout", b"ignored") + "garbage\n";
        assert_eq!(decoder.exit(), None);
        let (seen, result) = collect(&mut decoder, &[body.as_bytes(), after.as_bytes()]);
        assert_eq!(result.unwrap(), Some(ExitStatus::Code(3)));
        assert_eq!(decoder.exit(), Some(&ExitStatus::Code(3)));
        assert_eq!(seen, vec![(OutputStream::Stdout, "€".into()), (OutputStream::Stderr, "\u{FFFD}".into())]);
        let output = decoder.finish();
        assert_eq!(output.stdout, "€");
        assert_eq!(output.stderr, "\u{FFFD}");
        assert!(!output.stdout_truncated && !output.stderr_truncated);
    }

    #[test]
    fn error_frames_and_long_lines() {
        let evicted = "{\"type\":\"error\",\"error\":\"output_offset_expired\"}\n";
        let (_, result) = collect(&mut OutputDecoder::new(), &[evicted.as_bytes()]);
        assert_eq!(result.unwrap_err(), Error::OutputEvicted);
        let other = "{\"type\":\"error\",\"error\":\"nope\"}\n";
        let (_, result) = collect(&mut OutputDecoder::new(), &[other.as_bytes()]);
        assert_eq!(result.unwrap_err(), Error::OutputStreamError);

        // A partial line over the limit fails before its newline arrives.
        let mut decoder = OutputDecoder::new();
        let half = vec![b' '; MAX_LINE_BYTES / 2 + 1];
        assert_eq!(decoder.feed(&half, &mut |_, _| {}).unwrap(), None);
        assert_eq!(decoder.feed(&half, &mut |_, _| {}).unwrap_err().kind(), ErrorKind::Protocol);
        // A line of exactly the limit is fine.
        let mut line = br#"{"type":"heartbeat"}"#.to_vec();
        line.resize(MAX_LINE_BYTES, b' ');
        line.push(b'\n');
        let mut decoder = OutputDecoder::new();
        assert_eq!(decoder.feed(&line[..10], &mut |_, _| {}).unwrap(), None);
        assert_eq!(decoder.feed(&line[10..], &mut |_, _| {}).unwrap(), None);
        // Blank lines and CRLF are tolerated.
        let body = format!("\n  \r\n{}\r\n", json!({"type": "heartbeat"}));
        assert_eq!(OutputDecoder::new().feed(body.as_bytes(), &mut |_, _| {}).unwrap(), None);
    }

    /// The API's limit: "a line over 1 MiB is a protocol error".
    const API_LINE_LIMIT: usize = 1_048_576;

    #[test]
    fn the_line_limit_is_the_apis_1_mib_in_any_chunking() {
        // (line length without its `\n`, accepted)
        let cases = [(API_LINE_LIMIT - 1, true), (API_LINE_LIMIT, true), (API_LINE_LIMIT + 1, false)];
        for (len, accepted) in cases {
            // A valid frame padded with JSON whitespace: only its length can fail it.
            let mut line = br#"{"type":"heartbeat"}"#.to_vec();
            line.resize(len, b' ');
            let body = [&line[..], b"\n", exit(0).as_bytes()].concat();
            // The line alone, its `\n` not arrived yet: refused as soon as it is too long.
            let partial = OutputDecoder::new().feed(&line, &mut |_, _| {});
            let after_blank = [&b"\n"[..], &body[..]].concat();
            assert_eq!(partial.is_ok(), accepted, "{len} bytes without a newline: {partial:?}");
            let chunkings: [(&str, Vec<&[u8]>); 5] = [
                ("the whole body as the first chunk", vec![&body]),
                ("after a blank line in the same chunk", vec![&after_blank]),
                ("the line, then its newline", vec![&body[..len], &body[len..]]),
                ("ten bytes, then the rest", vec![&body[..10], &body[10..]]),
                ("one byte short, then the rest", vec![&body[..len - 1], &body[len - 1..]]),
            ];
            for (how, chunks) in chunkings {
                let (_, result) = collect(&mut OutputDecoder::new(), &chunks);
                if accepted {
                    assert_eq!(result.unwrap(), Some(ExitStatus::Code(0)), "{len} bytes, {how}");
                } else {
                    assert_eq!(
                        result.unwrap_err(),
                        Error::protocol(op::OUTPUT_CONNECTION),
                        "{len} bytes, {how}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_tail_never_holds_more_than_a_quarter_over_its_limit() {
        // A tail of 8 characters may hold 10 between trims, whatever the
        // size of the pieces pushed into it.
        let mut tail = Tail::new(8);
        let mut pushed = String::new();
        for piece in ["abc", "defghijklmno", "p", "qr", "stuvwxyzABCDEFGHIJKL", "é日", "MNOPQRSTU"] {
            tail.push(piece);
            pushed.push_str(piece);
            let held = tail.text.chars().count();
            assert!(held <= 10, "{held} characters held after {pushed:?}");
            assert!(pushed.ends_with(&tail.text), "the tail is the end of the stream");
        }
        assert_eq!(tail.finish(), ("NOPQRSTU".to_string(), true));
    }

    #[test]
    fn a_chatty_command_holds_a_bounded_tail_while_it_streams() {
        // The reference keeps 4 Mi characters of tail per stream; trimming is
        // amortised, so between trims a stream may hold a quarter more.
        const REFERENCE_TAIL: usize = 4 * 1024 * 1024;
        const HELD_AT_MOST: usize = 5 * 1024 * 1024;
        const FRAME: usize = 64 * 1024;
        const FRAMES: u64 = 256; // 16 MiB: four times the tail
        let frame_text = |seq: u64| -> String { format!("{seq:>7}\n").repeat(FRAME / 8) };
        let mut decoder = OutputDecoder::new();
        let mut emitted = 0;
        for seq in 1..=FRAMES {
            let frame = data(seq, "stdout", frame_text(seq).as_bytes());
            let result = decoder.feed(frame.as_bytes(), &mut |_, text| emitted += text.len());
            assert_eq!(result.unwrap(), None);
            // ASCII: bytes are characters.
            let held = &decoder.stdout.tail.text;
            assert!(held.len() <= HELD_AT_MOST, "{} held after {emitted} streamed", held.len());
            assert!(held.capacity() <= 2 * HELD_AT_MOST, "{} allocated after {emitted}", held.capacity());
        }
        assert_eq!(emitted, 16 * 1024 * 1024, "every character reached the sink");
        assert_eq!(decoder.feed(exit(0).as_bytes(), &mut |_, _| {}).unwrap(), Some(ExitStatus::Code(0)));
        let output = decoder.finish();
        assert_eq!(output.stdout.len(), REFERENCE_TAIL);
        assert!(output.stdout_truncated);
        // The tail is the last 64 frames, in order.
        let last: String = (FRAMES - 63..=FRAMES).map(frame_text).collect();
        assert!(output.stdout == last, "the tail is not the end of the stream");
        assert_eq!((output.stderr.as_str(), output.stderr_truncated), ("", false));
    }

    #[test]
    fn reconnect_drops_a_partial_line_and_replays_are_skipped() {
        let mut decoder = OutputDecoder::new();
        let first = data(1, "stdout", b"one") + &data(2, "stdout", b"two");
        let cut = &first.as_bytes()[..first.len() - 5];
        let (seen, result) = collect(&mut decoder, &[cut]);
        assert!(result.unwrap().is_none());
        assert_eq!(joined(&seen, OutputStream::Stdout), "one");
        decoder.reconnect();
        assert_eq!(decoder.cursor(), 1);
        // The server replays everything after the cursor (and more).
        let second = data(1, "stdout", b"one") + &data(2, "stdout", b"two") + &exit(0);
        let (seen, result) = collect(&mut decoder, &[second.as_bytes()]);
        assert_eq!(result.unwrap(), Some(ExitStatus::Code(0)));
        assert_eq!(joined(&seen, OutputStream::Stdout), "two");
        assert_eq!(decoder.finish().stdout, "onetwo");
    }

    #[test]
    fn tails_keep_the_last_characters() {
        let mut decoder = OutputDecoder::with_tail_limit(5);
        let mut body = String::new();
        for (i, piece) in ["ab", "cdé", "fgh", "日本"].iter().enumerate() {
            body += &data(i as u64 + 1, "stdout", piece.as_bytes());
        }
        body += &data(5, "stderr", b"xyz");
        body += &exit(0);
        let (seen, _) = collect(&mut decoder, &[body.as_bytes()]);
        assert_eq!(joined(&seen, OutputStream::Stdout), "abcdéfgh日本");
        let output = decoder.finish();
        assert_eq!(output.stdout, "fgh日本");
        assert!(output.stdout_truncated);
        assert_eq!(output.stderr, "xyz");
        assert!(!output.stderr_truncated);

        let mut tail = Tail::new(MAX_TAIL_CHARS);
        let block = "é".repeat(1 << 16);
        for _ in 0..80 {
            tail.push(&block);
        }
        assert!(tail.text.chars().count() <= MAX_TAIL_CHARS + MAX_TAIL_CHARS / 4);
        let (text, truncated) = tail.finish();
        assert_eq!(text.chars().count(), MAX_TAIL_CHARS);
        assert!(truncated);
    }

    #[test]
    fn invalid_utf8_becomes_replacement_characters() {
        let cases: &[&[u8]] =
            &[b"\xff", b"a\xffb", b"\xe2\x28\xa1", b"\xf0\x9f\x92", b"\xc0\xaf", b"\xed\xa0\x80"];
        for bytes in cases {
            for split in 0..=bytes.len() {
                let mut decoder = Utf8Decoder::default();
                let mut out = String::new();
                decoder.decode(&bytes[..split], &mut out);
                decoder.decode(&bytes[split..], &mut out);
                decoder.flush(&mut out);
                assert_eq!(out, String::from_utf8_lossy(bytes), "{bytes:?} split at {split}");
            }
        }
    }

    #[test]
    fn a_byte_emitters_tail_keeps_the_last_bytes_and_drops_a_character_the_cut_split() {
        let output = "ab€cd€".as_bytes(); // € is three bytes: e2 82 ac
        let input: String =
            output.chunks(2).enumerate().map(|(i, chunk)| data(i as u64 + 1, "stdout", chunk)).collect();
        for (limit, tail, truncated) in
            [(64, "ab€cd€", false), (7, "cd€", true), (6, "cd€", true), (4, "d€", true)]
        {
            let mut decoder = OutputDecoder::with_tail_limit(limit);
            let mut bytes = Vec::new();
            let ended = decoder
                .feed_to(
                    (input.clone() + &exit(0)).as_bytes(),
                    &mut ByteEmit(|_: OutputStream, b: &[u8]| bytes.extend_from_slice(b)),
                )
                .unwrap();
            assert!(ended.is_some());
            assert_eq!(bytes, output, "every byte went out");
            let finished = decoder.finish();
            assert_eq!(
                (finished.stdout.as_str(), finished.stdout_truncated),
                (tail, truncated),
                "limit {limit}"
            );
        }
    }

    #[test]
    fn a_byte_emitter_gets_each_frames_bytes_as_written() {
        // Invalid UTF-8 and a character split across frames included, in
        // order, once per frame; an empty frame is no call; the tails keep
        // the decoded text.
        let input = [
            data(1, "stdout", b"caf\xc3"),
            data(2, "stderr", b""),
            data(3, "stdout", b"\xa9 \xff"),
            data(4, "stderr", b"e\n"),
            exit(0),
        ]
        .concat();
        let mut decoder = OutputDecoder::new();
        let mut seen: Vec<(OutputStream, Vec<u8>)> = Vec::new();
        let status = decoder
            .feed_to(input.as_bytes(), &mut ByteEmit(|s: OutputStream, b: &[u8]| seen.push((s, b.to_vec()))))
            .unwrap();
        assert!(status.is_some());
        assert_eq!(
            seen,
            [
                (OutputStream::Stdout, b"caf\xc3".to_vec()),
                (OutputStream::Stdout, b"\xa9 \xff".to_vec()),
                (OutputStream::Stderr, b"e\n".to_vec()),
            ]
        );
        let output = decoder.finish();
        assert_eq!((output.stdout.as_str(), output.stderr.as_str()), ("café \u{fffd}", "e\n"));
    }

    #[test]
    fn flushing_ends_a_stream_cut_short() {
        // No exit frame (a timeout): the incomplete character is emitted as
        // U+FFFD, and the tail keeps it.
        let mut decoder = OutputDecoder::new();
        let (seen, result) = collect(&mut decoder, &[data(1, "stdout", b"caf\xc3").as_bytes()]);
        assert!(result.unwrap().is_none());
        assert_eq!(joined(&seen, OutputStream::Stdout), "caf");
        let mut flushed = Vec::new();
        decoder.flush(&mut |s, t| flushed.push((s, t.to_owned())));
        assert_eq!(flushed, [(OutputStream::Stdout, "\u{fffd}".to_string())]);
        assert_eq!(decoder.finish().stdout, "caf\u{fffd}");
    }

    /// A valid stream: frames with random bytes, heartbeats and replays.
    fn valid_stream() -> impl Strategy<Value = (Vec<u8>, Vec<u8>, Vec<u8>, i32)> {
        let frame = (any::<bool>(), proptest::collection::vec(any::<u8>(), 0..12), 0u8..8);
        (proptest::collection::vec(frame, 0..24), any::<i32>()).prop_map(|(frames, code)| {
            let (mut body, mut out, mut err) = (String::new(), Vec::new(), Vec::new());
            for (seq, (is_err, bytes, extra)) in frames.into_iter().enumerate() {
                let seq = seq as u64 + 1;
                let stream = if is_err { "stderr" } else { "stdout" };
                if extra == 0 {
                    body += "{\"type\":\"heartbeat\"}\n";
                }
                if extra == 1 && seq > 1 {
                    body += &data(seq - 1, "stdout", b"replayed");
                }
                body += &data(seq, stream, &bytes);
                if is_err { &mut err } else { &mut out }.extend_from_slice(&bytes);
            }
            body += &exit(code);
            (body.into_bytes(), out, err, code)
        })
    }

    proptest! {
        #[test]
        fn any_chunking_of_a_valid_stream_decodes_the_same(
            (body, out, err, code) in valid_stream(),
            cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..16),
        ) {
            let mut cuts: Vec<usize> = cuts.iter().map(|i| i.index(body.len() + 1)).collect();
            cuts.sort_unstable();
            let mut chunks = Vec::new();
            let mut start = 0;
            for cut in cuts {
                chunks.push(&body[start..cut]);
                start = cut;
            }
            chunks.push(&body[start..]);
            let mut decoder = OutputDecoder::new();
            let (seen, result) = collect(&mut decoder, &chunks);
            prop_assert_eq!(result.unwrap(), Some(ExitStatus::Code(code)));
            let want_out = String::from_utf8_lossy(&out).into_owned();
            let want_err = String::from_utf8_lossy(&err).into_owned();
            prop_assert_eq!(&joined(&seen, OutputStream::Stdout), &want_out);
            prop_assert_eq!(&joined(&seen, OutputStream::Stderr), &want_err);
            prop_assert!(seen.iter().all(|(_, t)| !t.is_empty()));
            let output = decoder.finish();
            prop_assert_eq!(output.stdout, want_out);
            prop_assert_eq!(output.stderr, want_err);
        }

        #[test]
        fn random_bytes_never_panic(chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..64), 0..16)) {
            let mut decoder = OutputDecoder::with_tail_limit(8);
            for chunk in &chunks {
                if decoder.feed(chunk, &mut |_, _| {}).is_err() {
                    break;
                }
            }
            decoder.flush(&mut |_, _| {});
            let _ = decoder.finish();
        }

        #[test]
        fn random_lines_never_panic(lines in proptest::collection::vec("[{}\":,a-z0-9 \\[\\]-]{0,40}", 0..16)) {
            let mut decoder = OutputDecoder::new();
            for line in &lines {
                let _ = parse_frame(line.as_bytes());
                if decoder.feed(format!("{line}\n").as_bytes(), &mut |_, _| {}).is_err() {
                    break;
                }
            }
        }
    }
}
