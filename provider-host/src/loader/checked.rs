//! Loading exactly the file that was checked.
//!
//! The dynamic loader resolves a name without a slash through its search path
//! (`LD_LIBRARY_PATH`, `RUNPATH`, the system directories), and it opens the
//! file again after the host examined it. So the loader first makes the path
//! absolute and canonical (no search, no symbolic link to retarget), refuses
//! anything but a regular file before opening it (a FIFO would block the
//! open), examines the file through the descriptor it opened, and after the
//! dynamic loader mapped the library compares the mapped object's file
//! (`dladdr`'s `dli_fname`) with the examined one by device and inode: a file
//! replaced between the check and the load is refused.
//!
//! The dynamic loader never maps a path twice: once a path is loaded, a later
//! `dlopen` of it returns the object already mapped, whatever the file at that
//! path has become. So the loader remembers the file it loaded from each path
//! and refuses to load a path whose file has changed since.

use super::{image::LoadedImage, LoadError, LoadProblem};
use std::{
    collections::HashMap,
    fs::{File, FileType, Metadata, OpenOptions},
    io,
    os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt},
    path::{Path, PathBuf},
    sync::{LazyLock, Mutex},
};

/// Opens the provider library at `given` the way a load does: resolved to
/// an absolute canonical path, refused unless it is a regular file before
/// and after opening, opened non-blocking (a FIFO put in its place between
/// the check and the open returns at once, and is refused). Returns the
/// canonical path and the open file; errors are one line naming the file.
pub fn open_library(given: &Path) -> Result<CheckedFile, LoadError> {
    let unreadable = |path: &Path, error: io::Error| LoadProblem::Unreadable(error.to_string()).at(path);
    let path = std::fs::canonicalize(given).map_err(|error| unreadable(given, error))?;
    let metadata = std::fs::metadata(&path).map_err(|error| unreadable(&path, error))?;
    regular(&metadata).map_err(|problem| problem.at(&path))?;
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&path)
        .map_err(|error| unreadable(&path, error))?;
    let metadata = file.metadata().map_err(|error| unreadable(&path, error))?;
    regular(&metadata).map_err(|problem| problem.at(&path))?;
    Ok(CheckedFile { id: id(&metadata), path, file })
}

/// A file's identity: device and inode.
type FileId = (u64, u64);

/// The file each path was loaded from in this process; `None` when what the
/// dynamic loader mapped for that path is not known (a refused load).
static LOADED: LazyLock<Mutex<HashMap<PathBuf, Option<FileId>>>> = LazyLock::new(Default::default);

/// A provider library opened for examination (see [`open_library`]).
#[derive(Debug)]
pub struct CheckedFile {
    /// The canonical path.
    pub path: PathBuf,
    /// The open file, for examination.
    pub file: File,
    id: FileId,
}

impl CheckedFile {
    /// Refuses the path if this process already loaded it from another file
    /// (the dynamic loader would hand back that one).
    pub(crate) fn check_not_loaded_from_another_file(&self) -> Result<(), LoadProblem> {
        let loaded = crate::lock(&LOADED);
        match loaded.get(&self.path) {
            None => Ok(()),
            Some(Some(id)) if *id == self.id => Ok(()),
            Some(_) => Err(LoadProblem::NotTheCheckedFile(
                "this process already loaded another file from this path and a library is never unloaded; \
                 load the new version from a path of its own"
                    .into(),
            )),
        }
    }

    /// Checks that the object the dynamic loader mapped, `image`, was mapped
    /// from this file, and remembers which file the path was loaded from.
    pub(crate) fn check_mapped(&self, image: LoadedImage) -> Result<(), LoadProblem> {
        let mapped =
            image.file().and_then(|name| std::fs::metadata(&name).ok().map(|meta| (name, id(&meta))));
        let outcome = match &mapped {
            Some((_, mapped_id)) if *mapped_id == self.id => Ok(()),
            Some((name, _)) => Err(format!(
                "the dynamic loader mapped {}, which is another file (was it replaced while loading?)",
                name.display()
            )),
            None => Err("cannot tell which file the dynamic loader mapped".into()),
        };
        let known = outcome.is_ok().then_some(self.id);
        crate::lock(&LOADED).insert(self.path.clone(), known);
        outcome.map_err(LoadProblem::NotTheCheckedFile)
    }
}

