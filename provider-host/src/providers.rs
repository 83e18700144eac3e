//! The providers directory: installed provider libraries, one folder per
//! version, and which one is active.
//!
//! Layout under the root (`$XDG_DATA_HOME/host-harness/providers`, or
//! `~/.local/share/host-harness/providers`):
//!
//! ```text
//! <provider id>/<version>/<library file>    the library, as installed
//! <provider id>/<version>/installed.json    its id, version, ABI and SHA-256
//! active                                    `<provider id>@<version>`
//! ```
//!
//! A library is checked exactly as a load would check it before anything is
//! written, through a private copy ([`crate::staging`]): what is checked,
//! hashed and installed are the same bytes. That copy is copied into a
//! temporary folder beside its final one and renamed into place, so a
//! half-copied library is never visible; the `active` record is replaced the
//! same way.

use crate::staging::Staging;
use provider_abi::Provider;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::{
    fs, io,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
};

/// What `installed.json` records about an installed library.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Installed {
    /// The provider id from its manifest (`createos`).
    pub id: String,
    /// The provider's version from its manifest.
    pub version: String,
    /// The ABI version the library was built for.
    pub abi: String,
    /// SHA-256 of the library file, lowercase hex.
    pub sha256: String,
    /// The library's file name inside its version folder.
    pub file: String,
}

impl Installed {
    /// `id@version`.
    pub fn spec(&self) -> String {
        format!("{}@{}", self.id, self.version)
    }
}

/// One installed version, as `providers list` shows it (ordered by id and
/// version).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Entry {
    /// What was recorded at install.
    pub installed: Installed,
    /// The library's path.
    pub path: PathBuf,
    /// True for the active version.
    pub active: bool,
}

/// Why a providers-directory operation failed; one line each.
#[derive(Debug, thiserror::Error)]
pub enum ProvidersError {
    /// The library failed the checks a load makes.
    #[error("{0}")]
    NotAProvider(String),
    /// This version is installed already, from a library with another hash.
    #[error(
        "{spec} is already installed from another library (installed sha256 {installed}, this one {offered}); use --force to replace it"
    )]
    HashMismatch {
        /// `id@version`.
        spec: String,
        /// The installed library's hash.
        installed: String,
        /// The offered library's hash.
        offered: String,
    },
    /// No such installed version.
    #[error("{0} is not installed (see `host-harness providers list`)")]
    NotInstalled(String),
    /// The active version cannot be removed.
    #[error("{0} is the active version; make another active first (`providers use ID@VERSION`)")]
    Active(String),
    /// `ID@VERSION` was malformed.
    #[error("`{0}` is not ID@VERSION")]
    BadSpec(String),
    /// The directory could not be read or written.
    #[error("cannot {doing}: {error}")]
    Io {
        /// What was being done.
        doing: String,
        /// The error.
        error: io::Error,
    },
}

fn io(doing: impl Into<String>) -> impl FnOnce(io::Error) -> ProvidersError {
    let doing = doing.into();
    move |error| ProvidersError::Io { doing, error }
}

/// The providers directory.
#[derive(Debug, Clone)]
pub struct ProvidersDir {
    root: PathBuf,
}

