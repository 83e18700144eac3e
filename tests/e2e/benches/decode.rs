//! Output and reply decoding, single core:
//! - `ndjson_decode`: the NDJSON output decoder, in MB/s of process output
//!   (base64 in JSON lines → the raw bytes delivered to a callback), fed in
//!   16 KiB body chunks like an HTTP stream, for text in 4 KiB frames;
//! - `ndjson_decode_bytes`: the same decoder for random bytes (binary output)
//!   and ASCII text, in 64 KiB frames as the simulator journals them;
//! - `envelope`: the `{"status":"success","data":{..}}` reply parser;
//! - `sink`: delivering one 4 KiB chunk to the host through a `ByteSink`
//!   against calling the host's closure directly.

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use createos_provider::client::envelope;
use createos_provider::ndjson::OutputDecoder;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use provider_abi::{ByteSink, OutputStream};
use serde_json::json;
use std::hint::black_box;

/// Bytes of process output per data frame.
const FRAME_BYTES: usize = 4096;
/// Process output per decoded stream.
const OUTPUT_BYTES: usize = 4 << 20;
/// HTTP body chunk size the decoder is fed with.
const BODY_CHUNK: usize = 16 << 10;

/// `bytes` of build-log-like output; `multibyte` mixes in 2-, 3- and
/// 4-byte characters (about a quarter of the bytes), which frame
/// boundaries then split.
fn process_output(bytes: usize, multibyte: bool) -> Vec<u8> {
    let ascii = "   Compiling createos-provider v0.1.0 (/work/main/createos-provider)\n";
    let mixed = "   Kompilierung läuft → 完了 ✓ 🚀 ok\n";
    let line = if multibyte { mixed } else { ascii };
    line.bytes().cycle().take(bytes).collect()
}

/// `bytes` of binary output: the same pseudo-random bytes every run.
fn random_output(bytes: usize) -> Vec<u8> {
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    (0..bytes)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 24) as u8
        })
        .collect()
}

/// The NDJSON body a process printing `output` produces: 4 KiB data frames
/// (every eighth on stderr), a heartbeat every 64 frames, an exit frame.
fn ndjson_body(output: &[u8]) -> Vec<u8> {
    ndjson_body_of(output, FRAME_BYTES)
}

/// [`ndjson_body`] with frames of `frame` bytes.
fn ndjson_body_of(output: &[u8], frame: usize) -> Vec<u8> {
    let mut body = Vec::new();
    for (i, chunk) in output.chunks(frame).enumerate() {
        let stream = if i % 8 == 7 { "stderr" } else { "stdout" };
        let frame =
            json!({"type": "data", "seq": i + 1, "stream": stream, "data_base64": STANDARD.encode(chunk)});
        serde_json::to_writer(&mut body, &frame).unwrap();
        body.push(b'\n');
        if i % 64 == 63 {
            body.extend_from_slice(b"{\"type\":\"heartbeat\"}\n");
        }
    }
    body.extend_from_slice(b"{\"type\":\"exit\",\"exit_code\":0}\n");
    body
}

fn ndjson_decode(c: &mut Criterion) {
    let mut group = c.benchmark_group("ndjson_decode");
    group.throughput(Throughput::Bytes(OUTPUT_BYTES as u64));
    for (name, multibyte) in [("ascii", false), ("utf8_mixed", true)] {
        let body = ndjson_body(&process_output(OUTPUT_BYTES, multibyte));
        group.bench_function(name, |b| {
            b.iter(|| {
                let mut decoder = OutputDecoder::new();
                let mut emit = |stream: OutputStream, bytes: &[u8]| {
                    black_box((stream, bytes));
                };
                for chunk in body.chunks(BODY_CHUNK) {
                    decoder.feed(chunk, &mut emit).unwrap();
                }
                black_box(decoder.finish())
            })
        });
    }
    group.finish();
}

fn ndjson_decode_bytes(c: &mut Criterion) {
    let mut group = c.benchmark_group("ndjson_decode_bytes");
    group.throughput(Throughput::Bytes(OUTPUT_BYTES as u64));
    let outputs = [("random", random_output(OUTPUT_BYTES)), ("ascii", process_output(OUTPUT_BYTES, false))];
    for (name, output) in outputs {
        let body = ndjson_body_of(&output, 64 << 10);
        group.bench_function(name, |b| {
            b.iter(|| {
                let mut decoder = OutputDecoder::new();
                let mut emit = |stream: OutputStream, bytes: &[u8]| {
                    black_box((stream, bytes));
                };
                for chunk in body.chunks(BODY_CHUNK) {
                    decoder.feed(chunk, &mut emit).unwrap();
                }
                black_box(decoder.finish())
            })
        });
    }
    group.finish();
}

fn envelope_parse(c: &mut Criterion) {
    let replies = [
        ("sandbox", json!({"id": "sb-0123456789abcdef0123456789abcdef", "status": "running"})),
        ("exec", json!({"result": {"exit_code": 0, "stdout": "x".repeat(256), "stderr": ""}})),
    ];
    let mut group = c.benchmark_group("envelope");
    for (name, data) in replies {
        let body = json!({"status": "success", "data": data}).to_string().into_bytes();
        group.throughput(Throughput::Bytes(body.len() as u64));
        group.bench_function(name, |b| b.iter(|| black_box(envelope(black_box(&body), "bench").unwrap())));
    }
    group.finish();
}

fn sink(c: &mut Criterion) {
    let chunk = process_output(FRAME_BYTES, false);
    let mut received = 0usize;
    let mut host = move |_: OutputStream, bytes: &[u8]| {
        received += bytes.len();
        black_box(received);
    };
    let mut group = c.benchmark_group("sink");
    group.bench_function("direct_closure", |b| b.iter(|| host(OutputStream::Stdout, black_box(&chunk))));
    let mut sink = ByteSink::new(host);
    group.bench_function("byte_sink", |b| b.iter(|| sink.write(OutputStream::Stdout, black_box(&chunk))));
    group.finish();
}

criterion_group!(benches, ndjson_decode, ndjson_decode_bytes, envelope_parse, sink);
criterion_main!(benches);
