//! Pinned provider libraries: `providers.lock`, a TOML file recording each
//! trusted library's SHA-256 with its provider id, version and ABI version,
//! as Terraform's dependency lock file does. With `--locked`, a library whose
//! hash is not pinned is refused before it is loaded (its code never runs);
//! the hash checked is that of the private copy loaded ([`crate::staging`]).

use crate::{
    providers::replace_file,
    staging::{library_sha256, Staging},
};
use provider_abi::Provider;
use serde::{Deserialize, Serialize};
use std::{
    fs, io,
    path::{Path, PathBuf},
};

/// The file name of the lock file.
pub const LOCK_FILE_NAME: &str = "providers.lock";

/// One pinned library.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pin {
    /// The provider id from the library's manifest.
    pub id: String,
    /// The provider version from the library's manifest.
    pub version: String,
    /// The ABI version the library was built for.
    pub abi: String,
    /// SHA-256 of the library file, lowercase hex.
    pub sha256: String,
    /// Where the library was when it was pinned (informative).
    pub path: String,
}

/// Why a lock operation failed; one line each.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// The lock file could not be read, parsed or written.
    #[error("lock file {path}: {reason}")]
    File {
        /// The lock file.
        path: PathBuf,
        /// Why, in one line.
        reason: String,
    },
    /// The library could not be read or is not a provider.
    #[error("{0}")]
    Library(String),
    /// The library's hash is not pinned.
    #[error(
        "{library} is not pinned in {lock}: its sha256 is {actual}, expected {expected} (`host-harness lock add` pins it)"
    )]
    NotPinned {
        /// The library.
        library: PathBuf,
        /// The lock file.
        lock: PathBuf,
        /// The library's hash.
        actual: String,
        /// What the lock expects for that path, or that nothing is pinned.
        expected: String,
    },
}

/// A lock file and its pins (the document's `[[provider]]` tables).
#[derive(Debug, Serialize, Deserialize)]
pub struct LockFile {
    #[serde(skip)]
    path: PathBuf,
    #[serde(default, rename = "provider")]
    pins: Vec<Pin>,
}

impl LockFile {
    /// The default lock file: `providers.lock` beside the ledger.
    pub fn default_path(ledger: &Path) -> PathBuf {
        ledger.parent().unwrap_or(Path::new(".")).join(LOCK_FILE_NAME)
    }

    /// Reads the lock file at `path`; a missing file has no pins.
    pub fn open(path: &Path) -> Result<LockFile, LockError> {
        let fail = |reason: String| LockError::File { path: path.to_path_buf(), reason };
        let text = match fs::read_to_string(path) {
            Ok(text) => text,
            Err(error) if error.kind() == io::ErrorKind::NotFound => String::new(),
            Err(error) => return Err(fail(error.to_string())),
        };
        let lock = toml::from_str::<LockFile>(&text)
            .map_err(|error| fail(error.message().lines().next().unwrap_or("not valid TOML").to_owned()))?;
        Ok(LockFile { path: path.to_path_buf(), ..lock })
    }

    /// True when the file exists (a lock file is in use).
    pub fn exists(&self) -> bool {
        self.path.exists()
    }

    /// The lock file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The pins, in file order.
    pub fn pins(&self) -> &[Pin] {
        &self.pins
    }

    /// Pins the library at `library`: checks it as a load would (a private
    /// copy, so the hash pinned is that of the bytes checked), records its
    /// manifest's id, version and ABI with its hash (replacing a pin of the
    /// same id and version), and writes the file.
    pub fn add(&mut self, library: &Path) -> Result<Pin, LockError> {
        let failed = |error: crate::loader::LoadError| LockError::Library(error.to_string());
        let staging = Staging::new()
            .map_err(|error| LockError::Library(format!("cannot copy {}: {error}", library.display())))?;
        let staged = staging.stage(library).map_err(failed)?;
        let provider = staged.load().map_err(failed)?;
        let manifest = provider.manifest();
        let pin = Pin {
            id: manifest.id.to_string(),
            version: manifest.version.to_string(),
            abi: provider.library_abi().to_string(),
            sha256: staged.sha256().to_owned(),
            path: staged.source().display().to_string(),
        };
        self.pins.retain(|old| (&old.id, &old.version) != (&pin.id, &pin.version));
        self.pins.push(pin.clone());
        self.save()?;
        Ok(pin)
    }

