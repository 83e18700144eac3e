//! The learnt poll schedule ([`crate::transition`]) as memory the host
//! keeps between processes (`export_memory` / `import_memory`): one entry
//! per API origin, keyed `schedule <origin>`, whose value is JSON:
//!
//! ```json
//! {"version": 1, "phases": {"pausing": {"samples": [612.5, 598.0], "streak": 0, "taughtAtMs": 1796000000000}}}
//! ```
//!
//! Only the origin and durations leave the process, never a key or a
//! sandbox. Bounded: phases taught more than [`MAX_AGE`] ago are neither
//! exported nor imported, at most [`ORIGINS`] origins (the most recently
//! taught) go either way, and an export stays under
//! [`provider_abi::MEMORY_LIMIT`]. An import keeps what it can read and
//! what this process has not learnt itself, ignores stale phases and other
//! keys, and reports entries it could not read as one `invalid_input`
//! error (after taking the rest).

use crate::transition::{from_ms, shared_all, Estimates, Learnt, Phase, ORIGINS, SAMPLES};
use provider_abi::{ErrorKind, MemoryEntry, ProviderError, MEMORY_LIMIT};
use serde::{Deserialize, Serialize};
use std::{
    collections::BTreeMap,
    time::{Duration, SystemTime},
};

/// Phases taught longer ago than this are stale: the service may have
/// changed since.
pub const MAX_AGE: Duration = Duration::from_secs(24 * 3600);

/// The prefix of a schedule entry's key; the API origin follows.
pub const KEY_PREFIX: &str = "schedule ";

/// The value's format version.
const VERSION: u32 = 1;

/// The longest duration a sample may claim: more is damage, not a phase.
const MAX_SAMPLE_MS: f64 = 3_600_000.0;

#[derive(Serialize, Deserialize)]
struct Schedule {
    version: u32,
    phases: BTreeMap<String, Learnt>,
}

/// Every origin's schedule learnt within [`MAX_AGE`] of `now`, most
/// recently taught first, at most [`ORIGINS`] and [`MEMORY_LIMIT`] bytes.
pub fn export(now: SystemTime) -> Vec<MemoryEntry> {
    let mut origins: Vec<(SystemTime, String, Schedule)> = shared_all()
        .into_iter()
        .filter_map(|(origin, estimates)| {
            let (newest, phases) = fresh(estimates.learnt(), now)?;
            let phases = phases.into_iter().map(|(phase, mut learnt)| {
                // A tenth of a millisecond is finer than any poll.
                learnt.samples.iter_mut().for_each(|ms| *ms = (*ms * 10.0).round() / 10.0);
                (phase.as_ref().to_owned(), learnt)
            });
            Some((newest, origin, Schedule { version: VERSION, phases: phases.collect() }))
        })
        .collect();
    origins.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    let mut room = MEMORY_LIMIT;
    let mut entries = Vec::new();
    for (_, origin, schedule) in origins.into_iter().take(ORIGINS) {
        let value = serde_json::to_vec(&schedule).unwrap_or_default();
        let entry = MemoryEntry::new(format!("{KEY_PREFIX}{origin}"), value);
        if entry.size() > room {
            break;
        }
        room -= entry.size();
        entries.push(entry);
    }
    entries
}

/// Restores the schedules of `entries` into the process-wide estimates
/// (see the module documentation); returns how many phases were taken.
pub fn import(entries: &[MemoryEntry], now: SystemTime) -> Result<usize, ProviderError> {
    let mut unreadable = 0;
    let mut schedules = Vec::new();
    for entry in entries {
        let Some(origin) = entry.key.as_str().strip_prefix(KEY_PREFIX) else { continue };
        match read(&entry.value) {
            Some(phases) => {
                schedules.extend(fresh(phases, now).map(|(newest, phases)| (newest, origin, phases)))
            }
            None => unreadable += 1,
        }
    }
    schedules.sort_by_key(|(newest, ..)| std::cmp::Reverse(*newest));
    let mut taken = 0;
    for (_, origin, phases) in schedules.into_iter().take(ORIGINS) {
        let estimates = Estimates::shared(origin);
        taken +=
            phases.into_iter().filter(|(phase, learnt)| estimates.restore(*phase, learnt.clone())).count();
    }
    match unreadable {
        0 => Ok(taken),
        n => Err(ProviderError::new(
            ErrorKind::INVALID_INPUT,
            format!("{n} remembered CreateOS poll schedule(s) could not be read and were ignored."),
        )),
    }
}

/// The phases of one schedule value, `None` when it is not one this
/// version reads (malformed JSON, another version, an impossible sample).
fn read(value: &[u8]) -> Option<Vec<(Phase, Learnt)>> {
    let schedule: Schedule = serde_json::from_slice(value).ok()?;
    if schedule.version != VERSION {
        return None;
    }
    let mut phases = Vec::new();
    for (name, learnt) in schedule.phases {
        // A phase this version does not know is another version's business.
        let Ok(phase) = name.parse::<Phase>() else { continue };
        let plausible = |sample: &f64| sample.is_finite() && *sample > 0.0 && *sample <= MAX_SAMPLE_MS;
        if learnt.samples.is_empty()
            || learnt.samples.len() > SAMPLES
            || !learnt.samples.iter().all(plausible)
        {
            return None;
        }
        phases.push((phase, learnt));
    }
    Some(phases)
}

