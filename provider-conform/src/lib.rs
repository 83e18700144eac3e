//! The conformance suite for sandbox providers: checks a provider library
//! against the lease contract, from a provider author's own `cargo test` or
//! from `host-harness conform`.
//!
//! Each [`Check`] pairs a name with the contract sentence it tests (the
//! sentences of the project's `docs/writing-a-provider.md`), and every
//! failure names both. The checks call the provider directly, through no
//! host policy and no ledger, and destroy every lease they acquire.
//!
//! In a provider crate's tests (`tests/conform.rs`), against the `cdylib`
//! cargo built for the crate:
//!
//! ```no_run
//! # fn main() {
//! let library = provider_conform::built_library("my_provider");
//! provider_conform::assert_conforms(&library, serde_json::json!({"root": "/tmp/leases"}));
//! # }
//! ```
//!
//! [`check_library`] returns the [`Report`] instead of asserting, and
//! [`run`] runs the checks against a provider already loaded, reporting each
//! as it finishes.

mod checks;
mod report;

pub use checks::{
    run, Check, CHECKS, CHECK_BOUND, COMMAND_TIMEOUT_MS, CONCURRENT_LEASES, TIMEOUT_SLACK, VALIDATE_BOUND,
};
pub use report::{CheckReport, Report, Summary, Verdict};

use provider_abi::{LogLevel, LogSink, Provider, SetupParams};
use provider_host::{
    environment::Environment,
    loader::{library_file_name, LoadError, LoadProblem, LoadedProvider},
};
use std::{
    ops::ControlFlow,
    path::{Path, PathBuf},
    sync::Arc,
};

/// The shared library cargo built for crate `crate_name` (its `lib` name:
/// `my_provider` for a package `my-provider`), found beside the running
/// test binary (`target/<profile>/deps`) or in its profile directory.
///
/// Panics, naming where it looked, when there is none: the crate's
/// `crate-type` must include `cdylib`, and a test of the same package
/// builds it.
pub fn built_library(crate_name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the path of the running test binary");
    let deps = exe.parent().expect("the test binary's directory");
    let file = library_file_name(crate_name);
    let candidates = [deps.join(&file), deps.join("..").join(&file)];
    candidates.iter().find(|path| path.is_file()).cloned().unwrap_or_else(|| {
        panic!("{file} was not built (looked in {candidates:?}): is `cdylib` among the crate's crate-type?")
    })
}

/// The company the checks of [`check_library`] act for.
pub const COMPANY: &str = "conform-company";
/// The environment the checks of [`check_library`] act in.
pub const ENVIRONMENT: &str = "conform-environment";

/// Loads the provider library at `library`, sets it up and runs every
/// check with the provider configuration `config`, for [`COMPANY`] in
/// [`ENVIRONMENT`]. The provider is shut down afterwards. Errors: the
/// library did not load, or its `setup` failed.
pub fn check_library(library: &Path, config: serde_json::Value) -> Result<Report, LoadError> {
    let provider = LoadedProvider::load(library)?;
    let setup = SetupParams::new(env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION"));
    provider
        .setup(&setup, LogSink::new(|_| {}), LogLevel::Error)
        .map_err(|error| LoadProblem::ProviderFailed(error).at(library))?;
    let provider = Arc::new(provider);
    let environment = Environment::new(COMPANY, ENVIRONMENT, config);
    let report = run(Arc::clone(&provider), &environment, &mut |_| ControlFlow::Continue(()));
    let _ = provider.shutdown();
    Ok(report)
}

/// Asserts that the provider library at `library` keeps the lease contract
/// with the provider configuration `config`: panics with every failed
/// check's line (the check, what happened and the contract sentence it
/// breaks) when one failed, or when the library does not load.
pub fn assert_conforms(library: &Path, config: serde_json::Value) {
    let report = check_library(library, config)
        .unwrap_or_else(|error| panic!("{} did not load: {error}", library.display()));
    assert!(report.conforms(), "{}", report.to_text());
}