impl ProvidersDir {
    /// The directory at `root`.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// The default root: `$XDG_DATA_HOME/host-harness/providers`, or
    /// `~/.local/share/host-harness/providers`.
    pub fn default_root() -> PathBuf {
        std::env::var_os("XDG_DATA_HOME")
            .filter(|dir| !dir.is_empty())
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                std::env::var_os("HOME").map(PathBuf::from).unwrap_or_default().join(".local/share")
            })
            .join("host-harness")
            .join("providers")
    }

    /// The root folder.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Checks the library at `path` as a load would, then installs it as
    /// `<id>/<version>/`. The first version installed becomes active.
    /// Installing a version again is a no-op when the library is the same,
    /// refused when it differs, unless `force`.
    pub fn install(&self, path: &Path, force: bool) -> Result<Entry, ProvidersError> {
        let library_staging = Staging::new().map_err(io(format!("copy {}", path.display())))?;
        let not_a_provider =
            |error: crate::loader::LoadError| ProvidersError::NotAProvider(error.to_string());
        let staged = library_staging.stage(path).map_err(not_a_provider)?;
        let provider = staged.load().map_err(not_a_provider)?;
        let manifest = provider.manifest();
        let file = path.file_name().map(|name| name.to_string_lossy().into_owned()).unwrap_or_default();
        let installed = Installed {
            id: manifest.id.to_string(),
            version: manifest.version.to_string(),
            abi: provider.library_abi().to_string(),
            sha256: staged.sha256().to_owned(),
            file,
        };
        check_component(&installed.id).and(check_component(&installed.version))?;
        let version_dir = self.root.join(&installed.id).join(&installed.version);
        if let Some(existing) = self.read_installed(&version_dir)? {
            if existing.sha256 == installed.sha256 {
                return self.entry(existing);
            }
            if !force {
                return Err(ProvidersError::HashMismatch {
                    spec: installed.spec(),
                    installed: existing.sha256,
                    offered: installed.sha256,
                });
            }
        }
        let id_dir = self.root.join(&installed.id);
        fs::create_dir_all(&id_dir).map_err(io(format!("create {}", id_dir.display())))?;
        let staging = tempfile::Builder::new()
            .prefix(&format!(".{}-", installed.version))
            .tempdir_in(&id_dir)
            .map_err(io(format!("write in {}", id_dir.display())))?;
        let target = staging.path().join(&installed.file);
        fs::copy(staged.copy(), &target).map_err(io("copy the library"))?;
        fs::set_permissions(&target, fs::Permissions::from_mode(0o644)).map_err(io("copy the library"))?;
        let record = serde_json::to_vec_pretty(&installed).expect("serialisable");
        fs::write(staging.path().join("installed.json"), record).map_err(io("write installed.json"))?;
        // --force: move the old version aside, put the new one in place.
        let old = version_dir.exists().then(|| staging.path().with_extension("replaced"));
        if let Some(old) = &old {
            fs::rename(&version_dir, old).map_err(io(format!("replace {}", version_dir.display())))?;
        }
        fs::rename(staging.keep(), &version_dir).map_err(io(format!("install {}", version_dir.display())))?;
        if let Some(old) = old {
            fs::remove_dir_all(&old).map_err(io(format!("remove {}", old.display())))?;
        }
        if self.active_spec()?.is_none() {
            self.write_active(&installed.spec())?;
        }
        self.entry(installed)
    }

    /// Every installed version, sorted by id and version.
    pub fn list(&self) -> Result<Vec<Entry>, ProvidersError> {
        let mut entries = Vec::new();
        for id_dir in read_dirs(&self.root)? {
            for version_dir in read_dirs(&id_dir)? {
                if let Some(installed) = self.read_installed(&version_dir)? {
                    entries.push(self.entry(installed)?);
                }
            }
        }
        entries.sort();
        Ok(entries)
    }

    /// Makes `spec` (`ID@VERSION`) the active version.
    pub fn use_version(&self, spec: &str) -> Result<Entry, ProvidersError> {
        let entry = self.find(spec)?;
        self.write_active(&entry.installed.spec())?;
        Ok(Entry { active: true, ..entry })
    }

    /// Removes `spec`, unless it is the active version.
    pub fn remove(&self, spec: &str) -> Result<Entry, ProvidersError> {
        let entry = self.find(spec)?;
        if entry.active {
            return Err(ProvidersError::Active(entry.installed.spec()));
        }
        let dir = entry.path.parent().expect("a version folder").to_path_buf();
        fs::remove_dir_all(&dir).map_err(io(format!("remove {}", dir.display())))?;
        Ok(entry)
    }

    /// The active version's library, if one is active and installed.
    pub fn active_library(&self) -> Option<PathBuf> {
        let spec = self.active_spec().ok()??;
        self.find(&spec).ok().map(|entry| entry.path)
    }

    fn find(&self, spec: &str) -> Result<Entry, ProvidersError> {
        let (id, version) = spec.split_once('@').ok_or_else(|| ProvidersError::BadSpec(spec.to_owned()))?;
        check_component(id)
            .and(check_component(version))
            .map_err(|_| ProvidersError::BadSpec(spec.to_owned()))?;
        let installed = self
            .read_installed(&self.root.join(id).join(version))?
            .ok_or_else(|| ProvidersError::NotInstalled(spec.to_owned()))?;
        self.entry(installed)
    }

    fn entry(&self, installed: Installed) -> Result<Entry, ProvidersError> {
        let path = self.root.join(&installed.id).join(&installed.version).join(&installed.file);
        let active = self.active_spec()?.as_deref() == Some(installed.spec().as_str());
        Ok(Entry { installed, path, active })
    }

    fn read_installed(&self, version_dir: &Path) -> Result<Option<Installed>, ProvidersError> {
        let bytes = read_if_exists(&version_dir.join("installed.json"), |path| fs::read(path))?;
        Ok(bytes.and_then(|bytes| serde_json::from_slice(&bytes).ok()))
    }

    fn active_spec(&self) -> Result<Option<String>, ProvidersError> {
        let text = read_if_exists(&self.root.join("active"), |path| fs::read_to_string(path))?;
        Ok(text.map(|text| text.trim().to_owned()).filter(|spec| !spec.is_empty()))
    }

    fn write_active(&self, spec: &str) -> Result<(), ProvidersError> {
        let active = self.root.join("active");
        replace_file(&active, format!("{spec}\n").as_bytes())
            .map_err(io(format!("write the active record {}", active.display())))
    }
}

