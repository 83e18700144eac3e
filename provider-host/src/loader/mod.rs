//! Loading a provider library: the checks before and after the dynamic
//! loader maps it (a regular file, an ELF shared object whose segments lie
//! inside it, the object mapped is the file checked, a provider root module
//! of this host's major ABI version whose every address lies inside the
//! library), and [`LoadedProvider`], which implements [`Provider`](provider_abi::Provider) on it.

mod checked;
#[cfg(target_os = "linux")]
mod elf;
mod image;

pub use checked::{open_library, CheckedFile};

use abi_stable::{
    abi_stability::abi_checking::{check_layout_compatibility_with_globals, CheckingGlobals},
    library::{lib_header_from_path, LibHeader, LibraryError, RootModule},
    sabi_types::VersionNumber,
    StableAbi,
};
use image::LoadedImage;
use provider_abi::{AbiVersion, Hook, Instance, ProviderError, ProviderModuleRef, ABI_VERSION};
use std::{
    fmt,
    path::{Path, PathBuf},
};

/// Why a library could not be loaded as a provider: the file and what is
/// wrong with it. Displays as one line naming the file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot load provider {}: {problem}", .path.display())]
pub struct LoadError {
    /// The file.
    pub path: PathBuf,
    /// What is wrong with it.
    pub problem: LoadProblem,
}

/// What is wrong with a library that could not be loaded; each displays as
/// one line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LoadProblem {
    /// The file does not exist, cannot be read, or is not a regular file
    /// (why, in one line).
    #[error("{0}")]
    Unreadable(String),
    /// The file is not a shared library the dynamic loader accepts (why, in
    /// one line).
    #[error("not a loadable shared library ({0})")]
    NotALibrary(String),
    /// The library exports no provider root module.
    #[error("the library exports no sandbox provider root module")]
    NotAProvider,
    /// The provider was built for another major ABI version.
    #[error(
        "built against provider ABI {library}; this host loads {}.x: rebuild the provider against provider-abi {}",
        .host.major, .host.major
    )]
    IncompatibleAbi {
        /// The library's ABI version.
        library: String,
        /// This host's ABI version.
        host: AbiVersion,
    },
    /// The provider's types do not match this host's (a corrupt or
    /// mislabelled build): the first line of abi_stable's account of the
    /// difference.
    #[error("its ABI types do not match this host's ({0})")]
    LayoutMismatch(String),
    /// The library's module hands over a function or table that lies outside
    /// the library itself (a forged or corrupt module): which part of the
    /// module (`health hook`...).
    #[error("its {0} points outside the library (a forged or corrupt provider module)")]
    ForeignPointer(String),
    /// The object the dynamic loader mapped is not the file that was checked
    /// (the file was replaced between the check and the load, or the path
    /// was loaded from another file earlier in this process): why, in one
    /// line.
    #[error("the object loaded is not the file that was checked: {0}")]
    NotTheCheckedFile(String),
    /// The provider failed to start (an error or panic in its constructor).
    #[error("it failed to start: {0}")]
    ProviderFailed(ProviderError),
}

impl LoadProblem {
    /// This problem of the file at `path`.
    pub fn at(self, path: impl Into<PathBuf>) -> LoadError {
        LoadError { path: path.into(), problem: self }
    }
}

/// The file name cargo gives the `cdylib` of crate `crate_name` on this
/// platform (`libcreateos_provider.so` for `createos_provider` on Linux).
pub fn library_file_name(crate_name: &str) -> String {
    format!("{}{crate_name}{}", std::env::consts::DLL_PREFIX, std::env::consts::DLL_SUFFIX)
}

/// A provider loaded from a shared library.
///
/// The library stays loaded for the life of the process (abi_stable never
/// unloads); dropping this drops the provider instance. Libraries at two
/// different paths load side by side, even two versions of one provider.
pub struct LoadedProvider {
    path: PathBuf,
    instance: Instance,
}

impl LoadedProvider {
    /// Loads the provider at `path`.
    ///
    /// `path` is made absolute and canonical first (a bare file name is a
    /// file in the current directory, never a search of the dynamic loader's
    /// path), only a regular file is opened, and the object mapped must be
    /// the file that was checked (same device and inode); errors name the
    /// canonical path.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, LoadError> {
        let checked = open_library(path.as_ref())?;
        let path = checked.path.clone();
        let instance = open_instance(checked).map_err(|problem| problem.at(&path))?;
        Ok(Self { path, instance })
    }

    /// The file the provider was loaded from (absolute and canonical).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The ABI version the library was built for.
    pub fn library_abi(&self) -> AbiVersion {
        self.instance.library_abi()
    }

    /// True when the library's table has `hook`.
    pub fn supports(&self, hook: Hook) -> bool {
        self.instance.supports(hook)
    }

    /// Runs `call` on the provider instance (the hooks' forwarding).
    fn with<T>(&self, call: impl FnOnce(&Instance) -> T) -> T {
        call(&self.instance)
    }
}