/// The phases taught within [`MAX_AGE`] of `now` (either way: another
/// host's clock may run ahead) and when the newest of them was taught;
/// `None` when none is that fresh.
fn fresh(phases: Vec<(Phase, Learnt)>, now: SystemTime) -> Option<(SystemTime, Vec<(Phase, Learnt)>)> {
    let age = |learnt: &Learnt| {
        let taught_at = from_ms(learnt.taught_at_ms);
        now.duration_since(taught_at).unwrap_or_else(|ahead| ahead.duration())
    };
    let fresh: Vec<_> = phases.into_iter().filter(|(_, learnt)| age(learnt) <= MAX_AGE).collect();
    let newest = fresh.iter().map(|(_, learnt)| from_ms(learnt.taught_at_ms)).max()?;
    Some((newest, fresh))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transition::unix_ms;

    const HOUR: Duration = Duration::from_secs(3600);

    fn learnt(samples: &[f64], taught_at: SystemTime) -> Learnt {
        Learnt { samples: samples.to_vec(), streak: 2, taught_at_ms: unix_ms(taught_at) }
    }

    /// The exported entry of `origin`, if any.
    fn exported(origin: &str, now: SystemTime) -> Option<MemoryEntry> {
        export(now).into_iter().find(|entry| entry.key == format!("{KEY_PREFIX}{origin}"))
    }

    fn entry(origin: &str, value: &[u8]) -> MemoryEntry {
        MemoryEntry::new(format!("{KEY_PREFIX}{origin}"), value.to_vec())
    }

    #[test]
    fn a_schedule_goes_out_and_comes_back_into_another_process_as_it_was() {
        let now = SystemTime::now();
        let taught = Estimates::shared("http://memory-round-trip.test:1");
        assert!(taught.restore(Phase::Pausing, learnt(&[612.25, 598.0, 640.0], now - HOUR)));
        let out = exported("http://memory-round-trip.test:1", now).expect("exported");
        assert!(!String::from_utf8_lossy(&out.value).contains("resuming"), "only what was learnt");
        // Another process: the same value under an origin it never saw.
        let value = out.value.to_vec();
        assert_eq!(import(&[entry("http://memory-round-trip.test:2", &value)], now), Ok(1));
        let restored = Estimates::shared("http://memory-round-trip.test:2");
        // Samples to a tenth of a millisecond, the time to a millisecond.
        let taught_at = from_ms(unix_ms(now - HOUR));
        assert_eq!(restored.learnt(), [(Phase::Pausing, learnt(&[612.3, 598.0, 640.0], taught_at))]);
        assert_eq!(restored.first_wait(Phase::Pausing), taught.first_wait(Phase::Pausing));
    }

    #[test]
    fn stale_phases_neither_leave_nor_enter_and_what_was_learnt_here_wins() {
        let now = SystemTime::now();
        let stale = now - MAX_AGE - HOUR;
        let old = Estimates::shared("http://memory-stale.test:1");
        assert!(old.restore(Phase::Creating, learnt(&[100.0], stale)));
        assert!(exported("http://memory-stale.test:1", now).is_none());
        let value = serde_json::to_vec(&serde_json::json!({"version": 1, "phases": {
            "creating": {"samples": [100.0], "streak": 0, "taughtAtMs": unix_ms(stale)},
            "pausing": {"samples": [300.0], "streak": 0, "taughtAtMs": unix_ms(now)},
            "rebooting": {"samples": [1.0], "streak": 0, "taughtAtMs": 0}
        }}))
        .unwrap();
        let here = Estimates::shared("http://memory-stale.test:2");
        assert!(here.restore(Phase::Pausing, learnt(&[900.0], now)));
        // Creating is stale, pausing was learnt here, rebooting is unknown.
        assert_eq!(import(&[entry("http://memory-stale.test:2", &value)], now), Ok(0));
        assert_eq!(here.estimate(Phase::Pausing), Some(Duration::from_millis(900)));
        assert_eq!(here.samples(Phase::Creating), 0);
    }

    #[test]
    fn unreadable_entries_are_one_error_after_the_readable_ones_are_taken() {
        let now = SystemTime::now();
        let good = serde_json::to_vec(&serde_json::json!({"version": 1, "phases": {
            "resuming": {"samples": [250.0, 260.0], "streak": 0, "taughtAtMs": unix_ms(now)}
        }}))
        .unwrap();
        let entries = [
            entry("http://memory-bad.test:1", b"\xff not json"),
            entry("http://memory-bad.test:2", br#"{"version": 2, "phases": {}}"#),
            entry("http://memory-bad.test:3", br#"{"version": 1, "phases": {"pausing": {"samples": [-1.0], "streak": 0, "taughtAtMs": 0}}}"#),
            entry("http://memory-bad.test:4", &good),
            MemoryEntry::new("another version's key", b"anything".to_vec()),
        ];
        let error = import(&entries, now).unwrap_err();
        assert_eq!(error.kind, ErrorKind::INVALID_INPUT);
        assert_eq!(
            error.message,
            "3 remembered CreateOS poll schedule(s) could not be read and were ignored."
        );
        assert_eq!(Estimates::shared("http://memory-bad.test:4").samples(Phase::Resuming), 2);
        assert_eq!(Estimates::shared("http://memory-bad.test:3").samples(Phase::Pausing), 0);
    }
}
