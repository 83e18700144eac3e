//! What a provider learnt, kept across processes: a one-shot command starts
//! with what the previous one learnt (for the CreateOS provider, when its
//! sandboxes usually finish a transition) instead of starting cold.
//!
//! The provider exports keyed opaque entries (`export_memory`, ABI 2.1); the
//! host keeps them in its lease store under the provider's id, and hands
//! the fresh ones back after `setup` (`import_memory`). Bounded: at most
//! [`MEMORY_LIMIT`] bytes cross either way, entries saved more than
//! [`MAX_AGE`] ago are neither handed back nor kept, and a store keeps at
//! most [`MAX_ENTRIES`] per provider. Memory is an optimisation: every
//! failure here is a warning, never a failed command, and a provider
//! without the hooks is left alone.

use crate::{hosted::HookSupport, store::LeaseStore};
use provider_abi::{Hook, MemoryEntry, MEMORY_LIMIT};
use std::time::{Duration, SystemTime};

/// Entries saved longer ago than this are stale: not handed back, and
/// removed at the next save.
pub const MAX_AGE: Duration = Duration::from_secs(7 * 24 * 3600);

/// The most entries a store keeps per provider (the newest).
pub const MAX_ENTRIES: usize = 256;

/// A provider's memory entry as a store keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SavedEntry {
    /// The entry, as the provider exported it.
    pub entry: MemoryEntry,
    /// When it was saved.
    pub saved_at: SystemTime,
}

/// Hands provider its fresh memory from `store`, newest first while it fits
/// in [`MEMORY_LIMIT`]; returns how many entries it took (0 when it lacks
/// the hook). An entry too large alone, an unreadable store or a provider
/// that refuses what it is given are warnings.
pub fn restore(provider: &dyn HookSupport, store: &dyn LeaseStore) -> usize {
    if !provider.supports(Hook::ImportMemory) {
        return 0;
    }
    let id = provider.manifest().id.to_string();
    let saved = store
        .memory(&id)
        .inspect_err(|error| tracing::warn!(provider = %id, "cannot read the provider's memory: {error}"))
        .unwrap_or_default();
    let fresh = fresh_within_limit(&id, saved, SystemTime::now());
    import(provider, &id, fresh, "the provider did not take its memory back")
}

/// Saves what `provider` learnt into `store`; returns how many entries it
/// exported (0 when it lacks the hook or the export failed, which is a
/// warning, as is an export over [`MEMORY_LIMIT`], which is not saved).
pub fn save(provider: &dyn HookSupport, store: &dyn LeaseStore) -> usize {
    let id = provider.manifest().id.to_string();
    let Some(entries) = export(provider, &id).filter(|entries| !entries.is_empty()) else { return 0 };
    let now = SystemTime::now();
    let forget_before = now.checked_sub(MAX_AGE).unwrap_or(SystemTime::UNIX_EPOCH);
    store
        .save_memory(&id, &entries, now, forget_before, MAX_ENTRIES)
        .inspect_err(|error| tracing::warn!(provider = %id, "cannot save the provider's memory: {error}"))
        .map_or(0, |()| entries.len())
}

/// Hands what `from` learnt to `to` (a newly active version of the same
/// provider, before its first call); returns how many entries `to` took.
pub fn hand_over(from: &dyn HookSupport, to: &dyn HookSupport) -> usize {
    if !to.supports(Hook::ImportMemory) {
        return 0;
    }
    let id = to.manifest().id.to_string();
    let Some(entries) = export(from, &id) else { return 0 };
    import(to, &id, entries, "the new version did not take the memory of the old one")
}

/// Hands `entries` (if any) to `provider`; returns how many it took. A
/// refusal is a warning saying `refused`.
fn import(provider: &dyn HookSupport, id: &str, entries: Vec<MemoryEntry>, refused: &str) -> usize {
    if entries.is_empty() {
        return 0;
    }
    provider
        .import_memory(&entries)
        .inspect_err(|error| tracing::warn!(provider = %id, kind = %error.kind, "{refused}: {error}"))
        .map_or(0, |()| entries.len())
}

/// `provider`'s export, `None` when it has no such hook, failed or exported
/// more than [`MEMORY_LIMIT`] (both warnings).
fn export(provider: &dyn HookSupport, id: &str) -> Option<Vec<MemoryEntry>> {
    if !provider.supports(Hook::ExportMemory) {
        return None;
    }
    let entries = provider
        .export_memory()
        .inspect_err(|error| {
            tracing::warn!(provider = %id, kind = %error.kind, "the provider did not export its memory: {error}")
        })
        .ok()?;
    let size: usize = entries.iter().map(MemoryEntry::size).sum();
    if size > MEMORY_LIMIT {
        tracing::warn!(provider = %id, bytes = size, limit = MEMORY_LIMIT, "the provider's memory is over the limit: not kept");
        return None;
    }
    Some(entries)
}

/// The entries of `saved` (newest first) saved within [`MAX_AGE`] of `now`,
/// as many as fit in [`MEMORY_LIMIT`]; one too large alone is a warning.
fn fresh_within_limit(id: &str, saved: Vec<SavedEntry>, now: SystemTime) -> Vec<MemoryEntry> {
    let mut room = MEMORY_LIMIT;
    let mut entries = Vec::new();
    for SavedEntry { entry, saved_at } in saved {
        let age = now.duration_since(saved_at).unwrap_or_default();
        if age > MAX_AGE {
            continue;
        }
        let size = entry.size();
        if size > MEMORY_LIMIT {
            tracing::warn!(provider = %id, key = %entry.key, bytes = size, limit = MEMORY_LIMIT, "a stored memory entry is over the limit: not handed back");
            continue;
        }
        if size > room {
            break;
        }
        room -= size;
        entries.push(entry);
    }
    entries
}

#[cfg(test)]
mod tests {
    use super::*;

    fn saved(key: &str, bytes: usize, age: Duration, now: SystemTime) -> SavedEntry {
        SavedEntry { entry: MemoryEntry::new(key, vec![7u8; bytes]), saved_at: now - age }
    }

    fn keys(entries: &[MemoryEntry]) -> Vec<&str> {
        entries.iter().map(|entry| entry.key.as_str()).collect()
    }

    #[test]
    fn stale_and_oversized_entries_are_left_out_and_the_rest_stops_at_the_limit() {
        let now = SystemTime::now();
        let minute = Duration::from_secs(60);
        let half = MEMORY_LIMIT / 2;
        let handed = fresh_within_limit(
            "p",
            vec![
                saved("new", 10, minute, now),
                saved("huge", MEMORY_LIMIT + 1, minute, now),
                saved("stale", 10, MAX_AGE + minute, now),
                saved("half", half, minute, now),
                saved("over", half, minute, now),
                saved("older", 1, minute * 2, now),
            ],
            now,
        );
        // "over" would pass the limit: it and every older entry stay behind.
        assert_eq!(keys(&handed), ["new", "half"]);
    }
}
