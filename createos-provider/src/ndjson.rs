//! Incremental decoder of a managed process's NDJSON output stream
//! (`GET .../processes/{pid}/connect?after=SEQ`).
//!
//! Feed it the body's chunks as they arrive ([`OutputDecoder::feed`]); it
//! splits lines, parses frames, checks sequence numbers, hands the bytes of
//! every data frame to a callback exactly once, as the command wrote them,
//! and keeps the tail of each stream.
//!
//! The byte path is built to keep up with a command writing as fast as it
//! can (the server keeps only 1 MiB of output): lines are found with
//! `memchr`, a data frame's base64 is read in place from the line (never
//! copied into a JSON value) and decoded into one buffer kept across lines,
//! and the frames of one chunk are handed out together: one callback per
//! run of frames of the same stream, at most [`GATHER_BYTES`] each.
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
//! - The exit frame ends the output: everything after it is
//!   ignored. `exit_code` wins when both statuses are present; an exit with
//!   neither (or with `null`s) is a protocol error. `exit_code` must fit an
//!   `i32`; `signal` is a non-empty name (an integer is accepted as its
//!   number).
//! - An error frame fails the stream: `output_offset_expired` is
//!   [`Error::OutputEvicted`], anything else [`Error::OutputStreamError`].
//! - Malformed JSON, a non-object, an unknown `type`, a data frame with a
//!   missing or ill-typed field, an unknown stream or invalid base64, a gap:
//!   [`Error::Protocol`]`(output connection)`. After an error the decoder
//!   must not be fed again (the command is over).
//! - Base64 is the standard alphabet; padding is optional.
//! - Nothing is decoded as the bytes arrive: each stream keeps its last
//!   `tail_limit` bytes ([`MAX_TAIL_BYTES`] = 4 Mi by default) and remembers
//!   whether it dropped any, and [`OutputDecoder::finish`] decodes that tail
//!   once, as `String::from_utf8_lossy` would (each maximal invalid
//!   subsequence becomes one U+FFFD; a character the cut split is dropped
//!   whole). Binary output costs a copy, not a decoding per byte. Trimming
//!   is amortised: the buffer may briefly hold a quarter more.

use std::borrow::Cow;
use std::mem;

use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use base64::Engine as _;
use provider_abi::OutputStream;
use serde::Deserialize;
use serde_json::Value;

use crate::error::{op, Error};

/// Longest accepted line, without its `\n`.
pub const MAX_LINE_BYTES: usize = 1 << 20;
/// Most bytes handed to the callback at once: the decoded frames of one
/// chunk are gathered up to this size.
pub const GATHER_BYTES: usize = 256 << 10;
/// Bytes of tail kept per stream (the reference kept 4 Mi characters).
pub const MAX_TAIL_BYTES: usize = 4 << 20;
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

fn protocol() -> Error {
    Error::Protocol(op::OUTPUT_CONNECTION)
}

/// One parsed line, a data frame's base64 still encoded (read in place when
/// it has no escapes). A JSON `null` reads as absent, unknown fields and
/// the fields of other frame types are ignored.
#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
enum Line<'a> {
    Heartbeat,
    Data {
        seq: u64,
        #[serde(borrow)]
        stream: Cow<'a, str>,
        #[serde(borrow, rename = "data_base64")]
        encoded: Cow<'a, str>,
    },
    Exit {
        exit_code: Option<i32>,
        signal: Option<Value>,
    },
    Error {
        error: Option<Value>,
    },
}

/// Parses one line (without its `\n`), leaving a data frame's base64 in it.
fn parse_line(line: &[u8]) -> Result<Line<'_>, Error> {
    // Only an object is a frame (serde would read a frame from an array).
    if line.iter().find(|byte| !byte.is_ascii_whitespace()) != Some(&b'{') {
        return Err(protocol());
    }
    serde_json::from_slice(line).map_err(|_| protocol())
}

/// The length `encoded` decodes to (when it is valid base64).
fn decoded_len(encoded: &str) -> usize {
    let unpadded = encoded.trim_end_matches('=').len();
    unpadded / 4 * 3 + (unpadded % 4).saturating_sub(1)
}

/// The last `limit` bytes of a stream.
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

