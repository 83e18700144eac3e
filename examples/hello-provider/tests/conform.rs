//! The provider keeps the lease contract: the conformance suite
//! (`provider-conform`) run against the `cdylib` cargo built for this crate,
//! as a host loads it.

use serde_json::json;

#[test]
fn the_built_library_conforms_and_leaves_no_lease_behind() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("leases");
    let library = provider_conform::built_library("hello_provider");
    provider_conform::assert_conforms(&library, json!({"root": root}));
    // The root is made by the first acquire.
    let left: Vec<_> = std::fs::read_dir(&root).into_iter().flatten().collect();
    assert!(left.is_empty(), "conform destroys every lease it acquires: {left:?}");
}
