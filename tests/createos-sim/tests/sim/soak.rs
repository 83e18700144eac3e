use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::common::*;

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

fn children() -> BTreeSet<i32> {
    let mut out = BTreeSet::new();
    for t in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        if let Ok(s) = std::fs::read_to_string(t.path().join("children")) {
            out.extend(s.split_whitespace().filter_map(|p| p.parse::<i32>().ok()));
        }
    }
    out
}

#[test]
fn soak_thousand_sandboxes() {
    let _g = exclusive();
    // Warm up process-wide lazies (tokio's signal pipe, rustls) before measuring.
    {
        let api = Api::start(fast_config());
        let id = api.create_running();
        api.exec(&id, "true");
    }
    let fds_before = open_fds();
    let kids_before = children();
    let state = tempfile::tempdir().unwrap();
    let started = Instant::now();
    {
        let mut cfg = fast_config();
        cfg.create_delay = Duration::from_millis(2);
        cfg.state_dir = Some(state.path().to_path_buf());
        let api = Api::start(cfg);
        let next = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..50 {
                s.spawn(|| loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    if i >= 1000 {
                        return;
                    }
                    let id = api.create_running();
                    let r = api.exec(&id, &format!("echo {i} > /tmp/n; cat /tmp/n"));
                    assert_eq!(r["stdout"], format!("{i}\n"), "{r}");
                    let (st, _) = api.delete(&format!("/sandboxes/{id}"));
                    assert_eq!(st, 200);
                });
            }
        });
        let l = api.sim.ledger();
        assert_eq!(l.sandboxes.len(), 1000);
        assert!(l.leaked().is_empty());
        assert_eq!(l.count("DELETE", "/v1/sandboxes/*"), 1000);
        assert!(api.sim.live_sandboxes().is_empty());
        let left: Vec<_> = std::fs::read_dir(state.path()).unwrap().flatten().collect();
        assert!(left.is_empty(), "leftover directories: {left:?}");
        let _ = json!({});
    }
    let elapsed = started.elapsed();
    eprintln!("soak: 1000 sandboxes in {elapsed:?}");
    assert!(
        wait_until(Duration::from_secs(5), || children() == kids_before),
        "leaked children: {:?}",
        children()
    );
    assert!(
        wait_until(Duration::from_secs(5), || open_fds() <= fds_before),
        "fds before {fds_before}, after {}",
        open_fds()
    );
}
