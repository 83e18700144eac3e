//! What a conformance run found: each check's verdict, the counts, and the
//! lines and JSON a command prints.

use serde_json::{json, Value};
use std::time::Duration;

/// How a check ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The contract held; a short note of what was seen.
    Passed(String),
    /// The contract broke; what happened instead.
    Failed(String),
    /// The check could not run against this provider; why.
    Skipped(String),
}

impl Verdict {
    /// `passed`, `failed` or `skipped`, and what was said: the note, what
    /// happened or why.
    pub fn parts(&self) -> (&'static str, &str) {
        match self {
            Verdict::Passed(note) => ("passed", note),
            Verdict::Failed(detail) => ("failed", detail),
            Verdict::Skipped(why) => ("skipped", why),
        }
    }
}

/// A finished check.
#[derive(Debug, Clone)]
pub struct CheckReport {
    /// The check's name.
    pub name: &'static str,
    /// The contract sentence it tests.
    pub contract: &'static str,
    /// How it ended.
    pub verdict: Verdict,
    /// How long it took.
    pub duration: Duration,
}

impl CheckReport {
    /// True unless the check failed.
    pub fn ok(&self) -> bool {
        !matches!(self.verdict, Verdict::Failed(_))
    }

    /// The report as one JSON object.
    pub fn to_json(&self) -> Value {
        let (status, detail) = self.verdict.parts();
        json!({
            "check": self.name,
            "status": status,
            "ok": self.ok(),
            "contract": self.contract,
            "detail": detail,
            "durationMs": self.duration.as_secs_f64() * 1e3,
        })
    }

    /// The report as one line; a failure names the check and the contract
    /// sentence it breaks.
    pub fn to_line(&self) -> String {
        let ms = self.duration.as_secs_f64() * 1e3;
        let (status, detail) = self.verdict.parts();
        let mut line = format!("{} {:<22} {ms:>8.1} ms", status[..4].to_uppercase(), self.name);
        if !detail.is_empty() {
            line += &format!("  {detail}");
        }
        if !self.ok() {
            line += &format!(" (contract: {})", self.contract);
        }
        line
    }
}

/// The counts of a finished run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Summary {
    /// Checks that passed.
    pub passed: usize,
    /// Checks that failed.
    pub failed: usize,
    /// Checks that could not run.
    pub skipped: usize,
}

impl Summary {
    /// Counts `reports`.
    pub fn of(reports: &[CheckReport]) -> Summary {
        let count = |status| reports.iter().filter(|report| report.verdict.parts().0 == status).count();
        Summary { passed: count("passed"), failed: count("failed"), skipped: count("skipped") }
    }

    /// The summary as JSON.
    pub fn to_json(&self) -> Value {
        json!({"summary": {"passed": self.passed, "failed": self.failed, "skipped": self.skipped,
                           "ok": self.failed == 0}})
    }

    /// The summary as one line.
    pub fn to_line(&self) -> String {
        let total = self.passed + self.failed + self.skipped;
        let verdict = if self.failed == 0 { "conforms" } else { "does NOT conform" };
        format!(
            "{total} checks: {} passed, {} failed, {} skipped; the provider {verdict}",
            self.passed, self.failed, self.skipped
        )
    }
}

/// Every check that ran, in order.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// Each check's report.
    pub checks: Vec<CheckReport>,
}

impl Report {
    /// The counts.
    pub fn summary(&self) -> Summary {
        Summary::of(&self.checks)
    }

    /// True when no check failed.
    pub fn conforms(&self) -> bool {
        self.checks.iter().all(CheckReport::ok)
    }

    /// One line per check and the summary, as `host-harness conform` prints
    /// them.
    pub fn to_text(&self) -> String {
        let mut text: String = self.checks.iter().map(|check| check.to_line() + "\n").collect();
        text.push_str(&self.summary().to_line());
        text
    }
}
