//! The host side of the boundary: loads a provider library and implements
//! [`Provider`] on it, so host code is the same for linked-in and loaded
//! providers.

use crate::{
    checked::CheckedFile,
    error::{HookResult, ProviderError},
    future::{HookFuture, Imported},
    image::LoadedImage,
    log::{LogLevel, LogSink},
    module::*,
    provider::{unsupported, Provider},
    recorder::{AsyncCreationRecorder, CreationRecorder},
    sink::{ByteSink, OutputSink, OwnedByteSink},
    source::OwnedByteSource,
    sync::{SyncParams, SyncResult},
    types::*,
    version::{
        AbiVersion, Hook, ABI_1_1, ABI_1_2, ABI_1_3, ABI_1_4, ABI_1_5, ABI_1_6, ABI_1_7, ABI_1_8, ABI_1_9,
        ABI_VERSION,
    },
};
use abi_stable::{
    abi_stability::abi_checking::check_layout_compatibility,
    library::{lib_header_from_path, LibHeader, LibraryError, RootModule},
    sabi_types::VersionNumber,
    std_types::RSome,
    type_layout::TypeLayout,
    StableAbi,
};
use std::{
    ffi::c_void,
    fmt,
    path::{Path, PathBuf},
};

/// Why a library could not be loaded as a provider. Every variant displays
/// as one line naming the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoadError {
    /// The file does not exist, cannot be read, or is not a regular file.
    Unreadable {
        /// The file.
        path: PathBuf,
        /// Why, in one line.
        reason: String,
    },
    /// The file is not a shared library the dynamic loader accepts.
    NotALibrary {
        /// The file.
        path: PathBuf,
        /// Why, in one line.
        reason: String,
    },
    /// The library exports no provider root module.
    NotAProvider {
        /// The file.
        path: PathBuf,
    },
    /// The provider was built for another major ABI version.
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
    LayoutMismatch {
        /// The file.
        path: PathBuf,
        /// The first line of abi_stable's account of the difference.
        detail: String,
    },
    /// The library's module hands over a function or table that lies outside
    /// the library itself (a forged or corrupt module).
    ForeignPointer {
        /// The file.
        path: PathBuf,
        /// Which part of the module (`ABI 1.1 hook table`...).
        what: String,
    },
    /// The object the dynamic loader mapped is not the file that was checked
    /// (the file was replaced between the check and the load, or the path
    /// was loaded from another file earlier in this process).
    NotTheCheckedFile {
        /// The file that was checked.
        path: PathBuf,
        /// Why, in one line.
        reason: String,
    },
    /// The provider failed to start (an error or panic in its constructor).
    ProviderFailed {
        /// The file.
        path: PathBuf,
        /// The provider's error.
        error: ProviderError,
    },
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadError::Unreadable { path, reason } => {
                write!(f, "cannot load provider {}: {reason}", path.display())
            }
            LoadError::NotALibrary { path, reason } => write!(
                f,
                "cannot load provider {}: not a loadable shared library ({reason})",
                path.display()
            ),
            LoadError::NotAProvider { path } => write!(
                f,
                "cannot load provider {}: the library exports no sandbox provider root module",
                path.display()
            ),
            LoadError::IncompatibleAbi { path, library, host } => write!(
                f,
                "cannot load provider {}: it was built for provider ABI {library}, this host speaks ABI {host} and loads only {}.x providers",
                path.display(),
                host.major
            ),
            LoadError::LayoutMismatch { path, detail } => write!(
                f,
                "cannot load provider {}: its ABI types do not match this host's ({detail})",
                path.display()
            ),
            LoadError::ForeignPointer { path, what } => write!(
                f,
                "cannot load provider {}: its {what} points outside the library (a forged or corrupt provider module)",
                path.display()
            ),
            LoadError::NotTheCheckedFile { path, reason } => write!(
                f,
                "cannot load provider {}: the object loaded is not the file that was checked: {reason}",
                path.display()
            ),
            LoadError::ProviderFailed { path, error } => write!(
                f,
                "cannot load provider {}: it failed to start: {error}",
                path.display()
            ),
        }
    }
}

impl std::error::Error for LoadError {}

