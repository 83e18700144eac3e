//! Helpers for the end-to-end tests and benchmarks: locating the shared
//! libraries cargo built, the simulator test bed, and the out-of-process
//! worker baseline.

use std::path::PathBuf;

pub mod bed;
pub mod machine;
pub mod overload;
pub mod worker;

/// The directory holding this build's shared libraries (`target/<profile>/deps`).
pub fn deps_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    exe.parent().expect("test binary directory").to_path_buf()
}

/// The shared library built for crate `name` (e.g. `fixture_provider`).
pub fn library(name: &str) -> PathBuf {
    let file = provider_host::loader::library_file_name(name);
    let candidates = [deps_dir().join(&file), deps_dir().join("..").join(&file)];
    candidates
        .iter()
        .find(|path| path.exists())
        .cloned()
        .unwrap_or_else(|| panic!("{file} was not built; looked in {candidates:?}"))
}
