//! Fault injection: rules, profiles and the engine that decides what fires.
//!
//! A [`FaultRule`] matches `"METHOD /path/pattern"` (`*` method = any; in the
//! pattern `*` = one segment, a trailing `**` = any rest) and fires according
//! to its [`FaultTrigger`], at most `times` times. Rules are evaluated in the
//! order they were added; every matching rule counts the call. All fired
//! `Delay`s are applied, then the first other fired kind. Requests rejected
//! for a bad API key (or by the rate limit) never reach the engine.
//!
//! JSON form (see [`parse_rules`]):
//! `[{"route": "POST /v1/sandboxes/*/processes", "trigger": {"nth": 2},
//!    "kind": {"status": 503}, "times": 1}]` where `trigger` is one of
//! `{"nth": N}`, `{"from": N}`, `{"probability": P, "seed": S}` and `kind` is
//! `{"status": CODE}`, `{"delay_ms": MS}`, `{"delay_reply_ms": MS}`, `{"exit_code": CODE}` or one of the strings
//! `"drop_after_action"`, `"malformed_json"`, `"wrong_id"`, `"cut_stream"`,
//! `"force_stopped"`, `"transition_stuck"`, `"transition_error"`.

use std::sync::Mutex;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::ledger::path_matches;

/// What an injected fault does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "KindWire", into = "KindWire")]
pub enum FaultKind {
    /// Reply this status with an error envelope, without acting
    /// (429 also carries `Retry-After: 1`).
    Status(u16),
    /// Act, then drop the connection without any reply.
    DropAfterAction,
    /// Wait this long before handling.
    Delay(Duration),
    /// Act, then hold the reply this long (a creation whose reply is still
    /// in flight when the client dies: the sandbox exists, nobody knows its id).
    DelayReply(Duration),
    /// Act, then reply 200 with invalid JSON.
    MalformedJson,
    /// Act, then reply with a different id in `data.id` (or `data.process_id`).
    WrongId,
    /// `connect`: send part of a frame line, then end the body with an error;
    /// `GET /files`: send half the file, then end the body with an error.
    CutStream,
    /// Act, then the host force-stops the sandbox: it vanishes (GET answers
    /// 404, processes killed, files removed). On `pause` this models a
    /// sandbox that disappears after the pause was accepted.
    ForceStopped,
    /// create/pause/resume only: the transition never completes.
    TransitionStuck,
    /// create/pause/resume only: the transition ends in `error`.
    TransitionError,
    /// exec only: run the command, then reply with this exit code (its
    /// output as it was): a sandbox whose command misbehaves.
    ExitCode(i32),
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum KindWire {
    Status(u16),
    DelayMs(u64),
    DelayReplyMs(u64),
    DropAfterAction,
    MalformedJson,
    WrongId,
    CutStream,
    ForceStopped,
    TransitionStuck,
    TransitionError,
    ExitCode(i32),
}

impl From<KindWire> for FaultKind {
    fn from(w: KindWire) -> Self {
        match w {
            KindWire::Status(s) => FaultKind::Status(s),
            KindWire::DelayMs(ms) => FaultKind::Delay(Duration::from_millis(ms)),
            KindWire::DelayReplyMs(ms) => FaultKind::DelayReply(Duration::from_millis(ms)),
            KindWire::DropAfterAction => FaultKind::DropAfterAction,
            KindWire::MalformedJson => FaultKind::MalformedJson,
            KindWire::WrongId => FaultKind::WrongId,
            KindWire::CutStream => FaultKind::CutStream,
            KindWire::ForceStopped => FaultKind::ForceStopped,
            KindWire::TransitionStuck => FaultKind::TransitionStuck,
            KindWire::TransitionError => FaultKind::TransitionError,
            KindWire::ExitCode(code) => FaultKind::ExitCode(code),
        }
    }
}

impl From<FaultKind> for KindWire {
    fn from(k: FaultKind) -> Self {
        match k {
            FaultKind::Status(s) => KindWire::Status(s),
            FaultKind::Delay(d) => KindWire::DelayMs(d.as_millis() as u64),
            FaultKind::DelayReply(d) => KindWire::DelayReplyMs(d.as_millis() as u64),
            FaultKind::DropAfterAction => KindWire::DropAfterAction,
            FaultKind::MalformedJson => KindWire::MalformedJson,
            FaultKind::WrongId => KindWire::WrongId,
            FaultKind::CutStream => KindWire::CutStream,
            FaultKind::ForceStopped => KindWire::ForceStopped,
            FaultKind::TransitionStuck => KindWire::TransitionStuck,
            FaultKind::TransitionError => KindWire::TransitionError,
            FaultKind::ExitCode(code) => KindWire::ExitCode(code),
        }
    }
}

/// When a rule fires, counting matching calls from 1.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", untagged)]
pub enum FaultTrigger {
    /// Only the Nth matching call.
    Nth {
        /// 1-based call number.
        nth: u64,
    },
    /// Every matching call from the Nth on.
    From {
        /// 1-based first call number.
        from: u64,
    },
    /// Each matching call with probability `probability`, drawn from a
    /// `StdRng` seeded with `seed` (deterministic for a given call order).
    Probability {
        /// Probability in [0, 1].
        probability: f64,
        /// RNG seed.
        seed: u64,
    },
}

impl FaultTrigger {
    /// Only the Nth matching call.
    pub fn nth(n: u64) -> Self {
        FaultTrigger::Nth { nth: n }
    }
    /// Every matching call from the Nth.
    pub fn from_nth(n: u64) -> Self {
        FaultTrigger::From { from: n }
    }
    /// Random with a seed.
    pub fn probability(p: f64, seed: u64) -> Self {
        FaultTrigger::Probability { probability: p, seed }
    }
}

/// One fault-injection rule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FaultRule {
    /// `"METHOD /v1/path/pattern"`; method `*` matches any method.
    pub route: String,
    /// When it fires.
    pub trigger: FaultTrigger,
    /// What it does.
    pub kind: FaultKind,
    /// Fire at most this many times (`None` = unlimited).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub times: Option<u32>,
}

