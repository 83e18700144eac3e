//! The suite as a provider author runs it from `cargo test`: the
//! deliberately broken fixture (hello-provider with four contract bugs) is
//! reported as not conforming, exactly in the checks of its bugs, and
//! `assert_conforms` fails naming each check and the contract sentence it
//! breaks. (`hello-provider`'s own tests show a conforming provider.)

use provider_conform::{assert_conforms, built_library, check_library, Verdict, CHECKS};
use serde_json::json;
use std::collections::BTreeSet;

const BROKEN: [&str; 4] = ["lifecycle", "destroy-twice", "other-environment", "concurrent-release"];

#[test]
fn the_broken_fixture_fails_exactly_the_checks_of_its_bugs_and_assert_conforms_names_them() {
    let dir = tempfile::tempdir().unwrap();
    let config = json!({"root": dir.path().join("leases")});
    let library = built_library("fixture_broken");

    let report = check_library(&library, config.clone()).expect("the fixture loads");
    assert!(!report.conforms());
    let names: Vec<&str> = report.checks.iter().map(|check| check.name).collect();
    assert_eq!(names, CHECKS.iter().map(|check| check.name).collect::<Vec<_>>(), "every check ran, in order");
    let failed: BTreeSet<&str> = report
        .checks
        .iter()
        .filter(|check| matches!(check.verdict, Verdict::Failed(_)))
        .map(|check| check.name)
        .collect();
    assert_eq!(failed, BTreeSet::from(BROKEN));
    let summary = report.summary();
    assert_eq!((summary.passed, summary.failed, summary.skipped), (9, 4, 0));

    let panicked = std::panic::catch_unwind(|| assert_conforms(&library, config)).expect_err("it fails");
    let message = panicked.downcast_ref::<String>().expect("a formatted message");
    for name in BROKEN {
        let check = CHECKS.iter().find(|check| check.name == name).unwrap();
        let line = message.lines().find(|line| line.starts_with(&format!("FAIL {name} "))).expect(name);
        assert!(line.ends_with(&format!("(contract: {})", check.contract)), "{line}");
    }
    assert!(message.ends_with("the provider does NOT conform"), "{message}");
}

#[test]
fn a_library_cargo_did_not_build_is_named_with_where_it_was_looked_for() {
    let panicked = std::panic::catch_unwind(|| built_library("no_such_provider")).expect_err("none built");
    let message = panicked.downcast_ref::<String>().expect("a formatted message");
    assert!(
        message.contains("libno_such_provider.so was not built") && message.contains("deps"),
        "{message}"
    );
    assert!(message.contains("cdylib"), "the likely cause: {message}");
}