impl LoadError {
    /// The same error naming `path` as the file: a host that loads a
    /// private copy of a library names the library it was given.
    pub fn naming(self, path: &Path) -> LoadError {
        let path = path.to_path_buf();
        match self {
            LoadError::Unreadable { reason, .. } => LoadError::Unreadable { path, reason },
            LoadError::NotALibrary { reason, .. } => LoadError::NotALibrary { path, reason },
            LoadError::NotAProvider { .. } => LoadError::NotAProvider { path },
            LoadError::IncompatibleAbi { library, host, .. } => {
                LoadError::IncompatibleAbi { path, library, host }
            }
            LoadError::LayoutMismatch { detail, .. } => LoadError::LayoutMismatch { path, detail },
            LoadError::ForeignPointer { what, .. } => LoadError::ForeignPointer { path, what },
            LoadError::NotTheCheckedFile { reason, .. } => LoadError::NotTheCheckedFile { path, reason },
            LoadError::ProviderFailed { error, .. } => LoadError::ProviderFailed { path, error },
        }
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
    library_abi: AbiVersion,
    instance: InstancePtr,
    drop_instance: extern "C" fn(InstancePtr),
    hooks: HookTableV1_0,
    hooks_v1_1: Option<&'static HookTableV1_1>,
    hooks_v1_2: Option<&'static HookTableV1_2>,
    hooks_v1_3: Option<&'static HookTableV1_3>,
    hooks_v1_4: Option<&'static HookTableV1_4>,
    hooks_v1_5: Option<&'static HookTableV1_5>,
    hooks_v1_6: Option<&'static HookTableV1_6>,
    hooks_v1_7: Option<&'static HookTableV1_7>,
    hooks_v1_8: Option<&'static HookTableV1_8>,
    hooks_v1_9: Option<&'static HookTableV1_9>,
    manifest: Manifest,
}

impl LoadedProvider {
    /// Loads the provider at `path` as a host of this crate's ABI version.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, LoadError> {
        Self::load_as(path, ABI_VERSION)
    }

    /// Loads the provider at `path` as a host of ABI `host_abi` would: hooks
    /// newer than `host_abi` are never looked up. The root module is frozen
    /// within a major version, so this is exactly what an older host does.
    ///
    /// `path` is made absolute and canonical first (a bare file name is a
    /// file in the current directory, never a search of the dynamic loader's
    /// path), only a regular file is opened, and the object mapped must be
    /// the file that was checked (same device and inode); errors name the
    /// canonical path.
    pub fn load_as(path: impl AsRef<Path>, host_abi: AbiVersion) -> Result<Self, LoadError> {
        let checked = CheckedFile::open(path.as_ref())?;
        let path = checked.path().to_path_buf();
        let (module, image) = open_module(checked, host_abi)?;
        let library_abi = module.abi_version();
        if library_abi.major != host_abi.major {
            return Err(LoadError::IncompatibleAbi {
                library: library_abi.to_string(),
                host: host_abi,
                path,
            });
        }
        check_root_module(&path, module, image)?;
        let hooks_v1_1 = if host_abi >= ABI_1_1 {
            extension_table::<HookTableV1_1>(&path, module, image, 1)?
        } else {
            None
        };
        let hooks_v1_2 = if host_abi >= ABI_1_2 {
            extension_table::<HookTableV1_2>(&path, module, image, 2)?
        } else {
            None
        };
        let hooks_v1_3 = if host_abi >= ABI_1_3 {
            extension_table::<HookTableV1_3>(&path, module, image, 3)?
        } else {
            None
        };
        let hooks_v1_4 = if host_abi >= ABI_1_4 {
            extension_table::<HookTableV1_4>(&path, module, image, 4)?
        } else {
            None
        };
        let hooks_v1_5 = if host_abi >= ABI_1_5 {
            extension_table::<HookTableV1_5>(&path, module, image, 5)?
        } else {
            None
        };
        let hooks_v1_6 = if host_abi >= ABI_1_6 {
            extension_table::<HookTableV1_6>(&path, module, image, 6)?
        } else {
            None
        };
        let hooks_v1_7 = if host_abi >= ABI_1_7 {
            extension_table::<HookTableV1_7>(&path, module, image, ABI_1_7.minor)?
        } else {
            None
        };
        let hooks_v1_8 = if host_abi >= ABI_1_8 {
            extension_table::<HookTableV1_8>(&path, module, image, ABI_1_8.minor)?
        } else {
            None
        };
        let hooks_v1_9 = if host_abi >= ABI_1_9 {
            extension_table::<HookTableV1_9>(&path, module, image, ABI_1_9.minor)?
        } else {
            None
        };
        let instance = Result::from((module.new_instance())())
            .map_err(|error| LoadError::ProviderFailed { path: path.clone(), error })?;
        let mut provider = Self {
            library_abi,
            instance,
            drop_instance: module.drop_instance(),
            hooks: module.hooks(),
            hooks_v1_1,
            hooks_v1_2,
            hooks_v1_3,
            hooks_v1_4,
            hooks_v1_5,
            hooks_v1_6,
            hooks_v1_7,
            hooks_v1_8,
            hooks_v1_9,
            manifest: empty_manifest(),
            path,
        };
        let mut manifest = Result::from((provider.hooks.manifest)(instance))
            .map_err(|error| LoadError::ProviderFailed { path: provider.path.clone(), error })?;
        manifest.abi_version = library_abi;
        manifest.hooks.retain(|name| Hook::from_name(name).is_some_and(|hook| provider.supports(hook)));
        provider.manifest = manifest;
        Ok(provider)
    }

