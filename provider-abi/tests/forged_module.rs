//! A library can always lie, but the loader ties what it calls to what it
//! checked: each `forged_table_1_N` example has the genuine layouts and an ABI
//! 1.N hook table that points outside the library (the 1.0 table at a
//! function of the C library, later tables at data), and must be refused in
//! one line naming that table; the `foreign_provider` example's root module
//! hands over a function of the C library, and must be refused before
//! anything is called.

use provider_abi::{library_file_name, AbiVersion, LoadError, LoadedProvider, ABI_1_0, ABI_1_1, ABI_VERSION};
use std::path::PathBuf;

/// The library of example `name`, built beside this test.
fn example_library(name: &str) -> PathBuf {
    let deps = std::env::current_exe().unwrap().parent().unwrap().to_path_buf();
    let path = deps.join("../examples").join(library_file_name(name));
    assert!(
        path.exists(),
        "{} is missing: `cargo test -p provider-abi` builds it (a `--test` filter does not)",
        path.display()
    );
    path
}

#[test]
fn a_hook_table_of_any_version_that_points_outside_the_library_is_refused() {
    for minor in 0..=ABI_VERSION.minor {
        let path = example_library(&format!("forged_table_1_{minor}"));
        let expected = format!(
            "cannot load provider {}: its ABI 1.{minor} hook table points outside the library \
             (a forged or corrupt provider module)",
            path.canonicalize().unwrap().display()
        );
        // Every host that reads the table refuses the library, in one line.
        let table = AbiVersion::new(1, minor);
        for host in [table, ABI_VERSION] {
            let error =
                LoadedProvider::load_as(&path, host).err().expect("the forged library must be refused");
            let text = error.to_string();
            assert!(matches!(error, LoadError::ForeignPointer { .. }), "1.{minor}, host {host}: {text}");
            assert_eq!(text, expected, "host {host}");
        }
        // A host older than the table never reads it; the forged constructor fails.
        if minor > 0 {
            let host = AbiVersion::new(1, minor - 1);
            let error = LoadedProvider::load_as(&path, host).err().expect("no instance");
            assert!(matches!(error, LoadError::ProviderFailed { .. }), "1.{minor}, host {host}: {error}");
        }
    }
}

#[test]
fn a_root_module_that_hands_over_a_function_outside_the_library_is_refused() {
    for host in [ABI_1_0, ABI_1_1] {
        let error = LoadedProvider::load_as(example_library("foreign_provider"), host)
            .err()
            .expect("the forged library must be refused");
        let text = error.to_string();
        assert!(
            matches!(error, LoadError::ForeignPointer { ref what, .. } if what == "root module"),
            "{text}"
        );
        assert!(text.contains("root module points outside the library"), "{text}");
    }
}
