//! File sync through the loaded CreateOS provider against the simulator,
//! beside raw `PUT`/`GET /files` of the same bytes. Prints one table.
//!
//! - 256 MiB in and out: the provider's `sync_files` in and out of one file
//!   against a raw streamed `PUT`/`GET` (reqwest, the same 256 KiB reads
//!   from disk), alternating, nine of each (every round to new files), with
//!   the ratios of the medians' and of the best
//!   throughputs and the process's highest peak RSS during
//!   each transfer (reset before each with `/proc/self/clear_refs`, after a
//!   `sync` so that no transfer pays for the previous one's writeback; the
//!   simulator runs in this process too, so the figure is host and
//!   simulator together: an upper bound for the host).
//! - The sandbox side of a transfer is a rename (inbound `mv` of the scratch
//!   file) or a hard link (outbound `ln`): the simulator's sandbox is one
//!   filesystem, as a real one is, so neither copies the bytes.
//! - 10,000 small files in 100 directories, in and out: time and the API
//!   requests each operation sent (a constant, not one per file).

use e2e::bed::Bed;
use futures_util::StreamExt;
use provider_abi::{Lease, Provider, SyncDirection, SyncParams};
use provider_host::wait;
use serde_json::{json, Value};
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

const BIG: u64 = 256 << 20;
const SMALL_FILES: usize = 10_000;
/// Transfers of each kind of the 256 MiB file; the median and the best are
/// reported.
const ROUNDS: usize = 9;

fn main() {
    let bed = Bed::new();
    let config = bed.config(json!({"timeoutMs": 600_000}));
    let lease = bed.acquire(&config);
    let id = lease.provider_lease_id.as_ref().unwrap().to_string();
    let host = tempfile::tempdir().unwrap();
    // Two worker threads, as the provider's own runtime has: the connection
    // reads the socket while a chunk is written to disk.
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let http = reqwest::Client::new();

    let big = host.path().join("big.bin");
    write_big(&big);
    println!("| what (every time) | time: median / best | MiB/s: median / best | vs raw: median / best | peak RSS | requests |");
    println!("|---|---|---|---|---|---|");

    // Raw and provider transfers alternate, ROUNDS times, and each is
    // reported by its median: on a shared machine a single transfer may pay
    // for a neighbour's burst (or a cold page cache), which the median drops.
    let raw_target = host.path().join("raw-back.bin");
    let back = host.path().join("back.bin");
    let [mut raw_in, mut sync_in, mut raw_out, mut sync_out] = [(); 4].map(|()| Samples::default());
    for _ in 0..ROUNDS {
        raw_in.measure(&bed, || runtime.block_on(raw_put(&http, &bed, &id, &big)));
        sync_in.measure(&bed, || {
            sync(&bed, &config, &lease, true, "file", path(&big), "/paperclip-workspace/big.bin")
        });
        raw_out.measure(&bed, || runtime.block_on(raw_get(&http, &bed, &id, &raw_target)));
        std::fs::remove_file(&raw_target).unwrap();
        sync_out.measure(&bed, || {
            sync(&bed, &config, &lease, false, "file", "/paperclip-workspace/big.bin", path(&back))
        });
        assert_eq!(std::fs::metadata(&back).unwrap().len(), BIG);
        std::fs::remove_file(&back).unwrap();
        // Every round writes new files: an overwrite would free the old
        // 256 MiB inside one measurement or the other.
        let remove = ["-f", "/paperclip-workspace/raw.bin", "/paperclip-workspace/big.bin"];
        let removed = bed.execute(&bed.command(&config, &lease, "/bin/rm", &remove)).0.unwrap();
        assert_eq!(removed.exit_code.into_option(), Some(0));
    }
    let raw_in = raw_in.report("raw PUT 256 MiB", BIG, None);
    sync_in.report("sync_in 256 MiB", BIG, Some(raw_in));
    let raw_out = raw_out.report("raw GET 256 MiB", BIG, None);
    sync_out.report("sync_out 256 MiB", BIG, Some(raw_out));
    std::fs::remove_file(&big).unwrap();

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
    let direction = if inbound { SyncDirection::In } else { SyncDirection::Out };
    let params =
        SyncParams::single(bed.lease_params(config, lease), direction, "bench", kind, source, target);
    let result = wait(bed.provider.sync_files(params));
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

/// Starts a measurement: writes back every dirty page first (`sync`), so
/// no transfer pays for the previous one's writeback, and resets the peak
/// resident set size (`VmHWM`).
fn reset_peak() {
    assert!(std::process::Command::new("sync").status().unwrap().success());
    std::fs::write("/proc/self/clear_refs", "5").unwrap();
}

/// The peak resident set size since the last reset, in MiB.
fn peak_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|line| line.starts_with("VmHWM:")).unwrap();
    let kib: f64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib / 1024.0
}

/// Transfers of one kind: times, the highest peak RSS, the requests of the
/// last one.
#[derive(Default)]
struct Samples {
    times: Vec<Duration>,
    peak_mib: f64,
    requests: usize,
}

impl Samples {
    fn measure(&mut self, bed: &Bed, transfer: impl FnOnce()) {
        reset_peak();
        let before = bed.ledger().requests.len();
        let started = Instant::now();
        transfer();
        self.times.push(started.elapsed());
        self.requests = bed.ledger().requests.len() - before;
        self.peak_mib = self.peak_mib.max(peak_mib());
    }

    /// Prints the row of the median and of the best (the least disturbed
    /// on a shared machine), with every time measured; returns both
    /// throughputs in MiB/s.
    fn report(mut self, what: &str, bytes: u64, raw: Option<(f64, f64)>) -> (f64, f64) {
        let all: Vec<String> = self.times.iter().map(|t| format!("{}", t.as_millis())).collect();
        self.times.sort();
        let rate = |took: Duration| bytes as f64 / (1 << 20) as f64 / took.as_secs_f64();
        let (median, best) = (self.times[self.times.len() / 2], self.times[0]);
        let rates = (rate(median), rate(best));
        let versus = raw.map_or_else(
            || "".into(),
            |raw| format!("{:.0} % / {:.0} %", rates.0 / raw.0 * 100.0, rates.1 / raw.1 * 100.0),
        );
        println!(
            "| {what} ({} ms) | {:.0} ms / {:.0} ms | {:.0} / {:.0} | {versus} | {:.1} MiB | {} |",
            all.join(", "),
            median.as_secs_f64() * 1000.0,
            best.as_secs_f64() * 1000.0,
            rates.0,
            rates.1,
            self.peak_mib,
            self.requests
        );
        rates
    }
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