    /// The file the provider was loaded from (absolute and canonical).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The ABI version the library was built for.
    pub fn library_abi(&self) -> AbiVersion {
        self.library_abi
    }

    /// True when this host can call `hook` on this library.
    pub fn supports(&self, hook: Hook) -> bool {
        match hook {
            Hook::InspectLease => self.hooks_v1_1.is_some(),
            Hook::AcquireLeaseRecording | Hook::ProbeRecording | Hook::ReleaseLeaseReporting => {
                self.hooks_v1_2.is_some()
            }
            Hook::ExecuteBytes | Hook::SetupWithLogs => self.hooks_v1_3.is_some(),
            Hook::SyncIn | Hook::SyncOut => self.hooks_v1_4.is_some(),
            Hook::ImportUnconfirmed => self.hooks_v1_5.is_some(),
            Hook::GrantRequestShare => self.hooks_v1_6.is_some(),
            Hook::AcquireLeaseRecordingAsync
            | Hook::ProbeRecordingAsync
            | Hook::SyncInAsync
            | Hook::SyncOutAsync => self.hooks_v1_8.is_some(),
            Hook::ExecuteStdinAsync => self.hooks_v1_9.is_some(),
            hook if hook.is_async() => self.hooks_v1_7.is_some(),
            _ => true,
        }
    }
}

/// Opens the library and checks, in order, that it is a shared object, that
/// it exports a provider root module, that the object mapped is the file
/// checked, that its major ABI version is ours and that its root module
/// layout matches; each failure is one line. Returns the module and the
/// loaded object it came from.
fn open_module(
    mut checked: CheckedFile,
    host_abi: AbiVersion,
) -> Result<(ProviderModuleRef, LoadedImage), LoadError> {
    let path = checked.path().to_path_buf();
    let path = path.as_path();
    #[cfg(target_os = "linux")]
    crate::elf::check_shared_object(checked.file_mut())
        .map_err(|reason| LoadError::NotALibrary { path: path.to_path_buf(), reason })?;
    checked.check_not_loaded_from_another_file()?;
    let header = lib_header_from_path(path).map_err(|error| match error {
        LibraryError::GetSymbolError { .. } => LoadError::NotAProvider { path: path.to_path_buf() },
        LibraryError::OpenError { err, .. } => {
            LoadError::NotALibrary { path: path.to_path_buf(), reason: dl_reason(&err.to_string(), path) }
        }
        other => LoadError::LayoutMismatch { path: path.to_path_buf(), detail: first_line(&other) },
    })?;
    let image = LoadedImage::containing((header as *const LibHeader).cast()).ok_or_else(|| {
        LoadError::ForeignPointer { path: path.to_path_buf(), what: "library header".into() }
    })?;
    checked.check_mapped(image)?;
    let consts = header.root_mod_consts();
    if consts.base_name().as_str() != ProviderModuleRef::BASE_NAME {
        return Err(LoadError::NotAProvider { path: path.to_path_buf() });
    }
    let version = VersionNumber::new(header.version_strings()).map_err(|error| {
        LoadError::LayoutMismatch { path: path.to_path_buf(), detail: first_line(&error) }
    })?;
    if version.major != u32::from(host_abi.major) {
        return Err(LoadError::IncompatibleAbi {
            path: path.to_path_buf(),
            library: format!("{}.{}", version.major, version.minor),
            host: host_abi,
        });
    }
    let module = header.init_root_module::<ProviderModuleRef>().map_err(|error| {
        LoadError::LayoutMismatch { path: path.to_path_buf(), detail: first_line(&error) }
    })?;
    Ok((module, image))
}

