//! A library can always lie, but the loader ties what it calls to what it
//! checked: the `forged_provider` example has the genuine ABI 1.1 layouts and
//! an extension table that points at data, and must be refused in one line;
//! the `foreign_provider` example's root module hands over a function of
//! the C library, and must be refused before anything is called.

use provider_abi::{library_file_name, LoadError, LoadedProvider, ABI_1_0, ABI_1_1};
use std::path::PathBuf;

/// The example library cargo built beside this test (`target/<profile>/examples`).
fn forged_library() -> PathBuf {
    example_library("forged_provider")
}

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
fn a_forged_extension_table_that_points_at_data_is_refused() {
    let path = forged_library();
    let error = LoadedProvider::load_as(&path, ABI_1_1).err().expect("the forged library must be refused");
    let text = error.to_string();
    assert!(matches!(error, LoadError::ForeignPointer { .. }), "{text}");
    assert!(text.contains("ABI 1.1 hook table points outside the library"), "{text}");
    assert!(!text.contains('\n'), "{text}");
}

#[test]
fn a_host_that_never_asks_for_the_table_is_not_fooled_either() {
    // A 1.0 host never reads the forged table; the forged constructor fails.
    let error = LoadedProvider::load_as(forged_library(), ABI_1_0).err().expect("no instance");
    assert!(matches!(error, LoadError::ProviderFailed { .. }), "{error}");
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
