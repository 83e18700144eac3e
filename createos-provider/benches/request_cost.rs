//! CPU per HTTP request: the CreateOS client's path (request gate, pacer,
//! request building, reply checks, JSON) against a bare `reqwest` request
//! of the same `GET /v1/sandboxes/{id}` to the same loopback fake of the
//! API, both on the same HTTP client settings.
//!
//! The fake answers from a process of its own (this binary with
//! `--serve`), so this process's CPU time is everything the clients spend.
//! The clients run on a current-thread tokio runtime on this thread, or
//! with `--multi-thread` on a runtime shaped like the provider's (two
//! worker threads, this thread awaiting the work as a host awaits a hook).
//! Rounds alternate bare and provider and print each round's ratio, and the
//! bare request on a new connection each time (a client keeping no idle
//! connection): what a connection the pool did not keep costs.
//!
//!   cargo bench -p createos-provider --bench request_cost -- [REQUESTS] [ROUNDS] [IN_FLIGHT] [--multi-thread]
//!   (defaults 4000 5 1)

use std::sync::Arc;
use std::time::Duration;

use axum::extract::Path;
use axum::routing::get;
use createos_provider::client::{build_http_client, CallOptions, CreateosClient};
use createos_provider::config::Secret;
use createos_provider::pacer::{Pacer, Priority};
use createos_provider::transition::Lifecycle;
use tokio::time::Instant;
use url::Url;

const KEY: &str = "bench-key-0123456789abcdef";
const SANDBOX: &str = "sb-0123456789abcdef";

/// Serves the fake on loopback and prints its address; never returns.
fn serve() -> ! {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async move {
        let app = axum::Router::new().route(
            "/v1/sandboxes/{id}",
            get(|Path(id): Path<String>| async move {
                axum::Json(serde_json::json!({
                    "status": "success",
                    "data": {"id": id, "status": "running", "shape": "s-1vcpu-1gb", "region": "eu"}
                }))
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        println!("{}", listener.local_addr().unwrap());
        axum::serve(listener, app).await.unwrap();
    });
    std::process::exit(0)
}

/// Starts the fake as a child process; returns it and its origin.
fn spawn_fake() -> (std::process::Child, Url) {
    use std::io::BufRead;
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .arg("--serve")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    (child, Url::parse(&format!("http://{}", line.trim())).unwrap())
}

/// This process's CPU time, user and system.
fn process_cpu() -> Duration {
    // SAFETY: `rusage` is plain integers, for which all zeroes is valid.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `usage` is a valid rusage to write into.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    assert_eq!(rc, 0, "getrusage");
    let time = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    time(usage.ru_utime) + time(usage.ru_stime)
}

/// Runs `requests` calls of `one`, `in_flight` at a time as tasks of the
/// current runtime; returns the CPU per request in µs.
async fn cost<F, Fut>(requests: usize, in_flight: usize, one: F) -> f64
where
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let start = process_cpu();
    let tasks: Vec<_> = (0..in_flight)
        .map(|_| {
            let one = one.clone();
            tokio::spawn(async move {
                for _ in 0..requests / in_flight {
                    one().await;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    (process_cpu() - start).as_secs_f64() * 1e6 / (requests / in_flight * in_flight) as f64
}

fn main() {
    let flags: Vec<String> = std::env::args().skip(1).collect();
    if flags.iter().any(|flag| flag == "--serve") {
        serve();
    }
    let multi_thread = flags.iter().any(|flag| flag == "--multi-thread");
    let args: Vec<usize> = flags.iter().filter_map(|a| a.parse().ok()).collect();
    let requests = args.first().copied().unwrap_or(4000);
    let rounds = args.get(1).copied().unwrap_or(5);
    let in_flight = args.get(2).copied().unwrap_or(1).max(1);
    let (mut fake, origin) = spawn_fake();
    let runtime = if multi_thread {
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
    } else {
        tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
    };
    runtime.block_on(async {
        let http = build_http_client().unwrap();
        let client = Arc::new(
            CreateosClient::with_pacer(&origin, &Secret::new(KEY), http.clone(), Arc::new(Pacer::new(1_000_000_000)))
                .unwrap(),
        );
        let url = format!("{origin}v1/sandboxes/{SANDBOX}");
        // The bare request on a new connection each time: what a
        // connection the pool did not keep costs.
        let unpooled = reqwest::Client::builder().pool_max_idle_per_host(0).build().unwrap();
        let fresh = {
            let url = url.clone();
            move || {
                let (http, url) = (unpooled.clone(), url.clone());
                async move {
                    let resp = http.get(&url).header("X-Api-Key", KEY).send().await.unwrap();
                    assert!(resp.status().is_success());
                    assert!(!resp.bytes().await.unwrap().is_empty());
                }
            }
        };
        let bare = move || {
            let (http, url) = (http.clone(), url.clone());
            async move {
                let resp = http.get(&url).header("X-Api-Key", KEY).send().await.unwrap();
                assert!(resp.status().is_success());
                let body = resp.bytes().await.unwrap();
                assert!(!body.is_empty());
            }
        };
        let provider = move || {
            let client = client.clone();
            async move {
                let opts = CallOptions::new(Instant::now() + Duration::from_secs(60), Priority::InFlight);
                client.get_sandbox(SANDBOX, opts).await.unwrap();
            }
        };
        // Warm both: connections open, allocator and caches settled.
        cost(200.min(requests), in_flight, bare.clone()).await;
        cost(200.min(requests), in_flight, provider.clone()).await;
        let mut ratios = Vec::new();
        for round in 1..=rounds {
            let b = cost(requests, in_flight, bare.clone()).await;
            let p = cost(requests, in_flight, provider.clone()).await;
            let f = cost(requests / 4, in_flight, fresh.clone()).await;
            ratios.push(p / b);
            println!(
                "round {round}: bare reqwest {b:.1} µs/request, provider client {p:.1} µs/request, ratio {:.2}; \
                 bare on a new connection each {f:.1} µs/request",
                p / b
            );
        }
        ratios.sort_by(f64::total_cmp);
        println!(
            "{requests} requests x {rounds} rounds, {in_flight} in flight, {} runtime: ratio median {:.2} (spread {:.2} to {:.2})",
            if multi_thread { "2-worker" } else { "current-thread" },
            ratios[ratios.len() / 2],
            ratios[0],
            ratios[ratios.len() - 1]
        );
    });
    fake.kill().unwrap();
    fake.wait().unwrap();
}