/// Checks that every function the root module hands over lies in `image`.
fn check_root_module(path: &Path, module: ProviderModuleRef, image: LoadedImage) -> Result<(), LoadError> {
    let entry_points = [
        module.new_instance() as *const c_void,
        module.drop_instance() as *const c_void,
        module.extension() as *const c_void,
    ];
    check_addresses(path, image, "root module", &entry_points)?;
    check_addresses(path, image, "ABI 1.0 hook table", &module.hooks().code_addresses())
}

/// Refuses the library unless every one of `addresses` lies in `image`.
fn check_addresses(
    path: &Path,
    image: LoadedImage,
    what: &str,
    addresses: &[*const c_void],
) -> Result<(), LoadError> {
    if addresses.iter().all(|&address| image.contains(address)) {
        Ok(())
    } else {
        Err(LoadError::ForeignPointer { path: path.to_path_buf(), what: what.to_owned() })
    }
}

/// Fetches and checks the extension table of `minor`, if the library has it:
/// its layout pointer and table lie in the library, the layout matches `T`'s,
/// and every function of the table lies in the library too.
fn extension_table<T: StableAbi + CodeAddresses + 'static>(
    path: &Path,
    module: ProviderModuleRef,
    image: LoadedImage,
    minor: u16,
) -> Result<Option<&'static T>, LoadError> {
    let RSome(extension) = (module.extension())(minor) else {
        return Ok(None);
    };
    let what = format!("ABI 1.{minor} hook table");
    check_addresses(path, image, &what, &[extension.layout(), extension.table()])?;
    // SAFETY: `Extension::new`'s contract, which every library upholds unless
    // it uses `unsafe` to lie: `layout` is a `&'static TypeLayout`. The pointer
    // was just checked to lie inside the library, which is never unloaded.
    let layout = unsafe { &*extension.layout().cast::<TypeLayout>() };
    check_layout_compatibility(T::LAYOUT, layout).map_err(|error| LoadError::LayoutMismatch {
        path: path.to_path_buf(),
        detail: first_line(&error),
    })?;
    // SAFETY: by the same contract `table` is a `&'static` value of the type
    // `layout` describes, which was just checked to be compatible with `T`.
    let table = unsafe { &*extension.table().cast::<T>() };
    check_addresses(path, image, &what, &table.code_addresses())?;
    Ok(Some(table))
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

fn empty_manifest() -> Manifest {
    Manifest {
        id: Default::default(),
        version: Default::default(),
        display_name: Default::default(),
        driver_key: Default::default(),
        abi_version: ABI_VERSION,
        hooks: Default::default(),
        config_schema_json: Default::default(),
    }
}

impl Drop for LoadedProvider {
    fn drop(&mut self) {
        // Runs once per instance, after every `&self` call has returned; the
        // instance pointer never leaves this struct.
        (self.drop_instance)(self.instance);
    }
}

impl Provider for LoadedProvider {
    fn manifest(&self) -> Manifest {
        self.manifest.clone()
    }

    fn setup(&self, params: &SetupParams) -> HookResult<()> {
        (self.hooks.setup)(self.instance, params).into()
    }

    fn shutdown(&self) -> HookResult<()> {
        (self.hooks.shutdown)(self.instance).into()
    }

    fn health(&self) -> HookResult<HealthReport> {
        (self.hooks.health)(self.instance).into()
    }

    fn validate_config(&self, params: &EnvironmentParams) -> HookResult<ValidationReport> {
        (self.hooks.validate_config)(self.instance, params).into()
    }

    fn probe(&self, params: &EnvironmentParams) -> HookResult<ProbeReport> {
        (self.hooks.probe)(self.instance, params).into()
    }

    fn acquire_lease(&self, params: &AcquireParams) -> HookResult<Lease> {
        (self.hooks.acquire_lease)(self.instance, params).into()
    }