impl FaultRule {
    /// A rule on `route` (`"POST /v1/sandboxes/*/pause"`).
    pub fn new(route: impl Into<String>, trigger: FaultTrigger, kind: FaultKind) -> Self {
        FaultRule { route: route.into(), trigger, kind, times: None }
    }

    /// Limit the number of firings.
    pub fn times(mut self, n: u32) -> Self {
        self.times = Some(n);
        self
    }

    fn matches(&self, method: &str, path: &str) -> bool {
        let (m, p) = self.route.trim().split_once(' ').unwrap_or(("*", &self.route));
        (m == "*" || m.eq_ignore_ascii_case(method)) && path_matches(p.trim(), path)
    }
}

/// Parse a JSON list of rules (a fault-profile file).
pub fn parse_rules(json: &str) -> Result<Vec<FaultRule>, serde_json::Error> {
    serde_json::from_str(json)
}

/// Identifies an added rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FaultId(pub u64);

/// Named fault profiles.
#[derive(Debug, Clone, Copy)]
pub struct FaultProfile;

impl FaultProfile {
    /// No faults.
    pub fn none() -> Vec<FaultRule> {
        Vec::new()
    }

    /// Transient trouble on every `/v1` call: 2% 500, 1% 502, 1% 503,
    /// 1% 429, 3% a 300 ms delay.
    pub fn flaky(seed: u64) -> Vec<FaultRule> {
        let any = "* /v1/**";
        let p = |i: u64, prob: f64| FaultTrigger::probability(prob, seed.wrapping_add(i));
        vec![
            FaultRule::new(any, p(1, 0.02), FaultKind::Status(500)),
            FaultRule::new(any, p(2, 0.01), FaultKind::Status(502)),
            FaultRule::new(any, p(3, 0.01), FaultKind::Status(503)),
            FaultRule::new(any, p(4, 0.01), FaultKind::Status(429)),
            FaultRule::new(any, p(5, 0.03), FaultKind::Delay(Duration::from_millis(300))),
        ]
    }

    /// [`FaultProfile::flaky`] plus 1% dropped connections after acting,
    /// 1% malformed JSON, 2% wrong ids on sandbox reads and creation,
    /// 5% cut output streams and 2% sandboxes vanishing mid-pause.
    pub fn hostile(seed: u64) -> Vec<FaultRule> {
        let p = |i: u64, prob: f64| FaultTrigger::probability(prob, seed.wrapping_add(100 + i));
        let mut v = Self::flaky(seed);
        v.extend([
            FaultRule::new("* /v1/**", p(1, 0.01), FaultKind::DropAfterAction),
            FaultRule::new("* /v1/**", p(2, 0.01), FaultKind::MalformedJson),
            FaultRule::new("GET /v1/sandboxes/*", p(3, 0.02), FaultKind::WrongId),
            FaultRule::new("POST /v1/sandboxes", p(4, 0.02), FaultKind::WrongId),
            FaultRule::new("GET /v1/sandboxes/*/processes/*/connect", p(5, 0.05), FaultKind::CutStream),
            FaultRule::new("POST /v1/sandboxes/*/pause", p(6, 0.02), FaultKind::ForceStopped),
        ]);
        v
    }
}

