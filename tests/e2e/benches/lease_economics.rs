//! Lease economics: the loaded CreateOS provider against the simulator,
//! beside what the reference design would do. Prints three tables.
//!
//! The reference model: the same calls as ours, except that a transition
//! (create, pause, resume) reads the state once and then polls it every
//! 250 ms. A phase lasting `D` ms from its submission therefore costs
//! `1 + ⌈D / 250⌉` state reads (`GET /sandboxes/{id}`) and is noticed
//! `⌈D / 250⌉ · 250 − D` ms after it completes (zero request latency).
//!
//! 1. Requests per lifecycle step, counted by the simulator's ledger
//!    (transitions of its default 50 ms): reference = ours − our state reads
//!    + the reference's state reads.
//! 2. Detection delay for transitions of 100 ms, 500 ms and 2 s: from the
//!    instant the simulator completed a phase to the arrival of the first
//!    state read after it (both recorded in the ledger). "ours schedule" is
//!    the learnt schedule's model (`transition::model`) over the same number
//!    of phases from no history, with zero request latency.
//! 3. Budget use under sustained load: lifecycle loops against the real
//!    300/min limit for 40 s; the requests the simulator received per minute
//!    between 5 s and 35 s, as a share of 300, and the 429s.

use createos_provider::transition::{model, REFERENCE_POLL_MS};
use createos_sim::{path_matches, Ledger, RateLimit, RequestRecord, SimConfig};
use e2e::bed::Bed;
use provider_abi::{Lease, LeaseParams, Provider};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// Lifecycles measured per transition duration.
const REPEATS: usize = 5;

fn main() {
    requests_per_step();
    detection_delay();
    budget_use();
}

