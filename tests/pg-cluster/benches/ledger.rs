//! Ledger cost per lifecycle step, SQLite against PostgreSQL, in one run:
//! the latency each step's ledger work adds to its hook (one host, one
//! lifecycle at a time), and the writes per second the store sustains with
//! many lifecycles at once. Both stores are durable: SQLite in WAL mode with
//! `synchronous = FULL`, PostgreSQL (a private cluster on a Unix socket)
//! with `fsync` and `synchronous_commit` on.
//!
//! `cargo bench -p pg-cluster --bench ledger [-- LIFECYCLES THREADS]`

use pg_cluster::PgCluster;
use provider_abi::Lease;
use provider_host::{
    store::postgres::{PgLedger, PgOptions},
    store::sqlite::Ledger,
    store::LeaseStore,
    store::{LeaseEnv, LeaseState, Owner},
};
use std::time::{Duration, Instant};

/// A lifecycle's ledger work, step by step, as `host::Host` does it.
const STEPS: [(&str, usize); 5] =
    [("acquire", 3), ("execute", 0), ("release", 2), ("resume", 2), ("destroy", 2)];

fn env() -> LeaseEnv {
    LeaseEnv {
        driver_key: "createos".into(),
        company_id: "acme".into(),
        environment_id: "dev".into(),
        config: serde_json::json!({"shape": "s-1vcpu-1gb", "reuseLease": true}),
        api_in_process: false,
    }
}

/// Runs step `step` of a lifecycle on `row` (`None`: acquire begins it).
fn step(store: &dyn LeaseStore, step: &str, row: Option<i64>, lease: &Lease) -> i64 {
    match (step, row) {
        ("acquire", None) => {
            let row = store.begin(Owner::Lifecycle, "bench", &env(), "acquire_lease").unwrap();
            store.set_lease(row, LeaseState::Acquiring, "acquire_lease", lease).unwrap();
            store.set_lease(row, LeaseState::Active, "acquire_lease", lease).unwrap();
            row
        }
        (_, Some(row)) => {
            // Every hook on a held lease reads its state first (the unconfirmed check).
            store.get(row).unwrap();
            match step {
                "release" => {
                    store.set_state(row, LeaseState::Releasing, "release_lease", None).unwrap();
                    store.set_state(row, LeaseState::Paused, "release_lease", None).unwrap();
                }
                "resume" => {
                    store.set_state(row, LeaseState::Active, "resume_lease", None).unwrap();
                    store.set_lease(row, LeaseState::Active, "resume_lease", lease).unwrap();
                }
                "destroy" => {
                    store.set_state(row, LeaseState::Destroying, "destroy_lease", None).unwrap();
                    store.set_state(row, LeaseState::Destroyed, "destroy_lease", None).unwrap();
                }
                _ => {}
            }
            row
        }
        _ => unreachable!(),
    }
}

fn lifecycle(store: &dyn LeaseStore, index: usize, mut timed: impl FnMut(usize, Duration)) {
    let lease = Lease {
        provider_lease_id: Some(format!("sb-{index}").into()).into(),
        metadata_json: r#"{"marker":"00000000-0000-0000-0000-000000000000"}"#.into(),
        ..Default::default()
    };
    let mut row = None;
    for (at, (name, _)) in STEPS.iter().enumerate() {
        let started = Instant::now();
        row = Some(step(store, name, row, &lease));
        timed(at, started.elapsed());
    }
}

struct Figures {
    /// Per step: median and 99th percentile latency, one lifecycle at a time.
    latency: Vec<(Duration, Duration)>,
    /// Writes per second with `threads` lifecycles at once.
    writes_per_s: f64,
}

fn measure(store: &dyn LeaseStore, lifecycles: usize, threads: usize) -> Figures {
    let mut samples = vec![Vec::with_capacity(lifecycles); STEPS.len()];
    for index in 0..lifecycles {
        lifecycle(store, index, |at, took| samples[at].push(took));
    }
    let latency = samples
        .iter_mut()
        .map(|values| {
            values.sort();
            (values[values.len() / 2], values[(values.len() * 99 / 100).min(values.len() - 1)])
        })
        .collect();
    let started = Instant::now();
    std::thread::scope(|scope| {
        for thread in 0..threads {
            scope.spawn(move || {
                for index in 0..lifecycles {
                    lifecycle(store, thread * lifecycles + index, |_, _| {});
                }
            });
        }
    });
    let writes: usize = STEPS.iter().map(|(_, writes)| writes).sum();
    let writes_per_s = (threads * lifecycles * writes) as f64 / started.elapsed().as_secs_f64();
    Figures { latency, writes_per_s }
}

fn ms(duration: Duration) -> String {
    format!("{:.2} ms", duration.as_secs_f64() * 1e3)
}

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|arg| arg.parse().ok()).collect();
    let lifecycles = args.first().copied().unwrap_or(200);
    let threads = args.get(1).copied().unwrap_or(8);
    let dir = tempfile::tempdir().unwrap();
    let sqlite = Ledger::open(&dir.path().join("ledger.sqlite3")).unwrap();
    let cluster = PgCluster::start(true).unwrap_or_else(|error| panic!("cannot start PostgreSQL: {error}"));
    let url = cluster.create_database("bench");
    let postgres = PgLedger::open(
        &url,
        &PgOptions { heartbeat_expiry: Duration::from_secs(30), pool_size: threads as u32 },
    )
    .unwrap();
    let sqlite_figures = measure(&sqlite, lifecycles, threads);
    let postgres_figures = measure(&postgres, lifecycles, threads);
    println!(
        "ledger work per lifecycle step, p50 / p99 over {lifecycles} lifecycles one at a time (the latency it adds to the hook):"
    );
    println!("{:<10} {:>7} {:>22} {:>22} {:>8}", "step", "writes", "SQLite", "PostgreSQL", "ratio");
    for (at, (name, writes)) in STEPS.iter().enumerate() {
        let (s50, s99) = sqlite_figures.latency[at];
        let (p50, p99) = postgres_figures.latency[at];
        println!(
            "{name:<10} {writes:>7} {:>22} {:>22} {:>7.2}x",
            format!("{} / {}", ms(s50), ms(s99)),
            format!("{} / {}", ms(p50), ms(p99)),
            p50.as_secs_f64() / s50.as_secs_f64()
        );
    }
    println!(
        "writes per second, {threads} threads x {lifecycles} lifecycles: SQLite {:.0}, PostgreSQL {:.0} ({:.2}x)",
        sqlite_figures.writes_per_s,
        postgres_figures.writes_per_s,
        postgres_figures.writes_per_s / sqlite_figures.writes_per_s
    );
}