    fn resume_lease(&self, params: &LeaseParams) -> HookResult<Lease> {
        (self.hooks.resume_lease)(self.instance, params).into()
    }

    fn release_lease(&self, params: &LeaseParams) -> HookResult<()> {
        (self.hooks.release_lease)(self.instance, params).into()
    }

    fn destroy_lease(&self, params: &LeaseParams) -> HookResult<()> {
        (self.hooks.destroy_lease)(self.instance, params).into()
    }

    fn realize_workspace(&self, params: &LeaseParams) -> HookResult<Workspace> {
        (self.hooks.realize_workspace)(self.instance, params).into()
    }

    fn execute(&self, params: &ExecuteParams, output: &mut OutputSink<'_>) -> HookResult<ExecuteResult> {
        (self.hooks.execute)(self.instance, params, output).into()
    }

    fn inspect_lease(&self, params: &LeaseParams) -> HookResult<LeaseStatus> {
        match self.hooks_v1_1 {
            Some(table) => (table.inspect_lease)(self.instance, params).into(),
            None => Err(unsupported(Hook::InspectLease)),
        }
    }

    fn acquire_lease_recording(
        &self,
        params: &AcquireParams,
        recorder: &mut CreationRecorder<'_>,
    ) -> HookResult<Lease> {
        match self.hooks_v1_2 {
            Some(table) => (table.acquire_lease_recording)(self.instance, params, recorder).into(),
            None => Err(unsupported(Hook::AcquireLeaseRecording)),
        }
    }

    fn probe_recording(
        &self,
        params: &EnvironmentParams,
        recorder: &mut CreationRecorder<'_>,
    ) -> HookResult<ProbeReport> {
        match self.hooks_v1_2 {
            Some(table) => (table.probe_recording)(self.instance, params, recorder).into(),
            None => Err(unsupported(Hook::ProbeRecording)),
        }
    }

    fn release_lease_reporting(&self, params: &LeaseParams) -> HookResult<ReleaseReport> {
        match self.hooks_v1_2 {
            Some(table) => (table.release_lease_reporting)(self.instance, params).into(),
            None => Err(unsupported(Hook::ReleaseLeaseReporting)),
        }
    }

    fn execute_bytes(&self, params: &ExecuteParams, output: &mut ByteSink<'_>) -> HookResult<ExecuteResult> {
        match self.hooks_v1_3 {
            Some(table) => (table.execute_bytes)(self.instance, params, output).into(),
            None => Err(unsupported(Hook::ExecuteBytes)),
        }
    }

    fn setup_with_logs(&self, params: &SetupParams, logs: LogSink, max_level: LogLevel) -> HookResult<()> {
        match self.hooks_v1_3 {
            Some(table) => (table.setup_with_logs)(self.instance, params, logs, max_level).into(),
            None => Err(unsupported(Hook::SetupWithLogs)),
        }
    }

    fn sync_in(&self, params: &SyncParams) -> HookResult<SyncResult> {
        match self.hooks_v1_4 {
            Some(table) => (table.sync_in)(self.instance, params).into(),
            None => Err(unsupported(Hook::SyncIn)),
        }
    }

    fn sync_out(&self, params: &SyncParams) -> HookResult<SyncResult> {
        match self.hooks_v1_4 {
            Some(table) => (table.sync_out)(self.instance, params).into(),
            None => Err(unsupported(Hook::SyncOut)),
        }
    }

    fn import_unconfirmed(&self, params: &LeaseParams) -> HookResult<()> {
        match self.hooks_v1_5 {
            Some(table) => (table.import_unconfirmed)(self.instance, params).into(),
            None => Err(unsupported(Hook::ImportUnconfirmed)),
        }
    }

    fn grant_request_share(&self, parts_per_million: u32) -> HookResult<()> {
        match self.hooks_v1_6 {
            Some(table) => (table.grant_request_share)(self.instance, parts_per_million).into(),
            None => Err(unsupported(Hook::GrantRequestShare)),
        }
    }

    fn health_async(&self) -> HookFuture<HealthReport> {
        self.call_async(Hook::HealthAsync, |table, instance| (table.health_async)(instance))
    }

    fn probe_async(&self, params: EnvironmentParams) -> HookFuture<ProbeReport> {
        self.call_async(Hook::ProbeAsync, |table, instance| (table.probe_async)(instance, &params))
    }