/// A lifecycle step: its name, how many transition phases it waits for, and
/// what it does.
type Step = (&'static str, u64, fn(&Bed, &Value, &mut Lease));

const STEPS: &[Step] = &[
    ("acquire", 1, |bed, config, lease| *lease = bed.acquire(config)),
    ("execute", 0, |bed, config, lease| {
        let (result, _) = bed.execute(&bed.command(config, lease, "/bin/echo", &["hello"]));
        let result = result.unwrap();
        assert_eq!((result.exit_code.into_option(), result.stdout.as_str()), (Some(0), "hello\n"));
    }),
    ("release (pause)", 1, |bed, config, lease| {
        bed.provider.release_lease(&params(bed, config, lease)).unwrap()
    }),
    ("resume", 1, |bed, config, lease| {
        assert!(!bed.provider.resume_lease(&params(bed, config, lease)).unwrap().expired);
    }),
    ("destroy", 0, |bed, config, lease| bed.provider.destroy_lease(&params(bed, config, lease)).unwrap()),
];

fn params(bed: &Bed, config: &Value, lease: &Lease) -> LeaseParams {
    bed.lease_params(config, lease)
}

/// `GET /v1/sandboxes/{id}`: a state read.
fn is_state_read(request: &RequestRecord) -> bool {
    request.method == "GET" && path_matches("/v1/sandboxes/*", &request.path)
}

/// State reads the reference spends on `phases` transitions of `delay`.
fn reference_reads(phases: u64, delay: Duration) -> u64 {
    phases * (1 + (delay.as_millis() as u64).div_ceil(REFERENCE_POLL_MS))
}

fn requests_per_step() {
    let bed = Bed::new();
    let delay = SimConfig::default().pause_delay;
    let config = bed.config(json!({"reuseLease": true}));
    let mut totals = vec![(0usize, 0usize); STEPS.len()];
    for _ in 0..REPEATS {
        let mut lease = Lease::default();
        for ((_, _, step), (requests, reads)) in STEPS.iter().zip(&mut totals) {
            let before = bed.ledger().requests.len();
            step(&bed, &config, &mut lease);
            let ledger = bed.ledger();
            let new = &ledger.requests[before..];
            *requests += new.len();
            *reads += new.iter().filter(|r| is_state_read(r)).count();
        }
    }
    let mut rows = Vec::new();
    let (mut ours_sum, mut reference_sum) = (0.0, 0.0);
    for ((name, phases, _), (requests, reads)) in STEPS.iter().zip(&totals) {
        let ours = *requests as f64 / REPEATS as f64;
        let ours_reads = *reads as f64 / REPEATS as f64;
        let reference = ours - ours_reads + reference_reads(*phases, delay) as f64;
        ours_sum += ours;
        reference_sum += reference;
        rows.push(vec![
            name.to_string(),
            format!("{ours:.1}"),
            format!("{ours_reads:.1}"),
            format!("{reference:.1}"),
            format!("{:.2}", ours / reference),
        ]);
    }
    rows.push(vec![
        "lifecycle".into(),
        format!("{ours_sum:.1}"),
        String::new(),
        format!("{reference_sum:.1}"),
        format!("{:.2}", ours_sum / reference_sum),
    ]);
    println!("\nAPI requests per lifecycle step (transitions {delay:?}, mean of {REPEATS} lifecycles)");
    print_table(&["step", "ours", "of which state reads", "reference", "ours/reference"], &rows);
}

/// One transition phase as the ledger saw it.
struct Phase {
    name: &'static str,
    /// From completion to the first state read after it.
    delay: Duration,
    /// State reads after the submission, up to and including that one.
    polls: usize,
}

fn phases(ledger: &Ledger) -> Vec<Phase> {
    let mut seen = std::collections::HashSet::new();
    ledger
        .transitions
        .iter()
        .map(|t| {
            let name = match t.to.as_str() {
                "paused" => "pause",
                _ if seen.insert(t.sandbox_id.clone()) => "create",
                _ => "resume",
            };
            let path = format!("/v1/sandboxes/{}", t.sandbox_id);
            let reads: Vec<Instant> = ledger
                .requests
                .iter()
                .filter(|r| is_state_read(r) && r.path == path && r.received_at > t.began_at)
                .map(|r| r.received_at)
                .collect();
            let detected = reads.iter().position(|at| *at >= t.completed_at).expect("the provider noticed");
            Phase { name, delay: reads[detected] - t.completed_at, polls: detected + 1 }
        })
        .collect()
}

fn detection_delay() {
    let mut rows = Vec::new();
    for delay_ms in [100, 500, 2_000] {
        let delay = Duration::from_millis(delay_ms);
        let sim = SimConfig {
            rate_limit: None,
            create_delay: delay,
            pause_delay: delay,
            resume_delay: delay,
            ..SimConfig::default()
        };
        let bed = Bed::with(sim);
        let config = bed.config(json!({"reuseLease": true}));
        for _ in 0..REPEATS {
            let mut lease = Lease::default();
            for (name, _, step) in STEPS {
                if *name != "execute" {
                    step(&bed, &config, &mut lease);
                }
            }
        }
        let phases = phases(&bed.ledger());
        let reference_delay = delay_ms.div_ceil(REFERENCE_POLL_MS) * REFERENCE_POLL_MS - delay_ms;
        for name in ["create", "pause", "resume"] {
            let of: Vec<&Phase> = phases.iter().filter(|p| p.name == name).collect();
            let mean = of.iter().map(|p| p.delay).sum::<Duration>() / of.len() as u32;
            let max = of.iter().map(|p| p.delay).max().unwrap_or_default();
            let polls = of.iter().map(|p| p.polls).sum::<usize>() as f64 / of.len() as f64;
            // A create is read at once after its submission; a pause or
            // resume was read just before it.
            let reference_polls = delay_ms.div_ceil(REFERENCE_POLL_MS) + u64::from(name == "create");
            rows.push(vec![
                format!("{delay_ms} ms"),
                name.to_string(),
                format!("{:.1}", ms(mean)),
                format!("{:.1}", ms(max)),
                format!("{:.0}", ms(schedule_delay(delay))),
                format!("{reference_delay}"),
                format!("{polls:.1}"),
                format!("{reference_polls}"),
                format!("{:.2}", polls / reference_polls as f64),
            ]);
        }
    }
    println!(
        "\nTransition completion to detection ({REPEATS} per row; schedule and reference: zero request latency)"
    );
    print_table(
        &[
            "duration",
            "phase",
            "ours mean ms",
            "ours max ms",
            "ours schedule ms",
            "reference ms",
            "ours polls",
            "reference polls",
            "polls ours/ref",
        ],
        &rows,
    );
}

/// Our learnt schedule's mean detection delay (zero request latency) over
/// `REPEATS` phases of `delay` on fresh estimates, as the bench's phases of
/// one kind are (each bed is a new API origin).
fn schedule_delay(delay: Duration) -> Duration {
    let phases = model(std::iter::repeat_n(delay, REPEATS));
    phases.iter().map(|(_, late)| *late).sum::<Duration>() / REPEATS as u32
}

/// How long the loops start new lifecycles.
const LOAD_RUN: Duration = Duration::from_secs(40);
/// Cut from both ends of the run.
const LOAD_EDGE: Duration = Duration::from_secs(5);
/// Concurrent lifecycle loops: enough that a request is always waiting.
const LOAD_LOOPS: usize = 8;

fn budget_use() {
    let limit = RateLimit::createos_default();
    let bed = Bed::with(SimConfig { rate_limit: Some(limit), ..SimConfig::default() });
    let config =
        bed.config(json!({"requestsPerMinute": limit.requests, "reuseLease": true, "timeoutMs": 300_000}));
    let started = Instant::now();
    let lifecycles: usize = std::thread::scope(|scope| {
        let loops: Vec<_> = (0..LOAD_LOOPS)
            .map(|_| {
                scope.spawn(|| {
                    let mut completed = 0;
                    while started.elapsed() < LOAD_RUN {
                        let mut lease = Lease::default();
                        for (name, _, step) in STEPS {
                            if *name != "execute" {
                                step(&bed, &config, &mut lease);
                            }
                        }
                        completed += 1;
                    }
                    completed
                })
            })
            .collect();
        loops.into_iter().map(|handle| handle.join().unwrap()).sum()
    });
    let drained = started.elapsed();
    let ledger = bed.ledger();
    let (from, to) = (started + LOAD_EDGE, started + LOAD_RUN - LOAD_EDGE);
    let steady = ledger.requests.iter().filter(|r| r.received_at >= from && r.received_at < to).count();
    let per_minute = steady as f64 * 60.0 / (to - from).as_secs_f64();
    let share = per_minute / f64::from(limit.requests);
    let rows = vec![
        vec!["loops".into(), LOAD_LOOPS.to_string()],
        vec!["lifecycles completed".into(), lifecycles.to_string()],
        vec!["run, with the last lifecycles' drain".into(), format!("{:.1} s", drained.as_secs_f64())],
        vec!["requests in total".into(), ledger.requests.len().to_string()],
        vec![
            format!("requests {}–{} s", LOAD_EDGE.as_secs(), (LOAD_RUN - LOAD_EDGE).as_secs()),
            steady.to_string(),
        ],
        vec!["requests per minute".into(), format!("{per_minute:.1}")],
        vec![format!("share of {}/min", limit.requests), format!("{share:.3}")],
        vec!["reference share (300 ms spacing)".into(), format!("{:.3}", 200.0 / f64::from(limit.requests))],
        vec!["ours/reference".into(), format!("{:.2}", per_minute / 200.0)],
        vec!["429 answers".into(), ledger.count_status(429).to_string()],
        vec!["sandboxes leaked".into(), ledger.leaked().len().to_string()],
    ];
    println!("\nBudget use under sustained load ({}/min limit, {:?} run)", limit.requests, LOAD_RUN);
    print_table(&["measure", "value"], &rows);
    assert_eq!(ledger.count_status(429), 0, "a well-behaved client never sees a 429");
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e3
}

/// Prints `rows` under `headers`, columns aligned, numbers to the right.
fn print_table(headers: &[&str], rows: &[Vec<String>]) {
    let widths: Vec<usize> = (0..headers.len())
        .map(|i| rows.iter().map(|row| row[i].chars().count()).chain([headers[i].len()]).max().unwrap_or(0))
        .collect();
    let line = |cells: Vec<&str>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .enumerate()
            .map(
                |(i, (cell, width))| {
                    if i == 0 {
                        format!("{cell:<width$}")
                    } else {
                        format!("{cell:>width$}")
                    }
                },
            )
            .collect();
        println!("| {} |", padded.join(" | "));
    };
    line(headers.to_vec());
    println!("|{}|", widths.iter().map(|w| "-".repeat(w + 2)).collect::<Vec<_>>().join("|"));
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
}