struct Active {
    id: FaultId,
    rule: FaultRule,
    calls: u64,
    fired: u32,
    rng: Option<StdRng>,
}

/// Holds the rules and decides, per request, which fire.
#[derive(Default)]
pub(crate) struct FaultEngine {
    inner: Mutex<(u64, Vec<Active>)>,
}

impl FaultEngine {
    pub(crate) fn add(&self, rule: FaultRule) -> FaultId {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        g.0 += 1;
        let id = FaultId(g.0);
        let rng = match rule.trigger {
            FaultTrigger::Probability { seed, .. } => Some(StdRng::seed_from_u64(seed)),
            _ => None,
        };
        g.1.push(Active { id, rule, calls: 0, fired: 0, rng });
        id
    }

    pub(crate) fn remove(&self, id: FaultId) {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        g.1.retain(|a| a.id != id);
    }

    pub(crate) fn clear(&self) {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).1.clear();
    }

    /// The kinds that fire for this call, in rule order.
    pub(crate) fn evaluate(&self, method: &str, path: &str) -> Vec<FaultKind> {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = Vec::new();
        for a in g.1.iter_mut() {
            if !a.rule.matches(method, path) {
                continue;
            }
            a.calls += 1;
            if a.rule.times.is_some_and(|t| a.fired >= t) {
                continue;
            }
            let fire = match a.rule.trigger {
                FaultTrigger::Nth { nth } => a.calls == nth,
                FaultTrigger::From { from } => a.calls >= from,
                FaultTrigger::Probability { probability, .. } => {
                    a.rng.as_mut().is_some_and(|r| r.gen_bool(probability.clamp(0.0, 1.0)))
                }
            };
            if fire {
                a.fired += 1;
                out.push(a.rule.kind);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn triggers() {
        let e = FaultEngine::default();
        e.add(FaultRule::new("POST /v1/sandboxes/*/pause", FaultTrigger::nth(2), FaultKind::Status(503)));
        e.add(FaultRule::new("GET /v1/**", FaultTrigger::from_nth(2), FaultKind::WrongId).times(2));
        let p = "/v1/sandboxes/a/pause";
        assert!(e.evaluate("POST", p).is_empty());
        assert_eq!(e.evaluate("POST", p), vec![FaultKind::Status(503)]);
        assert!(e.evaluate("POST", p).is_empty());
        let g = "/v1/sandboxes/a";
        assert!(e.evaluate("GET", g).is_empty());
        assert_eq!(e.evaluate("GET", g).len(), 1);
        assert_eq!(e.evaluate("GET", g).len(), 1);
        assert!(e.evaluate("GET", g).is_empty());
    }

    #[test]
    fn probability_is_deterministic() {
        let run = || {
            let e = FaultEngine::default();
            for r in FaultProfile::hostile(7) {
                e.add(r);
            }
            (0..500).map(|_| e.evaluate("GET", "/v1/sandboxes/x").len()).collect::<Vec<_>>()
        };
        let a = run();
        assert_eq!(a, run());
        assert!(a.iter().any(|n| *n > 0));
    }

    #[test]
    fn json_round_trip() {
        let json = r#"[
          {"route": "POST /v1/sandboxes/*/processes", "trigger": {"nth": 2}, "kind": {"status": 503}, "times": 1},
          {"route": "* /v1/**", "trigger": {"probability": 0.5, "seed": 3}, "kind": {"delay_ms": 20}},
          {"route": "GET /v1/sandboxes/*", "trigger": {"from": 1}, "kind": "wrong_id"}
        ]"#;
        let rules = parse_rules(json).unwrap();
        assert_eq!(rules[0].kind, FaultKind::Status(503));
        assert_eq!(rules[0].trigger, FaultTrigger::nth(2));
        assert_eq!(rules[1].kind, FaultKind::Delay(Duration::from_millis(20)));
        assert_eq!(rules[2].trigger, FaultTrigger::from_nth(1));
        let again = parse_rules(&serde_json::to_string(&rules).unwrap()).unwrap();
        assert_eq!(again, rules);
        assert!(parse_rules(&serde_json::to_string(&FaultProfile::hostile(1)).unwrap()).is_ok());
    }
}