/// Opens the library and checks, in order, that it is a shared object, that
/// it exports a provider root module, that the object mapped is the file
/// checked, that its major ABI version is ours, that its root module layout
/// matches and that every address it hands over lies inside the library,
/// then starts the provider; each failure is one line.
fn open_instance(mut checked: CheckedFile) -> Result<Instance, LoadProblem> {
    let mismatch = |detail: &dyn fmt::Display| LoadProblem::LayoutMismatch(first_line(detail));
    #[cfg(target_os = "linux")]
    elf::check_shared_object(&mut checked.file).map_err(LoadProblem::NotALibrary)?;
    checked.check_not_loaded_from_another_file()?;
    let header = lib_header_from_path(&checked.path).map_err(|error| match error {
        LibraryError::GetSymbolError { .. } => LoadProblem::NotAProvider,
        LibraryError::OpenError { err, .. } => {
            LoadProblem::NotALibrary(dl_reason(&err.to_string(), &checked.path))
        }
        other => mismatch(&other),
    })?;
    let image = LoadedImage::containing((header as *const LibHeader).cast())
        .ok_or_else(|| LoadProblem::ForeignPointer("library header".into()))?;
    checked.check_mapped(image)?;
    let consts = header.root_mod_consts();
    if consts.base_name().as_str() != ProviderModuleRef::BASE_NAME {
        return Err(LoadProblem::NotAProvider);
    }
    let version = VersionNumber::new(header.version_strings()).map_err(|error| mismatch(&error))?;
    if version.major != u32::from(ABI_VERSION.major) {
        let library = format!("{}.{}", version.major, version.minor);
        return Err(LoadProblem::IncompatibleAbi { library, host: ABI_VERSION });
    }
    let module = if version.minor < u32::from(ABI_VERSION.minor) {
        // abi_stable checks a module with the host's definitions as the
        // expected layout, and refuses a host table with more fields than
        // the library's. A library of an older minor version has a table
        // that is a prefix of ours, so it is checked the other way round
        // (its layout as the expected one), and the hooks appended since
        // read as absent through the table's accessors. The fixture
        // `fixture-next-minor`'s tests prove both directions.
        //
        // The check runs with checking state of its own: abi_stable's
        // process-wide state keeps the prefix types' layouts of the checks
        // made, and this one would leave the library's shorter table there,
        // against which an ordinary load of a library of this host's minor
        // version later in the process fails (host-harness's test
        // `a_library_of_an_older_minor_loaded_first_leaves_the_newer_ones_loadable`).
        let library =
            header.layout().ok_or_else(|| mismatch(&"the library declares no root module layout"))?;
        check_layout_compatibility_with_globals(library, ProviderModuleRef::LAYOUT, &CheckingGlobals::new())
            .map_err(|error| mismatch(&error))?;
        // SAFETY: the layouts were just checked, with the library's as the
        // expected one; fields past the library's are read through
        // accessors that check they exist.
        unsafe { header.init_root_module_with_unchecked_layout::<ProviderModuleRef>() }
            .map_err(|error| mismatch(&error))?
    } else {
        header.init_root_module::<ProviderModuleRef>().map_err(|error| mismatch(&error))?
    };
    let library_abi = module.library_abi();
    if library_abi.major != ABI_VERSION.major {
        return Err(LoadProblem::IncompatibleAbi { library: library_abi.to_string(), host: ABI_VERSION });
    }
    for (what, address) in module.code_addresses() {
        if !image.contains(address) {
            return Err(LoadProblem::ForeignPointer(what.to_owned()));
        }
    }
    // SAFETY: `module` is the root module abi_stable loaded (and checked
    // the layout of) from a library it never unloads, and every address
    // it hands over was just checked to lie inside that library.
    unsafe { Instance::new(module) }.map_err(LoadProblem::ProviderFailed)
}

/// The first line of an error's text, trimmed to 300 characters.
fn first_line(error: &dyn fmt::Display) -> String {
    let text = error.to_string();
    let line = text.lines().map(str::trim).find(|line| !line.is_empty()).unwrap_or("unknown error");
    line.chars().take(300).collect()
}

/// The dynamic loader's reason without the repeated path.
fn dl_reason(message: &str, path: &Path) -> String {
    let line = first_line(&message);
    let shown = path.display().to_string();
    line.rsplit_once(&format!("{shown}: ")).map(|(_, reason)| reason.to_owned()).unwrap_or(line)
}

crate::forward::forward_provider!(LoadedProvider, with);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_is_shown_by_its_first_non_blank_line_trimmed_and_bounded() {
        assert_eq!(first_line(&"\n  \n  the reason  \nmore detail"), "the reason");
        assert_eq!(first_line(&""), "unknown error");
        assert_eq!(first_line(&" \n\t"), "unknown error");
        let long = "x".repeat(400);
        assert_eq!(first_line(&long), "x".repeat(300));
    }

    #[test]
    fn the_dynamic_loaders_reason_is_shown_without_the_path_it_repeats() {
        let path = Path::new("/opt/providers/libp.so");
        let message = "/opt/providers/libp.so: undefined symbol: missing_function\nsecond line";
        assert_eq!(dl_reason(message, path), "undefined symbol: missing_function");
        // A reason that does not repeat the path is shown as it is.
        assert_eq!(dl_reason("file too short", path), "file too short");
    }
}