/// What a command printed, once the stream is over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodedOutput {
    /// The tail of standard output.
    pub stdout: String,
    /// The tail of standard error.
    pub stderr: String,
    /// True when standard output lost bytes to the tail limit.
    pub stdout_truncated: bool,
    /// True when standard error lost bytes to the tail limit.
    pub stderr_truncated: bool,
}

/// The incremental decoder; see the module documentation for the rules.
#[derive(Debug)]
pub struct OutputDecoder {
    /// A partial line carried to the next chunk.
    line: Vec<u8>,
    cursor: u64,
    stdout: ByteTail,
    stderr: ByteTail,
    exit: Option<ExitStatus>,
    /// Decoded bytes of `gathered_stream` not handed out yet; the buffer is
    /// kept (and reused) for the decoder's life.
    gathered: Vec<u8>,
    gathered_stream: OutputStream,
}

impl Default for OutputDecoder {
    fn default() -> Self {
        Self::new()
    }
}

impl OutputDecoder {
    /// A decoder keeping [`MAX_TAIL_BYTES`] per stream.
    pub fn new() -> Self {
        Self::with_tail_limit(MAX_TAIL_BYTES)
    }

    /// A decoder keeping `limit` bytes per stream.
    pub fn with_tail_limit(limit: usize) -> Self {
        OutputDecoder {
            line: Vec::new(),
            cursor: 0,
            stdout: ByteTail::new(limit),
            stderr: ByteTail::new(limit),
            exit: None,
            gathered: Vec::new(),
            gathered_stream: OutputStream::Stdout,
        }
    }

    /// The last accepted `seq`: reconnect with `after = cursor`.
    pub fn cursor(&self) -> u64 {
        self.cursor
    }

    /// A new connection starts: a partial line of the old one is dropped
    /// (its frame is replayed, since the cursor never passed it).
    pub fn reconnect(&mut self) {
        self.line.clear();
    }

    /// Feeds one body chunk. The bytes of its data frames go to
    /// `emit(stream, bytes)` in order, exactly once, before this returns:
    /// consecutive frames of one stream together, at most [`GATHER_BYTES`]
    /// a call (but a single larger frame), never an empty call. Returns the
    /// exit status once the exit frame has arrived (and from then on
    /// ignores input).
    pub fn feed(
        &mut self,
        chunk: &[u8],
        emit: &mut impl FnMut(OutputStream, &[u8]),
    ) -> Result<Option<ExitStatus>, Error> {
        let split = self.split_lines(chunk, emit);
        // What was decoded before a failure went out too: it was accepted.
        self.hand_out(emit);
        split?;
        Ok(self.exit.clone())
    }