fn id(metadata: &Metadata) -> FileId {
    (metadata.dev(), metadata.ino())
}

/// Refuses anything but a regular file, naming what it is.
fn regular(metadata: &Metadata) -> Result<(), LoadProblem> {
    if metadata.is_file() {
        return Ok(());
    }
    Err(LoadProblem::Unreadable(format!("not a regular file but {}", describe(metadata.file_type()))))
}

/// What a file that is not a regular file is, in a few words.
pub(crate) fn describe(kind: FileType) -> &'static str {
    let kinds = [
        (kind.is_dir(), "a directory"),
        (kind.is_fifo(), "a FIFO"),
        (kind.is_socket(), "a socket"),
        (kind.is_char_device(), "a character device"),
        (kind.is_block_device(), "a block device"),
    ];
    kinds.into_iter().find_map(|(is, what)| is.then_some(what)).unwrap_or("a special file")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bare_name_becomes_an_absolute_path_in_the_current_directory() {
        let checked = open_library(Path::new("Cargo.toml")).unwrap();
        assert!(checked.path.is_absolute());
        assert_eq!(checked.path, std::env::current_dir().unwrap().join("Cargo.toml"));
    }

    #[test]
    fn special_files_are_refused_before_opening() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo.so");
        let name = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: `name` is a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0);
        for (path, what) in [
            (fifo.as_path(), "a FIFO"),
            (dir.path(), "a directory"),
            (Path::new("/dev/null"), "a character device"),
        ] {
            let error = open_library(path).expect_err("refused");
            let text = error.to_string();
            assert!(matches!(error.problem, LoadProblem::Unreadable(_)), "{text}");
            assert!(text.contains(what) && !text.contains('\n'), "{text}");
        }
    }

    #[test]
    fn a_path_loaded_from_one_file_is_not_loaded_from_another() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lib.so");
        std::fs::write(&path, b"first").unwrap();
        let first = open_library(&path).unwrap();
        LOADED.lock().unwrap().insert(first.path.clone(), Some(first.id));
        first.check_not_loaded_from_another_file().unwrap();
        // Replaced by rename, as package managers do: a new inode.
        let next = dir.path().join("lib.so.new");
        std::fs::write(&next, b"second").unwrap();
        std::fs::rename(&next, &path).unwrap();
        let second = open_library(&path).unwrap();
        let error = second.check_not_loaded_from_another_file().unwrap_err().at(&second.path).to_string();
        assert!(error.contains("already loaded another file from this path"), "{error}");
        assert!(error.contains(&path.display().to_string()) && !error.contains('\n'), "{error}");
    }

    #[test]
    fn the_mapped_object_must_be_the_checked_file() {
        let libc_image = LoadedImage::containing(libc::malloc as *const std::ffi::c_void).unwrap();
        let libc_file = libc_image.file().expect("libc is mapped from a file");
        open_library(&libc_file).unwrap().check_mapped(libc_image).unwrap();
        let other = open_library(Path::new("Cargo.toml")).unwrap();
        let error = other.check_mapped(libc_image).unwrap_err().at(&other.path);
        let text = error.to_string();
        assert!(matches!(error.problem, LoadProblem::NotTheCheckedFile(_)), "{text}");
        assert!(text.contains(&libc_file.display().to_string()) && text.contains("Cargo.toml"), "{text}");
        assert!(!text.contains('\n'), "{text}");
        let refused_again = other.check_not_loaded_from_another_file().unwrap_err();
        assert!(matches!(refused_again, LoadProblem::NotTheCheckedFile(_)), "{refused_again}");
    }
}
