//! Opening the lease ledger: at once from many connections, read-only, a
//! database of another application, a missing directory.

use host_harness::ledger::Ledger;
use std::sync::Barrier;

#[test]
fn many_connections_creating_the_same_new_ledger_at_once_all_succeed() {
    const OPENERS: usize = 8;
    for round in 0..30 {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.sqlite3");
        let start = Barrier::new(OPENERS);
        let results: Vec<_> = std::thread::scope(|scope| {
            let openers: Vec<_> = (0..OPENERS)
                .map(|_| {
                    scope.spawn(|| {
                        start.wait();
                        Ledger::open(&path).map(|ledger| ledger.list().map(|rows| rows.len()))
                    })
                })
                .collect();
            openers.into_iter().map(|opener| opener.join().unwrap()).collect()
        });
        for result in results {
            match result {
                Ok(Ok(0)) => {}
                Ok(other) => panic!("round {round}: {other:?}"),
                Err(error) => panic!("round {round}: {error}"),
            }
        }
    }
}
