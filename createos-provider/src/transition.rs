//! Driving a sandbox to `running` or `paused`.
//!
//! The rules (`createos-api.md`): read the state; if it already is the
//! desired one, post nothing; while it is in flight (`creating`, `pausing`,
//! `resuming`) poll; submit pause only from `running`, resume only from
//! `paused` or `error`, at most once per transition (a 409 answer counts as
//! the submission and is reconciled by reading the state at once); any other
//! state ends the transition with "CreateOS sandbox did not reach <desired>."
//! Everything is bounded by the deadline (`Timeout`, label
//! `sandbox lifecycle`).
//!
//! Outcomes a caller can tell apart:
//! - `Ok(())`: the sandbox is in the desired state;
//! - [`Error::is_not_found`]: the sandbox does not exist (404);
//! - [`Error::is_terminal_state`]: it ended `destroyed` or `failed` (for
//!   resume: the lease expired); [`Error::sandbox_state`] gives the state;
//! - anything else (5xx, connection, timeout): transient, never an expiry.
//!
//! # Poll schedule
//!
//! After the first read (and after each accepted submission) the waits
//! between polls are [`POLL_DELAYS_MS`], then [`STEADY_POLL_MS`] forever:
//! polls at 25, 75, 150, 250 ms, then every 250 ms up to 2 s, then every
//! 300 ms. The reference polled every 250 ms. For a transition lasting `D`:
//! - up to 2 s, completion is noticed no later than the reference, and
//!   3-10× sooner below 150 ms (at 25/75/150 ms instead of 250 ms);
//! - polls never exceed the reference's `⌈D / 250 ms⌉` by more than 3 (the
//!   three early polls), and beyond 6.25 s never more (300 vs 250 ms
//!   spacing: 205 instead of 240 polls for a 60 s transition).

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use crate::client::{CallOptions, CreateosClient, SandboxState, SandboxStatus};
pub use crate::error::SandboxTarget as Desired;
use crate::error::{op, Error};
use crate::pacer::Priority;

/// Waits between polls at the start of an in-flight phase, in ms.
pub const POLL_DELAYS_MS: &[u64] = &[25, 50, 75, 100, 250, 250, 250, 250, 250, 250, 250];
/// Wait between polls once [`POLL_DELAYS_MS`] is used up, in ms.
pub const STEADY_POLL_MS: u64 = 300;
/// The reference's fixed poll interval, in ms (for comparison).
pub const REFERENCE_POLL_MS: u64 = 250;

/// The wait before the `n`-th poll (0-based) of an in-flight phase.
pub fn poll_delay(n: usize) -> Duration {
    Duration::from_millis(POLL_DELAYS_MS.get(n).copied().unwrap_or(STEADY_POLL_MS))
}

/// The sandbox calls a transition needs (implemented by [`CreateosClient`];
/// a trait so the state machine can be tested on simulated time).
pub trait Lifecycle {
    /// `GET /sandboxes/{id}`.
    fn get_sandbox(
        &self,
        id: &str,
        opts: CallOptions,
    ) -> impl Future<Output = Result<SandboxState, Error>> + Send;
    /// `POST /sandboxes/{id}/pause`.
    fn pause(&self, id: &str, opts: CallOptions) -> impl Future<Output = Result<(), Error>> + Send;
    /// `POST /sandboxes/{id}/resume`.
    fn resume(&self, id: &str, opts: CallOptions) -> impl Future<Output = Result<(), Error>> + Send;
}

impl Lifecycle for CreateosClient {
    fn get_sandbox(
        &self,
        id: &str,
        opts: CallOptions,
    ) -> impl Future<Output = Result<SandboxState, Error>> + Send {
        CreateosClient::get_sandbox(self, id, opts)
    }

    fn pause(&self, id: &str, opts: CallOptions) -> impl Future<Output = Result<(), Error>> + Send {
        CreateosClient::pause(self, id, opts)
    }

    fn resume(&self, id: &str, opts: CallOptions) -> impl Future<Output = Result<(), Error>> + Send {
        CreateosClient::resume(self, id, opts)
    }
}

/// Drives sandbox `id` to `desired` before `deadline`, with requests at
/// [`Priority::InFlight`].
pub async fn transition<C: Lifecycle>(
    client: &C,
    id: &str,
    desired: Desired,
    deadline: Instant,
) -> Result<(), Error> {
    transition_with_priority(client, id, desired, deadline, Priority::InFlight).await
}