    /// Hashes the library at `library` (opened as a load opens it, never
    /// loaded) and returns its pin.
    pub fn verify(&self, library: &Path) -> Result<&Pin, LockError> {
        let actual = library_sha256(library).map_err(|error| LockError::Library(error.to_string()))?;
        self.pin_of(library, &actual)
    }

    /// The pin of `sha256`, the hash of the library at `library` (named in
    /// the refusal).
    pub fn pin_of(&self, library: &Path, sha256: &str) -> Result<&Pin, LockError> {
        if let Some(pin) = self.pins.iter().find(|pin| pin.sha256 == sha256) {
            return Ok(pin);
        }
        let shown = fs::canonicalize(library).unwrap_or_else(|_| library.to_path_buf()).display().to_string();
        let expected = match self.pins.iter().find(|pin| pin.path == shown) {
            Some(pin) => format!("{} ({}@{})", pin.sha256, pin.id, pin.version),
            None => format!("one of {} pinned hashes, none for this path", self.pins.len()),
        };
        Err(LockError::NotPinned {
            library: library.to_path_buf(),
            lock: self.path.clone(),
            actual: sha256.to_owned(),
            expected,
        })
    }

    /// Writes the file atomically (a temporary file renamed over it).
    fn save(&self) -> Result<(), LockError> {
        let fail = |reason: String| LockError::File { path: self.path.clone(), reason };
        let text = toml::to_string_pretty(self).map_err(|error| fail(error.to_string()))?;
        let text = format!("# Pinned provider libraries (host-harness lock add).\n{text}");
        replace_file(&self.path, text.as_bytes()).map_err(|error| fail(error.to_string()))
    }
}

/// What a detached minisign signature (`LIBRARY.minisig`) says of a library.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Signature {
    /// No `.minisig` file beside the library.
    Unsigned,
    /// Verified with the trusted key whose base64 is given.
    Verified {
        /// The public key (base64) that verified it.
        key: String,
    },
    /// A signature exists but no trusted key verifies it.
    Untrusted {
        /// Why, in one line.
        reason: String,
    },
}

/// Checks `library` against its detached minisign signature, if any, with
/// the public keys (base64, as `minisign -G` prints them) the user trusts.
pub fn check_signature(library: &Path, trusted_keys: &[String]) -> Signature {
    let mut signature_path = library.as_os_str().to_owned();
    signature_path.push(".minisig");
    let Some(text) = read_regular(Path::new(&signature_path)).and_then(|bytes| String::from_utf8(bytes).ok())
    else {
        return Signature::Unsigned;
    };
    let untrusted = |reason: &str| Signature::Untrusted { reason: reason.to_owned() };
    let Ok(signature) = minisign_verify::Signature::decode(&text) else {
        return untrusted("the .minisig file is not a minisign signature");
    };
    let Some(bytes) = read_regular(library) else {
        return untrusted("the library cannot be read");
    };
    if trusted_keys.is_empty() {
        return untrusted("signed, but no key is trusted (--trusted-key)");
    }
    let verifies = |key: &&String| {
        minisign_verify::PublicKey::from_base64(key)
            .is_ok_and(|public_key| public_key.verify(&bytes, &signature, false).is_ok())
    };
    match trusted_keys.iter().find(verifies) {
        Some(key) => Signature::Verified { key: key.clone() },
        None => untrusted("no trusted key verifies the signature"),
    }
}

/// The bytes of the file at `path`, opened as a load opens a library
/// (non-blocking, regular files only: a FIFO never blocks the read).
fn read_regular(path: &Path) -> Option<Vec<u8>> {
    let mut file = crate::loader::open_library(path).ok()?.file;
    let mut bytes = Vec::new();
    io::Read::read_to_end(&mut file, &mut bytes).ok()?;
    Some(bytes)
}
