//! One scan of `/proc` shared by every process tree that asks at the same
//! moment.
//!
//! A tree's members are found by reading every process's `stat` and mount
//! namespace. When each tree scanned for itself, a thousand commands running
//! meant a thousand scans of a thousand processes each time they were
//! checked: at 10,000 lifecycles in flight those scans were the simulator's
//! largest cost (17 % of its CPU, perf). Now a tree asks for a table *taken
//! since* the moment it asks (so it never sees the world from before a fact
//! it relies on, such as its leader being reaped), and every tree that asks
//! while a scan runs shares the next one.

use std::os::unix::fs::MetadataExt;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// What one scan saw of one process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ProcEntry {
    pub pid: i32,
    pub ppid: i32,
    /// Its process group.
    pub pgrp: i32,
    pub zombie: bool,
    /// The inode of its mount namespace, if it could be read.
    pub mnt_ns: Option<u64>,
}

/// Every process of the system at one moment.
#[derive(Debug)]
pub(crate) struct ProcTable {
    started: Instant,
    entries: Vec<ProcEntry>,
}

/// The newest table.
static NEWEST: Mutex<Option<Arc<ProcTable>>> = Mutex::new(None);

impl ProcTable {
    /// A table whose scan started at or after `moment`: the newest one if it
    /// qualifies, else a new scan (while it runs, others who ask wait for it
    /// and share the next).
    pub(crate) fn taken_since(moment: Instant) -> Arc<ProcTable> {
        let mut newest = NEWEST.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(table) = newest.as_ref().filter(|t| t.started >= moment) {
            return table.clone();
        }
        let table = Arc::new(ProcTable::scan());
        *newest = Some(table.clone());
        table
    }

    /// The processes seen.
    pub(crate) fn entries(&self) -> &[ProcEntry] {
        &self.entries
    }

    fn scan() -> ProcTable {
        let started = Instant::now();
        let entries = match std::fs::read_dir("/proc") {
            Ok(dir) => dir
                .flatten()
                .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
                .filter_map(read_entry)
                .collect(),
            Err(_) => Vec::new(),
        };
        ProcTable { started, entries }
    }
}

/// Reads one process's entry (`None` once it is gone).
pub(crate) fn read_entry(pid: i32) -> Option<ProcEntry> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: fields start after
    // the last ')'.
    let mut fields = stat[stat.rfind(')')? + 1..].split_whitespace();
    let zombie = fields.next()? == "Z";
    let ppid = fields.next()?.parse().ok()?;
    let pgrp = fields.next()?.parse().ok()?;
    let mnt_ns = std::fs::metadata(format!("/proc/{pid}/ns/mnt")).ok().map(|m| m.ino());
    Some(ProcEntry { pid, ppid, pgrp, zombie, mnt_ns })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_is_never_older_than_the_moment_asked() {
        let me = std::process::id() as i32;
        let moment = Instant::now();
        let table = ProcTable::taken_since(moment);
        assert!(table.started >= moment);
        let mine = table.entries().iter().find(|e| e.pid == me).expect("this process is in the table");
        assert!(!mine.zombie);
        // SAFETY: getpgrp and getppid have no preconditions.
        assert_eq!((mine.pgrp, mine.ppid), (unsafe { libc::getpgrp() }, unsafe { libc::getppid() }));
        assert!(mine.mnt_ns.is_some());
        // Asked for a later moment: a new scan.
        assert!(!Arc::ptr_eq(&table, &ProcTable::taken_since(Instant::now())));
    }

    #[test]
    fn a_process_started_after_a_scan_is_in_the_next() {
        let before = ProcTable::taken_since(Instant::now());
        let mut child = std::process::Command::new("sleep").arg("30").spawn().expect("spawn sleep");
        let pid = child.id() as i32;
        assert!(before.entries().iter().all(|e| e.pid != pid));
        let after = ProcTable::taken_since(Instant::now());
        assert!(after.entries().iter().any(|e| e.pid == pid && !e.zombie));
        child.kill().expect("kill");
        child.wait().expect("wait");
    }
}
