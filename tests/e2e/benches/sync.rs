//! File sync through the loaded CreateOS provider against the simulator,
//! beside raw `PUT`/`GET /files` of the same bytes. Prints one table.
//!
//! - 256 MiB in and out: the provider's `sync_in`/`sync_out` of one file
//!   against a raw streamed `PUT`/`GET` (reqwest, the same 256 KiB reads
//!   from disk), with the throughput ratio and the process's peak RSS during
//!   each transfer (reset before each with `/proc/self/clear_refs`; the
//!   simulator runs in this process too, so the figure is host and
//!   simulator together: an upper bound for the host).
//! - The copy the simulator forces on the sandbox side: its `/tmp` and
//!   `/paperclip-workspace` are separate bind mounts, so the `mv` from the
//!   scratch file into the workspace (and the outbound `ln`, which falls back
//!   to `cp`) copies the bytes; measured alone with `cp` through `execute`.
//! - 10,000 small files in 100 directories, in and out: time and the API
//!   requests each operation sent (a constant, not one per file).

use e2e::bed::Bed;
use futures_util::StreamExt;
use provider_abi::{Lease, Provider, SyncParams};
use serde_json::{json, Value};
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

const BIG: u64 = 256 << 20;
const SMALL_FILES: usize = 10_000;

fn main() {
    let bed = Bed::new();
    let config = bed.config(json!({"timeoutMs": 600_000}));
    let lease = bed.acquire(&config);
    let id = lease.provider_lease_id.as_ref().unwrap().to_string();
    let host = tempfile::tempdir().unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let http = reqwest::Client::new();

    let big = host.path().join("big.bin");
    write_big(&big);
    println!("| what | time | MiB/s | vs raw | peak RSS | requests |");
    println!("|---|---|---|---|---|---|");

    reset_peak();
    let started = Instant::now();
    runtime.block_on(raw_put(&http, &bed, &id, &big));
    let raw_in = report("raw PUT 256 MiB", started.elapsed(), BIG, None, None);

    reset_peak();
    let before = bed.ledger().requests.len();
    let started = Instant::now();
    sync(&bed, &config, &lease, true, "file", path(&big), "/paperclip-workspace/big.bin");
    let requests = bed.ledger().requests.len() - before;
    report("sync_in 256 MiB", started.elapsed(), BIG, Some(raw_in), Some(requests));

    let raw_target = host.path().join("raw-back.bin");
    reset_peak();
    let started = Instant::now();
    runtime.block_on(raw_get(&http, &bed, &id, &raw_target));
    let raw_out = report("raw GET 256 MiB", started.elapsed(), BIG, None, None);
    std::fs::remove_file(&raw_target).unwrap();

    let back = host.path().join("back.bin");
    reset_peak();
    let before = bed.ledger().requests.len();
    let started = Instant::now();
    sync(&bed, &config, &lease, false, "file", "/paperclip-workspace/big.bin", path(&back));
    let requests = bed.ledger().requests.len() - before;
    report("sync_out 256 MiB", started.elapsed(), BIG, Some(raw_out), Some(requests));
    assert_eq!(std::fs::metadata(&back).unwrap().len(), BIG);
    std::fs::remove_file(&back).unwrap();
    std::fs::remove_file(&big).unwrap();

    let copy = bed.command(&config, &lease, "/bin/cp", &["/paperclip-workspace/big.bin", "/tmp/copy.bin"]);
    let started = Instant::now();
    let copied = bed.execute(&copy).0.unwrap();
    assert_eq!(copied.exit_code.into_option(), Some(0));
    report("in-sandbox cp 256 MiB, /paperclip-workspace → /tmp", started.elapsed(), BIG, None, None);

    let tree = host.path().join("tree");
    let bytes = write_tree(&tree);
    let before = bed.ledger().requests.len();
    let started = Instant::now();
    sync(&bed, &config, &lease, true, "directory", path(&tree), "/paperclip-workspace/tree");
    let requests = bed.ledger().requests.len() - before;
    report("sync_in 10,000 files", started.elapsed(), bytes, None, Some(requests));
    let tree_back = host.path().join("tree-back");
    let before = bed.ledger().requests.len();
    let started = Instant::now();
    sync(&bed, &config, &lease, false, "directory", "/paperclip-workspace/tree", path(&tree_back));
    let requests = bed.ledger().requests.len() - before;
    report("sync_out 10,000 files", started.elapsed(), bytes, None, Some(requests));
}

