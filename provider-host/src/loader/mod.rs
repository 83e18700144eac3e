//! Loading a provider library: the checks before and after the dynamic
//! loader maps it (a regular file, an ELF shared object whose segments lie
//! inside it, the object mapped is the file checked, a provider root module
//! of this host's major ABI version whose every address lies inside the
//! library), and [`LoadedProvider`], which implements [`Provider`](provider_abi::Provider) on it.

mod checked;
#[cfg(target_os = "linux")]
mod elf;
mod image;

pub use checked::open_library;

use abi_stable::{
    abi_stability::abi_checking::{check_layout_compatibility_with_globals, CheckingGlobals},
    library::{lib_header_from_path, LibHeader, LibraryError, RootModule},
    sabi_types::VersionNumber,
    StableAbi,
};
use checked::CheckedFile;
use image::LoadedImage;
use provider_abi::{AbiVersion, Hook, Instance, ProviderError, ProviderModuleRef, ABI_VERSION};
use std::{
    fmt,
    path::{Path, PathBuf},
};

/// Why a library could not be loaded as a provider. Every variant displays
/// as one line naming the file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LoadError {
    /// The file does not exist, cannot be read, or is not a regular file.
    #[error("cannot load provider {}: {reason}", .path.display())]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// Why, in one line.
        reason: String,
    },
    /// The file is not a shared library the dynamic loader accepts.
    #[error("cannot load provider {}: not a loadable shared library ({reason})", .path.display())]
    NotALibrary {
        /// The file.
        path: PathBuf,
        /// Why, in one line.
        reason: String,
    },
    /// The library exports no provider root module.
    #[error("cannot load provider {}: the library exports no sandbox provider root module", .path.display())]
    NotAProvider {
        /// The file.
        path: PathBuf,
    },
    /// The provider was built for another major ABI version.
    #[error(
        "cannot load provider {}: built against provider ABI {library}; this host loads {}.x: rebuild the provider against provider-abi {}",
        .path.display(), .host.major, .host.major
    )]
    IncompatibleAbi {
        /// The file.
        path: PathBuf,
        /// The library's ABI version.
        library: String,
        /// This host's ABI version.
        host: AbiVersion,
    },
    /// The provider's types do not match this host's (a corrupt or
    /// mislabelled build).
    #[error("cannot load provider {}: its ABI types do not match this host's ({detail})", .path.display())]
    LayoutMismatch {
        /// The file.
        path: PathBuf,
        /// The first line of abi_stable's account of the difference.
        detail: String,
    },
    /// The library's module hands over a function or table that lies outside
    /// the library itself (a forged or corrupt module).
    #[error(
        "cannot load provider {}: its {what} points outside the library (a forged or corrupt provider module)",
        .path.display()
    )]
    ForeignPointer {
        /// The file.
        path: PathBuf,
        /// Which part of the module (`health hook`...).
        what: String,
    },
    /// The object the dynamic loader mapped is not the file that was checked
    /// (the file was replaced between the check and the load, or the path
    /// was loaded from another file earlier in this process).
    #[error("cannot load provider {}: the object loaded is not the file that was checked: {reason}", .path.display())]
    NotTheCheckedFile {
        /// The file that was checked.
        path: PathBuf,
        /// Why, in one line.
        reason: String,
    },
    /// The provider failed to start (an error or panic in its constructor).
    #[error("cannot load provider {}: it failed to start: {error}", .path.display())]
    ProviderFailed {
        /// The file.
        path: PathBuf,
        /// The provider's error.
        error: ProviderError,
    },
}

impl LoadError {
    /// The same error naming `path` as the file: a host that loads a
    /// private copy of a library names the library it was given.
    pub fn naming(mut self, named: &Path) -> LoadError {
        match &mut self {
            LoadError::Unreadable { path, .. }
            | LoadError::NotALibrary { path, .. }
            | LoadError::NotAProvider { path }
            | LoadError::IncompatibleAbi { path, .. }
            | LoadError::LayoutMismatch { path, .. }
            | LoadError::ForeignPointer { path, .. }
            | LoadError::NotTheCheckedFile { path, .. }
            | LoadError::ProviderFailed { path, .. } => *path = named.to_path_buf(),
        }
        self
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
        let checked = CheckedFile::open(path.as_ref())?;
        let path = checked.path.clone();
        let (module, image) = open_module(checked)?;
        let library_abi = module.library_abi();
        if library_abi.major != ABI_VERSION.major {
            return Err(LoadError::IncompatibleAbi {
                library: library_abi.to_string(),
                host: ABI_VERSION,
                path,
            });
        }
        for (what, address) in module.code_addresses() {
            if !image.contains(address) {
                return Err(LoadError::ForeignPointer { path, what: what.to_owned() });
            }
        }
        // SAFETY: `module` is the root module abi_stable loaded (and checked
        // the layout of) from a library it never unloads, and every address
        // it hands over was just checked to lie inside that library.
        let instance = unsafe { Instance::new(module) }
            .map_err(|error| LoadError::ProviderFailed { path: path.clone(), error })?;
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
/// checked, that its major ABI version is ours and that its root module
/// layout matches; each failure is one line. Returns the module and the
/// loaded object it came from.
fn open_module(mut checked: CheckedFile) -> Result<(ProviderModuleRef, LoadedImage), LoadError> {
    let path = checked.path.clone();
    let path = path.as_path();
    let not_a_provider = || LoadError::NotAProvider { path: path.to_path_buf() };
    let mismatch = |detail: &dyn fmt::Display| LoadError::LayoutMismatch {
        path: path.to_path_buf(),
        detail: first_line(detail),
    };
    #[cfg(target_os = "linux")]
    elf::check_shared_object(&mut checked.file)
        .map_err(|reason| LoadError::NotALibrary { path: path.to_path_buf(), reason })?;
    checked.check_not_loaded_from_another_file()?;
    let header = lib_header_from_path(path).map_err(|error| match error {
        LibraryError::GetSymbolError { .. } => not_a_provider(),
        LibraryError::OpenError { err, .. } => {
            LoadError::NotALibrary { path: path.to_path_buf(), reason: dl_reason(&err.to_string(), path) }
        }
        other => mismatch(&other),
    })?;
    let image = LoadedImage::containing((header as *const LibHeader).cast()).ok_or_else(|| {
        LoadError::ForeignPointer { path: path.to_path_buf(), what: "library header".into() }
    })?;
    checked.check_mapped(image)?;
    let consts = header.root_mod_consts();
    if consts.base_name().as_str() != ProviderModuleRef::BASE_NAME {
        return Err(not_a_provider());
    }
    let version = VersionNumber::new(header.version_strings()).map_err(|error| mismatch(&error))?;
    if version.major != u32::from(ABI_VERSION.major) {
        return Err(LoadError::IncompatibleAbi {
            path: path.to_path_buf(),
            library: format!("{}.{}", version.major, version.minor),
            host: ABI_VERSION,
        });
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
    Ok((module, image))
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