/// [`transition`] with an explicit pacer priority (e.g. `Cleanup` for the
/// pause of a release).
pub async fn transition_with_priority<C: Lifecycle>(
    client: &C,
    id: &str,
    desired: Desired,
    deadline: Instant,
    priority: Priority,
) -> Result<(), Error> {
    let opts = CallOptions::new(deadline, priority);
    let target = match desired {
        Desired::Running => SandboxStatus::Running,
        Desired::Paused => SandboxStatus::Paused,
    };
    let mut submitted = false;
    let mut polls = 0;
    loop {
        let status = client.get_sandbox(id, opts).await?.status;
        if status == target {
            return Ok(());
        }
        if status.is_in_flight() {
            wait(poll_delay(polls), deadline).await?;
            polls += 1;
            continue;
        }
        let may_submit = !submitted
            && match desired {
                Desired::Paused => status == SandboxStatus::Running,
                Desired::Running => {
                    matches!(status, SandboxStatus::Paused | SandboxStatus::Error)
                }
            };
        if !may_submit {
            return Err(Error::did_not_reach(desired, status.as_str()));
        }
        submitted = true;
        let submit = match desired {
            Desired::Paused => client.pause(id, opts).await,
            Desired::Running => client.resume(id, opts).await,
        };
        match submit {
            Ok(()) => {
                // Accepted is not done: the state is in flight now.
                polls = 0;
                wait(poll_delay(polls), deadline).await?;
                polls += 1;
            }
            // A transition is under way: reconcile by reading the state.
            Err(e) if e.http_status() == Some(409) => polls = 0,
            Err(e) => return Err(e),
        }
    }
}