/// Writes `bytes` to `path` as a whole: into a temporary file beside it
/// (its folder made first), renamed over it.
pub(crate) fn replace_file(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let dir = path.parent().filter(|dir| !dir.as_os_str().is_empty()).unwrap_or(Path::new("."));
    fs::create_dir_all(dir)?;
    let mut staging = tempfile::NamedTempFile::new_in(dir)?;
    io::Write::write_all(&mut staging, bytes)?;
    staging.persist(path)?;
    Ok(())
}

/// Refuses an id or version that could name a path outside its folder.
fn check_component(text: &str) -> Result<(), ProvidersError> {
    let ok = !text.is_empty()
        && text.len() <= 100
        && !text.starts_with('.')
        && text.chars().all(|c| c.is_ascii_alphanumeric() || "._+-".contains(c));
    ok.then_some(()).ok_or_else(|| {
        let text = text.escape_debug();
        ProvidersError::NotAProvider(format!("the provider's id or version `{text}` cannot name a folder"))
    })
}

/// The sub-folders of `dir` (none when it does not exist), hidden ones skipped.
fn read_dirs(dir: &Path) -> Result<Vec<PathBuf>, ProvidersError> {
    let Some(entries) = read_if_exists(dir, |dir| fs::read_dir(dir))? else { return Ok(Vec::new()) };
    Ok(entries
        .flatten()
        .filter(|entry| entry.file_type().is_ok_and(|kind| kind.is_dir()))
        .filter(|entry| !entry.file_name().to_string_lossy().starts_with('.'))
        .map(|entry| entry.path())
        .collect())
}

/// What `read` reads at `path`; `None` when nothing is there.
fn read_if_exists<T>(
    path: &Path,
    read: impl FnOnce(&Path) -> io::Result<T>,
) -> Result<Option<T>, ProvidersError> {
    match read(path) {
        Ok(value) => Ok(Some(value)),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(error) => Err(io(format!("read {}", path.display()))(error)),
    }
}

/// SHA-256 of `bytes`, lowercase hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    format!("{:x}", Sha256::digest(bytes))
}
