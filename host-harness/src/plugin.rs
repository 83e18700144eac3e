//! Finding and loading the provider library.
//!
//! Search order: `--plugin PATH`; `HOST_HARNESS_PLUGIN`; the active provider
//! of the providers directory ([`provider_host::providers`]); the CreateOS provider
//! next to the binary (where `cargo build` leaves it).

use provider_abi::{LogLevel, LogSink, SetupParams};
use provider_host::{
    hosted::{HookSupport, HostedProvider},
    providers::ProvidersDir,
};
use provider_host::{
    isolation::{IsolatedProvider, IsolationOptions},
    loader::{LoadError, LoadProblem, LoadedProvider},
    staging::Staged,
};
use std::path::{Path, PathBuf};

/// The provider library a run loads.
#[derive(Debug, Clone)]
pub enum Library {
    /// The file at this path, opened as [`LoadedProvider::load`] opens it.
    At(PathBuf),
    /// A private copy whose hash was checked (`--locked`): loaded in this
    /// process, or by workers told the hash to check.
    Staged(Staged),
}

impl Library {
    /// The library as the user named it.
    pub fn path(&self) -> &Path {
        match self {
            Library::At(path) => path,
            Library::Staged(staged) => staged.source(),
        }
    }
}

/// The environment variable naming a provider library (search step 2).
pub const PLUGIN_VARIABLE: &str = "HOST_HARNESS_PLUGIN";

/// Finds the provider library by the search order, or says in one line where
/// it looked and how to put one there.
pub fn find_plugin(flag: Option<&Path>, providers: &ProvidersDir) -> Result<PathBuf, String> {
    let variable = || std::env::var_os(PLUGIN_VARIABLE).filter(|value| !value.is_empty()).map(PathBuf::from);
    let beside = default_plugin_path();
    let found = flag.map(Path::to_path_buf).or_else(variable).or_else(|| providers.active_library());
    found.or_else(|| beside.exists().then(|| beside.clone())).ok_or_else(|| format!(
        "no provider found (searched --plugin, ${PLUGIN_VARIABLE}, the providers directory {} and {}): build one with `cargo build --locked --release -p {}`, then `host-harness providers install target/release/{}`",
        providers.root().display(),
        beside.display(),
        crate::embedded::BUNDLED_PROVIDER_CRATE,
        crate::embedded::bundled_library_name()
    ))
}

/// The CreateOS provider built next to the running harness binary: in the
/// binary's directory, or in `deps/` beside it (where cargo leaves it); the
/// newer of the two when both exist, since `cargo build -p host-harness`
/// refreshes only `deps/`.
pub fn default_plugin_path() -> PathBuf {
    let name = crate::embedded::bundled_library_name();
    let exe_dir =
        std::env::current_exe().ok().and_then(|exe| exe.parent().map(Path::to_path_buf)).unwrap_or_default();
    let modified = |path: &PathBuf| std::fs::metadata(path).and_then(|meta| meta.modified()).ok();
    [exe_dir.join(&name), exe_dir.join("deps").join(&name)]
        .into_iter()
        .filter_map(|path| modified(&path).map(|time| (time, path)))
        .max()
        .map(|(_, path)| path)
        .unwrap_or_else(|| exe_dir.join(name))
}

/// Loads the provider at `path` (the default when `None`) and runs `setup`
/// (see [`set_up`]).
pub fn load_provider(path: Option<&Path>) -> Result<LoadedProvider, LoadError> {
    let path = path.map(Path::to_path_buf).unwrap_or_else(default_plugin_path);
    load_library(&Library::At(path))
}

/// Loads `library` in this process and runs `setup` (see [`set_up`]).
pub fn load_library(library: &Library) -> Result<LoadedProvider, LoadError> {
    let provider = match library {
        Library::At(path) => LoadedProvider::load(path)?,
        Library::Staged(staged) => staged.load()?,
    };
    set_up(&provider, library.path())?;
    Ok(provider)
}

/// Runs the provider's `setup` with the log sink that re-emits its events
/// into the host's subscriber, up to the most verbose level the subscriber
/// wants (errors only when it wants none: they are dropped here); a failure
/// names the library at `path`.
pub fn set_up(provider: &dyn HookSupport, path: &Path) -> Result<(), LoadError> {
    let level = crate::provider_log::host_max_level().unwrap_or(LogLevel::Error);
    let host = SetupParams {
        host_name: env!("CARGO_PKG_NAME").into(),
        host_version: env!("CARGO_PKG_VERSION").into(),
    };
    provider
        .setup(&host, LogSink::new(crate::provider_log::emit), level)
        .map_err(|error| LoadProblem::ProviderFailed(error).at(path))
}

/// Loads `library` and runs `setup`: in this process, or with `isolation`
/// in worker processes (a staged copy's workers check its hash before
/// loading it). Errors are one line.
pub fn load_hosted(
    library: &Library,
    isolation: Option<&IsolationOptions>,
) -> Result<HostedProvider, String> {
    let Some(options) = isolation else {
        return load_library(library).map(HostedProvider::Loaded).map_err(|error| error.to_string());
    };
    let provider = match library {
        Library::At(path) => IsolatedProvider::start(path, options.clone()),
        Library::Staged(staged) => {
            let options =
                IsolationOptions { library_sha256: Some(staged.sha256().to_owned()), ..options.clone() };
            IsolatedProvider::start(staged.copy(), options)
        }
    }
    .map_err(|error| error.to_string())?;
    set_up(&provider, library.path()).map_err(|error| error.to_string())?;
    Ok(HostedProvider::Isolated(provider))
}