async fn wait(delay: Duration, deadline: Instant) -> Result<(), Error> {
    let until = Instant::now() + delay;
    if until >= deadline {
        tokio::time::sleep_until(deadline).await;
        return Err(Error::timeout(op::SANDBOX_LIFECYCLE));
    }
    tokio::time::sleep_until(until).await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;
    use std::collections::VecDeque;
    use std::sync::Mutex;

    /// Poll times (ms after the phase starts) of the schedule.
    fn schedule_offsets(until_ms: u64) -> Vec<u64> {
        let mut t = 0;
        let mut out = Vec::new();
        for n in 0.. {
            t += poll_delay(n).as_millis() as u64;
            out.push(t);
            if t >= until_ms {
                break;
            }
        }
        out
    }

    #[test]
    fn schedule_beats_the_reference() {
        let offsets = schedule_offsets(70_000);
        assert_eq!(&offsets[..5], &[25, 75, 150, 250, 500]);
        for d in 1..=60_000u64 {
            // Polls needed to notice a transition that takes `d` ms.
            let mine = offsets.iter().position(|&t| t >= d).unwrap() as u64 + 1;
            let detect = offsets[mine as usize - 1];
            let reference = d.div_ceil(REFERENCE_POLL_MS);
            let reference_detect = reference * REFERENCE_POLL_MS;
            assert!(mine <= reference + 3, "{d} ms: {mine} polls vs {reference}");
            if d <= 2_000 {
                assert!(detect <= reference_detect, "{d} ms");
            }
            if d <= 150 {
                assert!(detect < reference_detect, "{d} ms");
            }
            if d > 6_250 {
                assert!(mine <= reference, "{d} ms: {mine} polls vs {reference}");
            }
        }
        let at_60s = offsets.iter().position(|&t| t >= 60_000).unwrap() + 1;
        assert_eq!(at_60s, 205);
    }

    /// A reply to a submission and the states that follow (ms after it).
    type Submit = (Result<(), Error>, Vec<(u64, &'static str)>);

    /// A simulated sandbox on tokio's paused clock.
    struct Fake {
        t0: Instant,
        /// (ms since t0, state): the state at t is the last entry at or before t.
        timeline: Mutex<Vec<(u64, &'static str)>>,
        /// Replies to submissions and the states that follow (ms after it).
        submits: Mutex<VecDeque<Submit>>,
        get_error: Option<Error>,
        log: Mutex<Vec<String>>,
    }

    impl Fake {
        fn new(timeline: Vec<(u64, &'static str)>) -> Fake {
            Fake {
                t0: Instant::now(),
                timeline: Mutex::new(timeline),
                submits: Mutex::new(VecDeque::new()),
                get_error: None,
                log: Mutex::new(Vec::new()),
            }
        }
        fn on_submit(self, reply: Result<(), Error>, after: Vec<(u64, &'static str)>) -> Fake {
            self.submits.lock().unwrap().push_back((reply, after));
            self
        }
        fn now_ms(&self) -> u64 {
            (Instant::now() - self.t0).as_millis() as u64
        }
        fn submit(&self, what: &str) -> Result<(), Error> {
            let now = self.now_ms();
            self.log.lock().unwrap().push(format!("{what}@{now}"));
            let (reply, after) = self.submits.lock().unwrap().pop_front().expect("unexpected submit");
            let mut timeline = self.timeline.lock().unwrap();
            timeline.extend(after.into_iter().map(|(t, s)| (now + t, s)));
            timeline.sort_by_key(|(t, _)| *t);
            reply
        }
        fn log(&self) -> Vec<String> {
            self.log.lock().unwrap().clone()
        }
        fn gets(&self) -> usize {
            self.log().iter().filter(|l| l.starts_with("get")).count()
        }
    }

    impl Lifecycle for Fake {
        fn get_sandbox(
            &self,
            id: &str,
            _opts: CallOptions,
        ) -> impl Future<Output = Result<SandboxState, Error>> + Send {
            let now = self.now_ms();
            self.log.lock().unwrap().push(format!("get@{now}"));
            let result = match &self.get_error {
                Some(e) => Err(e.clone()),
                None => {
                    let timeline = self.timeline.lock().unwrap();
                    let status = timeline.iter().rev().find(|(t, _)| *t <= now).unwrap().1;
                    Ok(SandboxState { id: id.to_string(), status: SandboxStatus::parse(status) })
                }
            };
            std::future::ready(result)
        }

        fn pause(&self, _: &str, _: CallOptions) -> impl Future<Output = Result<(), Error>> + Send {
            std::future::ready(self.submit("pause"))
        }

        fn resume(&self, _: &str, _: CallOptions) -> impl Future<Output = Result<(), Error>> + Send {
            std::future::ready(self.submit("resume"))
        }
    }

    fn conflict() -> Result<(), Error> {
        Err(Error::api(op::SANDBOX_LIFECYCLE, 409))
    }

    async fn run(fake: &Fake, desired: Desired) -> Result<(), Error> {
        transition(fake, "sbx", desired, fake.t0 + Duration::from_secs(60)).await
    }

    #[tokio::test(start_paused = true)]
    async fn transitions_follow_the_contract() {
        type Case = (
            &'static str,
            Vec<(u64, &'static str)>,
            Vec<(Result<(), Error>, Vec<(u64, &'static str)>)>,
            Desired,
            Result<(), &'static str>,
            &'static [&'static str],
        );
        let cases: Vec<Case> = vec![
            (
                "already running: nothing posted",
                vec![(0, "running")],
                vec![],
                Desired::Running,
                Ok(()),
                &["get@0"],
            ),
            (
                "already paused: nothing posted",
                vec![(0, "paused")],
                vec![],
                Desired::Paused,
                Ok(()),
                &["get@0"],
            ),
            (
                "pause from running",
                vec![(0, "running")],
                vec![(Ok(()), vec![(0, "pausing"), (60, "paused")])],
                Desired::Paused,
                Ok(()),
                &["get@0", "pause@0", "get@25", "get@75"],
            ),
            (
                "resume from paused",
                vec![(0, "paused")],
                vec![(Ok(()), vec![(0, "resuming"), (10, "running")])],
                Desired::Running,
                Ok(()),
                &["get@0", "resume@0", "get@25"],
            ),
            (
                "resume from error",
                vec![(0, "error")],
                vec![(Ok(()), vec![(0, "resuming"), (140, "running")])],
                Desired::Running,
                Ok(()),
                &["get@0", "resume@0", "get@25", "get@75", "get@150"],
            ),
            (
                "creating: poll without posting",
                vec![(0, "creating"), (30, "running")],
                vec![],
                Desired::Running,
                Ok(()),
                &["get@0", "get@25", "get@75"],
            ),
            (
                "pausing, then resume once paused",
                vec![(0, "pausing"), (20, "paused")],
                vec![(Ok(()), vec![(0, "resuming"), (5, "running")])],
                Desired::Running,
                Ok(()),
                &["get@0", "get@25", "resume@25", "get@50"],
            ),
            (
                "409: reconcile by reading at once",
                vec![(0, "running"), (30, "paused")],
                vec![(conflict(), vec![(0, "pausing")])],
                Desired::Paused,
                Ok(()),
                &["get@0", "pause@0", "get@0", "get@25", "get@75"],
            ),
            (
                "409 then still running: submitted once only",
                vec![(0, "running")],
                vec![(conflict(), vec![])],
                Desired::Paused,
                Err("running"),
                &["get@0", "pause@0", "get@0"],
            ),
            (
                "resume ends in error: no second submit",
                vec![(0, "paused")],
                vec![(Ok(()), vec![(0, "resuming"), (20, "error")])],
                Desired::Running,
                Err("error"),
                &["get@0", "resume@0", "get@25"],
            ),
            (
                "destroyed on resume",
                vec![(0, "destroyed")],
                vec![],
                Desired::Running,
                Err("destroyed"),
                &["get@0"],
            ),
            (
                "failed while resuming",
                vec![(0, "resuming"), (10, "failed")],
                vec![],
                Desired::Running,
                Err("failed"),
                &["get@0", "get@25"],
            ),
            (
                "pause is not submitted from error",
                vec![(0, "error")],
                vec![],
                Desired::Paused,
                Err("error"),
                &["get@0"],
            ),
            (
                "pause wanted while resuming: pause once running",
                vec![(0, "resuming"), (30, "running")],
                vec![(Ok(()), vec![(0, "pausing"), (10, "paused")])],
                Desired::Paused,
                Ok(()),
                &["get@0", "get@25", "get@75", "pause@75", "get@100"],
            ),
            (
                "unknown state",
                vec![(0, "hibernating")],
                vec![],
                Desired::Running,
                Err("hibernating"),
                &["get@0"],
            ),
        ];
        for (name, timeline, submits, desired, expected, log) in cases {
            let mut fake = Fake::new(timeline);
            for (reply, after) in submits {
                fake = fake.on_submit(reply, after);
            }
            let result = run(&fake, desired).await;
            match (&result, expected) {
                (Ok(()), Ok(())) => {}
                (Err(e), Err(state)) => {
                    assert_eq!(e.to_string(), format!("CreateOS sandbox did not reach {desired}."), "{name}");
                    assert_eq!(e.sandbox_state(), Some(state), "{name}");
                    assert_eq!(e.kind(), ErrorKind::Api, "{name}");
                    assert_eq!(e.is_terminal_state(), state == "destroyed" || state == "failed", "{name}");
                }
                _ => panic!("{name}: {result:?}"),
            }
            assert_eq!(fake.log(), log, "{name}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn not_found_and_other_errors_pass_through() {
        let mut fake = Fake::new(vec![(0, "running")]);
        fake.get_error = Some(Error::api(op::SANDBOX_LIFECYCLE, 404));
        let err = run(&fake, Desired::Running).await.unwrap_err();
        assert!(err.is_not_found());
        assert!(!err.is_terminal_state());

        let fake =
            Fake::new(vec![(0, "running")]).on_submit(Err(Error::api(op::SANDBOX_LIFECYCLE, 503)), vec![]);
        let err = run(&fake, Desired::Paused).await.unwrap_err();
        assert_eq!(err.http_status(), Some(503));
        assert!(err.is_transient());
    }

    #[tokio::test(start_paused = true)]
    async fn the_deadline_bounds_the_transition() {
        let fake = Fake::new(vec![(0, "creating")]);
        let deadline = fake.t0 + Duration::from_millis(1_000);
        let err = transition(&fake, "sbx", Desired::Running, deadline).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Timeout);
        assert_eq!(err.to_string(), "CreateOS sandbox lifecycle timed out.");
        assert_eq!(Instant::now(), deadline);
        // Polls at 0, 25, 75, 150, 250, 500, 750 (1000 is the deadline).
        assert_eq!(fake.gets(), 7);
    }

    #[tokio::test(start_paused = true)]
    async fn long_transitions_spend_fewer_polls_than_the_reference() {
        let fake =
            Fake::new(vec![(0, "running")]).on_submit(Ok(()), vec![(0, "pausing"), (30_000, "paused")]);
        run(&fake, Desired::Paused).await.unwrap();
        // The reference: the first read plus one poll every 250 ms.
        let reference = 1 + 30_000 / REFERENCE_POLL_MS as usize;
        assert!(fake.gets() < reference, "{} vs {reference}", fake.gets());
    }
}
