//! Private copies of provider libraries, named by their SHA-256: what a
//! host hashes is exactly what it loads.
//!
//! A library is opened once, the way a load opens it
//! ([`crate::loader::open_library`]: non-blocking, regular files only), and
//! its bytes are copied from that open file into a directory only this
//! process's user can enter, and the copy hashed. The copy is named by the
//! hash and made read-only; the pin check, the load (here or in a worker
//! process, told the hash to check) and an install all use the copy, so a
//! file renamed over the library's path, or a symbolic link retargeted,
//! after it was opened changes nothing. A build staged twice reuses its copy:
//! a process never loads two files from one path.

use crate::loader::{open_library, CheckedFile, LoadError, LoadProblem, LoadedProvider};
use sha2::{Digest, Sha256};
use std::{
    fs::{File, Permissions},
    io::{self, Read, Seek},
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
};

/// A directory of private copies, removed with its copies when dropped (a
/// loaded copy stays mapped).
#[derive(Debug)]
pub struct Staging {
    dir: tempfile::TempDir,
}

/// One library's private copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Staged {
    source: PathBuf,
    copy: PathBuf,
    sha256: String,
}

impl Staging {
    /// A new staging directory (mode 0700) under the system's temporary directory.
    pub fn new() -> io::Result<Staging> {
        Ok(Staging { dir: tempfile::Builder::new().prefix("host-harness-libraries-").tempdir()? })
    }

    /// Copies the library at `library` into the staging directory, hashing
    /// exactly the bytes copied, once per build. Errors are one line naming
    /// `library`.
    pub fn stage(&self, library: &Path) -> Result<Staged, LoadError> {
        let CheckedFile { path: source, file, .. } = open_library(library)?;
        let unreadable =
            |error: io::Error| LoadProblem::Unreadable(format!("cannot copy it: {error}")).at(&source);
        let incoming = tempfile::NamedTempFile::new_in(self.dir.path()).map_err(unreadable)?;
        // The copy is hashed, not its source: what is loaded is what was hashed.
        let copy_and_hash = |mut copy: &File| {
            io::copy(&mut &file, &mut copy)?;
            copy.rewind()?;
            sha256_of(copy)
        };
        let sha256 = copy_and_hash(incoming.as_file()).map_err(unreadable)?;
        let name = source.file_name().map(|name| name.to_string_lossy().into_owned()).unwrap_or_default();
        let copy = self.dir.path().join(format!("{sha256}-{name}"));
        if !copy.exists() {
            incoming.as_file().set_permissions(Permissions::from_mode(0o400)).map_err(unreadable)?;
            match incoming.persist_noclobber(&copy) {
                // Staged at the same moment by another thread: the same bytes.
                Err(error) if error.error.kind() != io::ErrorKind::AlreadyExists => {
                    return Err(unreadable(error.error))
                }
                _ => {}
            }
        }
        Ok(Staged { source, copy, sha256 })
    }
}

impl Staged {
    /// The library as given, made absolute and canonical.
    pub fn source(&self) -> &Path {
        &self.source
    }

    /// The private copy, the file to load.
    pub fn copy(&self) -> &Path {
        &self.copy
    }

    /// SHA-256 of the copy, lowercase hex.
    pub fn sha256(&self) -> &str {
        &self.sha256
    }

    /// Loads the copy in this process; errors name the library as given.
    pub fn load(&self) -> Result<LoadedProvider, LoadError> {
        LoadedProvider::load(&self.copy).map_err(|error| LoadError { path: self.source.clone(), ..error })
    }
}

/// Loads the library at `copy` only if its SHA-256 is `sha256` (a worker
/// process handed a private copy and its hash); errors name `copy`.
pub fn load_expecting(copy: &Path, sha256: &str) -> Result<LoadedProvider, LoadError> {
    let actual = library_sha256(copy)?;
    if actual != sha256 {
        let refused = format!("its sha256 is {actual}, not the {sha256} the host checked");
        return Err(LoadProblem::Unreadable(refused).at(copy));
    }
    LoadedProvider::load(copy)
}

/// SHA-256 of the library at `library`, lowercase hex, opened as a load
/// opens it.
pub fn library_sha256(library: &Path) -> Result<String, LoadError> {
    let CheckedFile { path, file, .. } = open_library(library)?;
    sha256_of(file).map_err(|error| LoadProblem::Unreadable(error.to_string()).at(path))
}

/// SHA-256 of what `from` reads to its end, lowercase hex.
fn sha256_of(mut from: impl Read) -> io::Result<String> {
    let mut hasher = Sha256::new();
    io::copy(&mut from, &mut hasher)?;
    Ok(format!("{:x}", hasher.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_is_named_by_the_hash_of_the_bytes_read_and_reused() {
        let staging = Staging::new().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let library = dir.path().join("lib.so");
        std::fs::write(&library, b"first").unwrap();
        let first = staging.stage(&library).unwrap();
        assert_eq!(first.sha256(), format!("{:x}", Sha256::digest(b"first")));
        assert_eq!(std::fs::read(first.copy()).unwrap(), b"first");
        assert!(first.copy().file_name().unwrap().to_string_lossy().starts_with(first.sha256()));
        assert_eq!(staging.stage(&library).unwrap(), first, "the same build reuses its copy");
        std::fs::write(&library, b"second").unwrap();
        let second = staging.stage(&library).unwrap();
        assert_ne!(second.copy(), first.copy());
        assert_eq!(std::fs::read(first.copy()).unwrap(), b"first", "a copy never changes");
        assert_eq!(library_sha256(second.copy()).unwrap(), second.sha256());
    }

    #[test]
    fn a_fifo_is_refused_at_once_in_one_line() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("lib.so");
        let name = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: `name` is a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0);
        let staging = Staging::new().unwrap();
        for error in [staging.stage(&fifo).unwrap_err(), library_sha256(&fifo).unwrap_err()] {
            let text = error.to_string();
            assert!(text.contains("a FIFO") && !text.contains('\n'), "{text}");
        }
    }

    #[test]
    fn a_copy_whose_hash_is_not_the_one_told_is_not_loaded() {
        let dir = tempfile::tempdir().unwrap();
        let library = dir.path().join("lib.so");
        std::fs::write(&library, b"not the checked build").unwrap();
        let text = load_expecting(&library, "00").err().expect("refused").to_string();
        assert!(text.contains("not the 00 the host checked") && !text.contains('\n'), "{text}");
    }
}