    fn acquire_lease_async(&self, params: AcquireParams) -> HookFuture<Lease> {
        self.call_async(Hook::AcquireLeaseAsync, |table, instance| {
            (table.acquire_lease_async)(instance, &params)
        })
    }

    fn resume_lease_async(&self, params: LeaseParams) -> HookFuture<Lease> {
        self.call_async(Hook::ResumeLeaseAsync, |table, instance| {
            (table.resume_lease_async)(instance, &params)
        })
    }

    fn release_lease_async(&self, params: LeaseParams) -> HookFuture<ReleaseReport> {
        self.call_async(Hook::ReleaseLeaseAsync, |table, instance| {
            (table.release_lease_async)(instance, &params)
        })
    }

    fn destroy_lease_async(&self, params: LeaseParams) -> HookFuture<()> {
        self.call_async(Hook::DestroyLeaseAsync, |table, instance| {
            (table.destroy_lease_async)(instance, &params)
        })
    }

    fn execute_async(&self, params: ExecuteParams, output: OwnedByteSink) -> HookFuture<ExecuteResult> {
        self.call_async(Hook::ExecuteAsync, |table, instance| {
            (table.execute_async)(instance, &params, output)
        })
    }

    fn acquire_lease_recording_async(
        &self,
        params: AcquireParams,
        recorder: AsyncCreationRecorder,
    ) -> HookFuture<Lease> {
        self.call_async_1_8(Hook::AcquireLeaseRecordingAsync, |table, instance| {
            (table.acquire_lease_recording_async)(instance, &params, recorder)
        })
    }

    fn probe_recording_async(
        &self,
        params: EnvironmentParams,
        recorder: AsyncCreationRecorder,
    ) -> HookFuture<ProbeReport> {
        self.call_async_1_8(Hook::ProbeRecordingAsync, |table, instance| {
            (table.probe_recording_async)(instance, &params, recorder)
        })
    }

    fn sync_in_async(&self, params: SyncParams) -> HookFuture<SyncResult> {
        self.call_async_1_8(Hook::SyncInAsync, |table, instance| (table.sync_in_async)(instance, &params))
    }

    fn sync_out_async(&self, params: SyncParams) -> HookFuture<SyncResult> {
        self.call_async_1_8(Hook::SyncOutAsync, |table, instance| (table.sync_out_async)(instance, &params))
    }

    fn execute_stdin_async(
        &self,
        params: ExecuteParams,
        stdin: OwnedByteSource,
        output: OwnedByteSink,
    ) -> HookFuture<ExecuteResult> {
        import(Hook::ExecuteStdinAsync, self.hooks_v1_9, self.instance, |table, instance| {
            (table.execute_stdin_async)(instance, &params, stdin, output)
        })
    }
}

impl LoadedProvider {
    /// Calls an async hook of the 1.7 table, or answers `unsupported`. The
    /// call returns at once (the provider runs the work on its own runtime)
    /// and the future it hands back owns everything it needs.
    fn call_async<T: Send + 'static>(
        &self,
        hook: Hook,
        call: impl FnOnce(&'static HookTableV1_7, InstancePtr) -> FfiHookFuture<T>,
    ) -> HookFuture<T> {
        import(hook, self.hooks_v1_7, self.instance, call)
    }

    /// Calls an async hook of the 1.8 table, or answers `unsupported`, as
    /// [`LoadedProvider::call_async`] does for the 1.7 table.
    fn call_async_1_8<T: Send + 'static>(
        &self,
        hook: Hook,
        call: impl FnOnce(&'static HookTableV1_8, InstancePtr) -> FfiHookFuture<T>,
    ) -> HookFuture<T> {
        import(hook, self.hooks_v1_8, self.instance, call)
    }
}

/// Calls an async hook of `table`, or answers `unsupported` without one.
fn import<Table, T: Send + 'static>(
    hook: Hook,
    table: Option<&'static Table>,
    instance: InstancePtr,
    call: impl FnOnce(&'static Table, InstancePtr) -> FfiHookFuture<T>,
) -> HookFuture<T> {
    match table {
        Some(table) => Box::pin(Imported::new(hook, call(table, instance))),
        None => crate::future::ready(Err(unsupported(hook))),
    }
}