    /// Splits `chunk` into lines and takes each complete one.
    fn split_lines(&mut self, chunk: &[u8], emit: &mut impl FnMut(OutputStream, &[u8])) -> Result<(), Error> {
        let mut rest = chunk;
        while self.exit.is_none() {
            let Some(newline) = memchr::memchr(b'\n', rest) else {
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
        Ok(())
    }

    fn line_done(&mut self, line: &[u8], emit: &mut impl FnMut(OutputStream, &[u8])) -> Result<(), Error> {
        if line.iter().all(u8::is_ascii_whitespace) {
            return Ok(());
        }
        match parse_line(line)? {
            Line::Heartbeat => Ok(()),
            Line::Data { seq, stream, encoded } => {
                let stream = match stream.as_ref() {
                    "stdout" => OutputStream::Stdout,
                    "stderr" => OutputStream::Stderr,
                    _ => return Err(protocol()),
                };
                if seq <= self.cursor {
                    return Ok(());
                }
                if seq != self.cursor + 1 {
                    return Err(protocol());
                }
                if encoded.is_empty() {
                    self.cursor = seq;
                    return Ok(());
                }
                if stream != self.gathered_stream
                    || self.gathered.len() + decoded_len(&encoded) > GATHER_BYTES
                {
                    self.hand_out(emit);
                    self.gathered_stream = stream;
                }
                let before = self.gathered.len();
                if BASE64.decode_vec(encoded.as_bytes(), &mut self.gathered).is_err() {
                    self.gathered.truncate(before);
                    return Err(protocol());
                }
                self.cursor = seq;
                Ok(())
            }
            // `exit_code` wins; a signal is a non-empty name or its number.
            Line::Exit { exit_code, signal } => {
                let status = match (exit_code, signal) {
                    (Some(code), _) => ExitStatus::Code(code),
                    (None, Some(Value::String(name))) if !name.is_empty() => ExitStatus::Signal(name),
                    (None, Some(Value::Number(n))) if n.as_u64().is_some() => {
                        ExitStatus::Signal(n.to_string())
                    }
                    _ => return Err(protocol()),
                };
                self.exit = Some(status);
                Ok(())
            }
            Line::Error { error } if error.as_ref().and_then(Value::as_str) == Some(OFFSET_EXPIRED) => {
                Err(Error::OutputEvicted)
            }
            Line::Error { .. } => Err(Error::OutputStreamError),
        }
    }

    /// Hands the gathered bytes to `emit` and to their stream's tail.
    fn hand_out(&mut self, emit: &mut impl FnMut(OutputStream, &[u8])) {
        if self.gathered.is_empty() {
            return;
        }
        let stream = self.gathered_stream;
        emit(stream, &self.gathered);
        let tail = match stream {
            OutputStream::Stdout => &mut self.stdout,
            OutputStream::Stderr => &mut self.stderr,
        };
        tail.push(&self.gathered);
        self.gathered.clear();
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

    type Seen = Vec<(OutputStream, Vec<u8>)>;

    fn collect(decoder: &mut OutputDecoder, chunks: &[&[u8]]) -> (Seen, Result<Option<ExitStatus>, Error>) {
        let mut seen = Vec::new();
        let mut result = Ok(None);
        for chunk in chunks {
            result = decoder.feed(chunk, &mut |s, b| seen.push((s, b.to_vec())));
            if result.is_err() {
                break;
            }
        }
        (seen, result)
    }

    /// The bytes emitted for `stream`, decoded.
    fn joined(seen: &Seen, stream: OutputStream) -> String {
        let bytes: Vec<u8> = seen.iter().filter(|(s, _)| *s == stream).flat_map(|(_, b)| b.clone()).collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// What a fresh decoder makes of one line: the bytes it hands out and
    /// the exit status, or its error.
    fn frame(line: &[u8]) -> Result<(Seen, Option<ExitStatus>), Error> {
        let (seen, result) = collect(&mut OutputDecoder::new(), &[line, b"\n"]);
        result.map(|exit| (seen, exit))
    }

    #[test]
    fn frames_parse() {
        let hi = |stream| Ok((vec![(stream, b"hi".to_vec())], None));
        assert_eq!(frame(br#"{"type":"heartbeat"}"#), Ok((vec![], None)));
        assert_eq!(
            frame(br#"{"type":"data","seq":1,"stream":"stderr","data_base64":"aGk=","x":1}"#),
            hi(OutputStream::Stderr)
        );
        assert_eq!(
            frame(br#"{"type":"data","seq":1,"stream":"stdout","data_base64":"aGk"}"#),
            hi(OutputStream::Stdout)
        );
        // An escaped base64 string, and fields of any type after the frame's own.
        assert_eq!(
            frame(br#"{"type":"data","seq":1,"stream":"stdout","data_base64":"aG\u006b","x":[{"y":null}]}"#),
            hi(OutputStream::Stdout)
        );
        assert_eq!(frame(br#" {"data_base64":{"n":[1,2.5,true]},"type":"heartbeat"}"#), Ok((vec![], None)));
        let exited = |status| Ok((vec![], Some(status)));
        assert_eq!(frame(br#"{"type":"exit","exit_code":-1}"#), exited(ExitStatus::Code(-1)));
        assert_eq!(
            frame(br#"{"type":"exit","exit_code":null,"signal":"SIGKILL"}"#),
            exited(ExitStatus::Signal("SIGKILL".into()))
        );
        assert_eq!(frame(br#"{"type":"exit","signal":9}"#), exited(ExitStatus::Signal("9".into())));
        assert_eq!(
            frame(br#"{"type":"exit","exit_code":2,"signal":"SIGTERM"}"#),
            exited(ExitStatus::Code(2))
        );
        assert_eq!(frame(br#"{"type":"error","error":"output_offset_expired"}"#), Err(Error::OutputEvicted));
        assert_eq!(frame(br#"{"type":"error","error":"boom"}"#), Err(Error::OutputStreamError));
        assert_eq!(frame(br#"{"type":"error"}"#), Err(Error::OutputStreamError));
        // A blank line is skipped; as a frame it would be malformed.
        assert_eq!(parse_line(b"").err(), Some(protocol()));
        let bad: &[&[u8]] = &[
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
            br#"{"type":"data","seq":1,"stream":"stdout","data_base64":5}"#,
            br#"{"type":"data","seq":1,"stream":"stdout","data_base64":["aGk="]}"#,
            br#"{"type":"data","seq":1,"stream":"stdout","data_base64":{"a":"aGk="}}"#,
            br#"{"type":"data","seq":1,"stream":"stdout","data_base64":null}"#,
            br#"["data",1,"stdout","aGk=",null,null,null]"#,
        ];
        for line in bad {
            let err = frame(line).unwrap_err();
            assert_eq!(err, Error::Protocol(op::OUTPUT_CONNECTION), "{}", String::from_utf8_lossy(line));
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
        assert_eq!(result.unwrap_err().kind(), ErrorKind::PROTOCOL);
        assert_eq!(decoder.cursor(), 3);
    }

    #[test]
    fn the_frames_of_a_chunk_go_out_in_writes_of_at_most_the_gather_size() {
        // 64 KiB frames, as the simulator journals a fast command's output:
        // four fill one write, a fifth starts the next; a stderr frame
        // between them ends a write.
        const FRAME: usize = 64 << 10;
        let piece = |seq: u64| vec![seq as u8; FRAME];
        let mut body = String::new();
        for seq in 1..=9 {
            body += &data(seq, "stdout", &piece(seq));
        }
        body += &data(10, "stderr", b"warning\n");
        body += &data(11, "stdout", &piece(11));
        let mut decoder = OutputDecoder::new();
        let (seen, result) = collect(&mut decoder, &[body.as_bytes()]);
        assert_eq!(result.unwrap(), None);
        let writes: Vec<(OutputStream, usize)> = seen.iter().map(|(s, b)| (*s, b.len())).collect();
        let out = OutputStream::Stdout;
        assert_eq!(
            writes,
            [(out, 4 * FRAME), (out, 4 * FRAME), (out, FRAME), (OutputStream::Stderr, 8), (out, FRAME)]
        );
        assert_eq!(GATHER_BYTES, 4 * FRAME);
        let stdout: Vec<u8> = seen.iter().filter(|(s, _)| *s == out).flat_map(|(_, b)| b.clone()).collect();
        let want: Vec<u8> = [1, 2, 3, 4, 5, 6, 7, 8, 9, 11].into_iter().flat_map(piece).collect();
        assert!(stdout == want, "every byte, in order");

        // A single frame larger than the gather size goes out alone, whole.
        let big = vec![7u8; GATHER_BYTES + 1];
        let body = data(1, "stdout", b"a") + &data(2, "stdout", &big) + &data(3, "stdout", b"b");
        let (seen, _) = collect(&mut OutputDecoder::new(), &[body.as_bytes()]);
        let sizes: Vec<usize> = seen.iter().map(|(_, b)| b.len()).collect();
        assert_eq!(sizes, [1, GATHER_BYTES + 1, 1]);
    }

    #[test]
    fn decoded_lengths_are_exact_padded_or_not() {
        for len in 0..40 {
            let bytes = vec![0xA5u8; len];
            let padded = BASE64.encode(&bytes);
            assert_eq!(decoded_len(&padded), len, "{padded}");
            assert_eq!(decoded_len(padded.trim_end_matches('=')), len);
        }
    }

    #[test]
    fn what_was_decoded_before_a_failure_goes_out() {
        let body = data(1, "stdout", b"kept") + &data(2, "stdout", b" too") + "not json\n";
        let mut decoder = OutputDecoder::new();
        let (seen, result) = collect(&mut decoder, &[body.as_bytes()]);
        assert_eq!(result.unwrap_err(), Error::Protocol(op::OUTPUT_CONNECTION));
        assert_eq!(seen, [(OutputStream::Stdout, b"kept too".to_vec())]);
        assert_eq!(decoder.cursor(), 2);
        // Bad base64 neither moves the cursor nor leaves its bytes behind.
        let body = data(1, "stdout", b"ok")
            + r#"{"type":"data","seq":2,"stream":"stdout","data_base64":"a"}"#
            + "\n";
        let mut decoder = OutputDecoder::new();
        let (seen, result) = collect(&mut decoder, &[body.as_bytes()]);
        assert_eq!(result.unwrap_err(), Error::Protocol(op::OUTPUT_CONNECTION));
        assert_eq!(seen, [(OutputStream::Stdout, b"ok".to_vec())]);
        assert_eq!((decoder.cursor(), decoder.finish().stdout.as_str()), (1, "ok"));
    }

    #[test]
    fn exit_ends_the_stream_and_the_tails_decode_split_characters() {
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
        assert_eq!(decoder.exit, None);
        let (seen, result) = collect(&mut decoder, &[body.as_bytes(), after.as_bytes()]);
        assert_eq!(result.unwrap(), Some(ExitStatus::Code(3)));
        assert_eq!(decoder.exit, Some(ExitStatus::Code(3)));
        let bytes = |a: &[u8]| a.to_vec();
        assert_eq!(
            seen,
            vec![(OutputStream::Stdout, bytes(euro)), (OutputStream::Stderr, bytes(&euro[..2]))],
            "the stdout frames of one chunk go out together"
        );
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
        assert_eq!(decoder.feed(&half, &mut |_, _| {}).unwrap_err().kind(), ErrorKind::PROTOCOL);
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
                        Error::Protocol(op::OUTPUT_CONNECTION),
                        "{len} bytes, {how}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_tail_never_holds_more_than_a_quarter_over_its_limit() {
        // A tail of 8 bytes may hold 10 between trims, whatever the size of
        // the pieces pushed into it.
        let mut tail = ByteTail::new(8);
        let mut pushed = Vec::new();
        for piece in ["abc", "defghijklmno", "p", "qr", "stuvwxyzABCDEFGHIJKL", "é日", "MNOPQRSTU"] {
            tail.push(piece.as_bytes());
            pushed.extend_from_slice(piece.as_bytes());
            let held = tail.bytes.len();
            assert!(held <= 10, "{held} bytes held after {:?}", String::from_utf8_lossy(&pushed));
            assert!(pushed.ends_with(&tail.bytes), "the tail is the end of the stream");
        }
        assert_eq!(tail.finish(), ("NOPQRSTU".to_string(), true));
    }

    #[test]
    fn a_chatty_command_holds_a_bounded_tail_while_it_streams() {
        // The tail keeps 4 MiB per stream; trimming is amortised, so between
        // trims a stream may hold a quarter more.
        const REFERENCE_TAIL: usize = 4 * 1024 * 1024;
        const HELD_AT_MOST: usize = 5 * 1024 * 1024;
        const FRAME: usize = 64 * 1024;
        const FRAMES: u64 = 256; // 16 MiB: four times the tail
        let frame_text = |seq: u64| -> String { format!("{seq:>7}\n").repeat(FRAME / 8) };
        let mut decoder = OutputDecoder::new();
        let mut emitted = 0;
        for seq in 1..=FRAMES {
            let frame = data(seq, "stdout", frame_text(seq).as_bytes());
            let result = decoder.feed(frame.as_bytes(), &mut |_, bytes| emitted += bytes.len());
            assert_eq!(result.unwrap(), None);
            let held = &decoder.stdout.bytes;
            assert!(held.len() <= HELD_AT_MOST, "{} held after {emitted} streamed", held.len());
            assert!(held.capacity() <= 2 * HELD_AT_MOST, "{} allocated after {emitted}", held.capacity());
        }
        assert_eq!(emitted, 16 * 1024 * 1024, "every byte reached the sink");
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
    fn tails_keep_the_last_bytes() {
        let mut decoder = OutputDecoder::with_tail_limit(7);
        let mut body = String::new();
        for (i, piece) in ["ab", "cdé", "fgh", "日本"].iter().enumerate() {
            body += &data(i as u64 + 1, "stdout", piece.as_bytes());
        }
        body += &data(5, "stderr", b"xyz");
        body += &exit(0);
        let (seen, _) = collect(&mut decoder, &[body.as_bytes()]);
        assert_eq!(joined(&seen, OutputStream::Stdout), "abcdéfgh日本");
        let output = decoder.finish();
        assert_eq!(output.stdout, "h日本");
        assert!(output.stdout_truncated);
        assert_eq!(output.stderr, "xyz");
        assert!(!output.stderr_truncated);

        let mut tail = ByteTail::new(MAX_TAIL_BYTES);
        let block = "é".repeat(1 << 16);
        for _ in 0..80 {
            tail.push(block.as_bytes());
        }
        assert!(tail.bytes.len() <= MAX_TAIL_BYTES + MAX_TAIL_BYTES / 4);
        let (text, truncated) = tail.finish();
        assert_eq!(text.chars().count(), MAX_TAIL_BYTES / 2, "two bytes a character");
        assert!(truncated);
    }

    #[test]
    fn a_character_split_across_frames_is_joined_and_invalid_bytes_become_replacement_characters() {
        let cases: &[&[u8]] = &[
            b"\xff",
            b"a\xffb",
            b"\xe2\x28\xa1",
            b"\xf0\x9f\x92",
            b"\xc0\xaf",
            b"\xed\xa0\x80",
            "€".as_bytes(),
        ];
        for bytes in cases {
            for split in 0..=bytes.len() {
                let body =
                    data(1, "stdout", &bytes[..split]) + &data(2, "stdout", &bytes[split..]) + &exit(0);
                let mut decoder = OutputDecoder::new();
                let (seen, result) = collect(&mut decoder, &[body.as_bytes()]);
                assert!(result.unwrap().is_some());
                let want = String::from_utf8_lossy(bytes);
                assert_eq!(joined(&seen, OutputStream::Stdout), want);
                assert_eq!(decoder.finish().stdout, want, "{bytes:?} split at {split}");
            }
        }
    }

    #[test]
    fn a_tail_drops_a_character_the_cut_split() {
        let output = "ab€cd€".as_bytes(); // € is three bytes: e2 82 ac
        let input: String =
            output.chunks(2).enumerate().map(|(i, chunk)| data(i as u64 + 1, "stdout", chunk)).collect();
        for (limit, tail, truncated) in
            [(64, "ab€cd€", false), (7, "cd€", true), (6, "cd€", true), (4, "d€", true)]
        {
            let mut decoder = OutputDecoder::with_tail_limit(limit);
            let mut bytes = Vec::new();
            let ended = decoder
                .feed((input.clone() + &exit(0)).as_bytes(), &mut |_, b| bytes.extend_from_slice(b))
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
    fn each_frames_bytes_go_out_as_written() {
        // Invalid UTF-8 and a character split across frames included, in
        // order, the frames of one stream in a chunk together (an empty
        // frame of the other stream between them splits nothing); the tails
        // keep the decoded text.
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
        let status = decoder.feed(input.as_bytes(), &mut |s, b| seen.push((s, b.to_vec()))).unwrap();
        assert!(status.is_some());
        assert_eq!(
            seen,
            [(OutputStream::Stdout, b"caf\xc3\xa9 \xff".to_vec()), (OutputStream::Stderr, b"e\n".to_vec())]
        );
        let output = decoder.finish();
        assert_eq!((output.stdout.as_str(), output.stderr.as_str()), ("café \u{fffd}", "e\n"));
    }

    #[test]
    fn a_stream_cut_short_keeps_an_incomplete_character_as_a_replacement() {
        // No exit frame (a timeout): the bytes went out as they came, and the
        // tail decodes the incomplete character as U+FFFD.
        let mut decoder = OutputDecoder::new();
        let (seen, result) = collect(&mut decoder, &[data(1, "stdout", b"caf\xc3").as_bytes()]);
        assert!(result.unwrap().is_none());
        assert_eq!(seen, [(OutputStream::Stdout, b"caf\xc3".to_vec())]);
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
            prop_assert!(seen.iter().all(|(_, b)| !b.is_empty()));
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
            let _ = decoder.finish();
        }

        #[test]
        fn random_lines_never_panic(lines in proptest::collection::vec("[{}\":,a-z0-9 \\[\\]-]{0,40}", 0..16)) {
            let mut decoder = OutputDecoder::new();
            for line in &lines {
                let _ = parse_line(line.as_bytes());
                if decoder.feed(format!("{line}\n").as_bytes(), &mut |_, _| {}).is_err() {
                    break;
                }
            }
        }
    }
}