fn path(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// 256 MiB of non-repeating bytes, written 1 MiB at a time.
fn write_big(path: &Path) {
    let mut file = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut chunk = vec![0u8; 1 << 20];
    for _ in 0..(BIG >> 20) {
        for byte in chunk.iter_mut() {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            *byte = state as u8;
        }
        file.write_all(&chunk).unwrap();
    }
    file.flush().unwrap();
}

/// 10,000 files of 100 bytes in 100 directories; returns their total size.
fn write_tree(root: &Path) -> u64 {
    for i in 0..SMALL_FILES {
        let dir = root.join(format!("d{:02}", i % 100));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(format!("f{i:05}.txt")), [b'x'; 100]).unwrap();
    }
    (SMALL_FILES * 100) as u64
}

fn sync(bed: &Bed, config: &Value, lease: &Lease, inbound: bool, kind: &str, source: &str, target: &str) {
    let params = SyncParams::single(bed.lease_params(config, lease), "bench", kind, source, target);
    let result = if inbound { bed.provider.sync_in(&params) } else { bed.provider.sync_out(&params) };
    result.unwrap_or_else(|error| panic!("sync failed: {error}"));
}

fn files_url(bed: &Bed, id: &str, path: &str) -> String {
    format!("{}/v1/sandboxes/{id}/files?path={path}", bed.sim.url())
}

async fn raw_put(http: &reqwest::Client, bed: &Bed, id: &str, source: &Path) {
    let file = tokio::fs::File::open(source).await.unwrap();
    let body = reqwest::Body::wrap_stream(tokio_util::io::ReaderStream::with_capacity(file, 256 << 10));
    let response = http
        .put(files_url(bed, id, "/paperclip-workspace/raw.bin"))
        .header("X-Api-Key", bed.sim.api_key())
        .header("Content-Length", BIG)
        .body(body)
        .send()
        .await
        .unwrap();
    assert!(response.status().is_success());
}

async fn raw_get(http: &reqwest::Client, bed: &Bed, id: &str, target: &Path) {
    let response = http
        .get(files_url(bed, id, "/paperclip-workspace/raw.bin"))
        .header("X-Api-Key", bed.sim.api_key())
        .send()
        .await
        .unwrap();
    assert!(response.status().is_success());
    let mut file = std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(target).unwrap());
    let mut stream = response.bytes_stream();
    while let Some(chunk) = stream.next().await {
        file.write_all(&chunk.unwrap()).unwrap();
    }
    file.flush().unwrap();
}

/// Resets the peak resident set size (`VmHWM`).
fn reset_peak() {
    std::fs::write("/proc/self/clear_refs", "5").unwrap();
}

/// The peak resident set size since the last reset, in MiB.
fn peak_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|line| line.starts_with("VmHWM:")).unwrap();
    let kib: f64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib / 1024.0
}

/// Prints one row; returns the throughput in MiB/s.
fn report(what: &str, took: Duration, bytes: u64, raw: Option<f64>, requests: Option<usize>) -> f64 {
    let rate = bytes as f64 / (1 << 20) as f64 / took.as_secs_f64();
    let versus = raw.map_or_else(|| "".into(), |raw| format!("{:.0} %", rate / raw * 100.0));
    let requests = requests.map_or_else(String::new, |n| n.to_string());
    println!(
        "| {what} | {:.0} ms | {rate:.0} | {versus} | {:.1} MiB | {requests} |",
        took.as_secs_f64() * 1000.0,
        peak_mib()
    );
    rate
}
