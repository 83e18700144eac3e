//! Directory archives (the `tar` crate) and exclude globs (`globset`).
//!
//! - Inbound: the host source is walked once before any request (links are
//!   never followed; a link whose target leaves the source refuses the whole
//!   call), then archived from that walk, each link re-read and re-checked.
//! - Outbound: the downloaded archive is validated whole before anything is
//!   extracted ([`validate`]), then extracted under the destination
//!   ([`extract`]) with the `tar` crate's own confinement as a second wall.

use std::collections::HashSet;
use std::fs::{self, File};
use std::io::{self, Read};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use globset::{GlobBuilder, GlobSet, GlobSetBuilder};
use tar::{Archive, Builder, EntryType, Header, HeaderMode};
use walkdir::WalkDir;

use super::paths::{link_stays_inside, relative_segments};
use crate::error::Error;

/// Largest total size of the files of an archive that is extracted.
pub const MAX_EXTRACTED_BYTES: u64 = 10 << 30;

/// The exclude globs of a mapping: each pattern `p` excludes `p`, `p/**`,
/// `**/p` and `**/p/**` (relative to the directory; `*` stops at `/`).
pub fn excludes<S: AsRef<str>>(patterns: &[S]) -> Result<GlobSet, Error> {
    let invalid = || Error::invalid_input("CreateOS transfer exclude pattern is invalid.");
    let mut set = GlobSetBuilder::new();
    for pattern in patterns {
        let pattern = pattern.as_ref().trim_start_matches("./").trim_end_matches('/');
        if pattern.is_empty() || pattern.contains('\0') || pattern.starts_with('/') {
            return Err(invalid());
        }
        for form in
            [pattern.to_owned(), format!("{pattern}/**"), format!("**/{pattern}"), format!("**/{pattern}/**")]
        {
            set.add(GlobBuilder::new(&form).literal_separator(true).build().map_err(|_| invalid())?);
        }
    }
    set.build().map_err(|_| invalid())
}

/// What a walked source entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A directory.
    Dir,
    /// A regular file.
    File,
    /// A symbolic link (checked to stay inside the source).
    Link,
}

impl Kind {
    /// What `file_type` describes; `None` for a socket, FIFO or device.
    fn of(file_type: fs::FileType) -> Option<Kind> {
        if file_type.is_symlink() {
            Some(Kind::Link)
        } else if file_type.is_dir() {
            Some(Kind::Dir)
        } else if file_type.is_file() {
            Some(Kind::File)
        } else {
            None
        }
    }
}

/// One entry of a walked host directory, relative to it.
#[derive(Debug, Clone)]
pub struct SourceEntry {
    /// Its relative path segments.
    pub segments: Vec<String>,
    /// What it is.
    pub kind: Kind,
}

/// `path` relative to `root`, under which it was walked.
fn relative<'a>(root: &Path, path: &'a Path) -> &'a Path {
    path.strip_prefix(root).unwrap_or(path)
}

/// Walks the host directory `root` without following links, leaving out
/// excluded paths. A link whose target leaves `root` (or is absolute) is
/// [`Error::PathEscapes`]; sockets, FIFOs and devices are left out.
pub fn walk(root: &Path, exclude: &GlobSet) -> Result<Vec<SourceEntry>, Error> {
    // Depth first by name: parents before children, so extraction creates
    // directories first; an excluded directory is not entered.
    let walker = WalkDir::new(root).min_depth(1).sort_by_file_name().into_iter();
    let mut entries = Vec::new();
    for child in walker.filter_entry(|child| !exclude.is_match(relative(root, child.path()))) {
        let child = child.map_err(|error| Error::host_read(error.into()))?;
        let segments: Option<Vec<String>> =
            relative(root, child.path()).iter().map(|name| name.to_str().map(str::to_owned)).collect();
        let segments = segments.ok_or_else(|| {
            Error::invalid_input("CreateOS transfer source holds a name that is not UTF-8.")
        })?;
        let Some(kind) = Kind::of(child.file_type()) else { continue };
        if kind == Kind::Link {
            check_host_link(child.path(), &segments)?;
        }
        entries.push(SourceEntry { segments, kind });
    }
    Ok(entries)
}

/// Reads the link at `path` (at `segments` inside the source) and checks it
/// stays inside; returns its target.
fn check_host_link(path: &Path, segments: &[String]) -> Result<String, Error> {
    let target = fs::read_link(path).map_err(Error::host_read)?;
    let target = target.to_str().filter(|target| link_stays_inside(segments, target));
    target.map(str::to_owned).ok_or(Error::PathEscapes)
}

/// Writes the walked `entries` of `root` as a tar archive into `out`:
/// files are opened without following links, links are re-read and
/// re-checked, and each entry keeps its mode. A source changed since the
/// walk (a file swapped for a link) is an error. Returns what was archived.
pub fn write(root: &Path, entries: &[SourceEntry], out: &mut File) -> Result<Summary, Error> {
    let mut builder = Builder::new(io::BufWriter::with_capacity(1 << 20, out));
    builder.mode(HeaderMode::Complete);
    let changed = || Error::invalid_input("CreateOS transfer source changed while it was archived.");
    let mut summary = Summary::default();
    for entry in entries {
        let path = entry.segments.iter().fold(root.to_path_buf(), |path, segment| path.join(segment));
        let file = match entry.kind {
            Kind::File => Some(File::options().read(true).custom_flags(libc::O_NOFOLLOW).open(&path)),
            Kind::Dir | Kind::Link => None,
        };
        let file = file.transpose().map_err(Error::host_read)?;
        let meta = file.as_ref().map_or_else(|| fs::symlink_metadata(&path), File::metadata);
        let meta = meta.map_err(Error::host_read)?;
        if Kind::of(meta.file_type()) != Some(entry.kind) {
            return Err(changed());
        }
        let mut header = Header::new_gnu();
        header.set_metadata_in_mode(&meta, HeaderMode::Complete);
        let name = entry.segments.join("/");
        match file {
            Some(file) => {
                // What is left of the take tells a file that shrank.
                let mut data = file.take(meta.len());
                builder.append_data(&mut header, name, &mut data).map_err(Error::host_read)?;
                if data.limit() != 0 {
                    return Err(changed());
                }
                summary.files += 1;
                summary.bytes += meta.len();
            }
            None if entry.kind == Kind::Link => {
                let target = check_host_link(&path, &entry.segments)?;
                header.set_size(0);
                builder.append_link(&mut header, name, target).map_err(Error::host_read)?;
            }
            None => builder.append_data(&mut header, name, io::empty()).map_err(Error::host_read)?,
        }
    }
    builder.into_inner().and_then(|mut writer| io::Write::flush(&mut writer)).map_err(Error::host_read)?;
    Ok(summary)
}

/// What a validated archive holds.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Summary {
    /// Regular files.
    pub files: u64,
    /// Their total size.
    pub bytes: u64,
}

/// Validates a whole archive before anything is extracted: every entry is
/// relative, without `..`, backslash or NUL, is a file, directory, symbolic
/// link or hard link; link targets stay inside; no entry lies under a
/// symbolic link of the archive; files total at most `limit` bytes.
pub fn validate(reader: impl Read, limit: u64) -> Result<Summary, Error> {
    let mut archive = Archive::new(reader);
    let mut summary = Summary::default();
    let mut symlinks: HashSet<Vec<String>> = HashSet::new();
    let mut paths: Vec<Vec<String>> = Vec::new();
    for entry in archive.entries().map_err(|_| Error::UnsafeArchive)? {
        let entry = entry.map_err(|_| Error::UnsafeArchive)?;
        let segments = relative_segments(&entry.path_bytes()).ok_or(Error::UnsafeArchive)?;
        let kind = entry.header().entry_type();
        match kind {
            EntryType::Directory => {}
            EntryType::Regular | EntryType::Continuous => {
                summary.files += 1;
                summary.bytes = summary.bytes.checked_add(entry.size()).ok_or(Error::UnsafeArchive)?;
                if summary.bytes > limit {
                    return Err(Error::UnsafeArchive);
                }
            }
            EntryType::Symlink => {
                let target = entry.link_name_bytes().ok_or(Error::UnsafeArchive)?;
                let target = std::str::from_utf8(&target).map_err(|_| Error::UnsafeArchive)?;
                if segments.is_empty() || !link_stays_inside(&segments, target) {
                    return Err(Error::UnsafeArchive);
                }
                symlinks.insert(segments.clone());
            }
            EntryType::Link => {
                let target = entry.link_name_bytes().ok_or(Error::UnsafeArchive)?;
                let target = relative_segments(&target).ok_or(Error::UnsafeArchive)?;
                if segments.is_empty() || target.is_empty() {
                    return Err(Error::UnsafeArchive);
                }
                paths.push(target);
            }
            EntryType::XGlobalHeader => continue,
            _ => return Err(Error::UnsafeArchive),
        }
        if segments.is_empty() && kind != EntryType::Directory {
            return Err(Error::UnsafeArchive);
        }
        paths.push(segments);
    }
    // Nothing may be reached through a link of the archive itself.
    let under_link = |path: &Vec<String>| (1..path.len()).any(|end| symlinks.contains(&path[..end]));
    if paths.iter().any(under_link) {
        return Err(Error::UnsafeArchive);
    }
    Ok(summary)
}

/// Extracts a validated archive under `target` (an existing directory, not
/// a link), leaving out excluded paths. Directory modes are applied last,
/// deepest first, so a read-only directory still receives its contents.
pub fn extract(reader: impl Read, target: &Path, exclude: &GlobSet) -> Result<Summary, Error> {
    let mut archive = Archive::new(reader);
    archive.set_overwrite(true);
    archive.set_preserve_permissions(false);
    let mut summary = Summary::default();
    let mut directories: Vec<(PathBuf, u32)> = Vec::new();
    for entry in archive.entries().map_err(|_| Error::UnsafeArchive)? {
        let mut entry = entry.map_err(|_| Error::UnsafeArchive)?;
        let segments = relative_segments(&entry.path_bytes()).ok_or(Error::UnsafeArchive)?;
        let kind = entry.header().entry_type();
        if segments.is_empty() || kind == EntryType::XGlobalHeader || exclude.is_match(segments.join("/")) {
            continue;
        }
        let mode = entry.header().mode().map_err(|_| Error::UnsafeArchive)? & 0o777;
        if !entry.unpack_in(target).map_err(Error::host_write)? {
            return Err(Error::UnsafeArchive);
        }
        let path = segments.iter().fold(target.to_path_buf(), |path, segment| path.join(segment));
        match kind {
            EntryType::Directory => {
                fs::set_permissions(&path, fs::Permissions::from_mode(mode | 0o700))
                    .map_err(Error::host_write)?;
                directories.push((path, mode));
            }
            EntryType::Regular | EntryType::Continuous => {
                summary.files += 1;
                summary.bytes += entry.size();
            }
            _ => {}
        }
    }
    for (path, mode) in directories.into_iter().rev() {
        fs::set_permissions(&path, fs::Permissions::from_mode(mode)).map_err(Error::host_write)?;
    }
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A raw archive entry: name bytes, type, link target, size.
    type RawEntry = (Vec<u8>, EntryType, Vec<u8>, u64);

    /// An archive of raw entries.
    fn archive(entries: &[RawEntry]) -> Vec<u8> {
        let mut out = Vec::new();
        for (name, kind, link, size) in entries {
            let mut header = Header::new_old();
            {
                let old = header.as_old_mut();
                let n = name.len().min(99);
                old.name[..n].copy_from_slice(&name[..n]);
                let l = link.len().min(99);
                old.linkname[..l].copy_from_slice(&link[..l]);
            }
            header.set_entry_type(*kind);
            header.set_size(*size);
            header.set_mode(0o644);
            header.set_cksum();
            out.extend_from_slice(header.as_bytes());
            let padded = size.div_ceil(512) * 512;
            out.extend(std::iter::repeat_n(b'x', *size as usize));
            out.extend(std::iter::repeat_n(0u8, (padded - size) as usize));
        }
        out.extend([0u8; 1024]);
        out
    }

    fn entry(name: &str, kind: EntryType, link: &str) -> RawEntry {
        let size = if kind == EntryType::Regular { 3 } else { 0 };
        (name.as_bytes().to_vec(), kind, link.as_bytes().to_vec(), size)
    }

    #[test]
    fn hostile_archives_are_refused_whole() {
        use EntryType::*;
        let refused: Vec<Vec<RawEntry>> = vec![
            vec![entry("a", Regular, ""), entry("../evil", Regular, "")],
            vec![entry("/etc/evil", Regular, "")],
            vec![entry("a\\..\\evil", Regular, "")],
            vec![entry("out", Symlink, "../outside")],
            vec![entry("out", Symlink, "/etc")],
            vec![entry("d/out", Symlink, "../../x")],
            vec![entry("hard", Link, "../outside")],
            vec![entry("hard", Link, "/etc/passwd")],
            vec![entry("l", Symlink, "."), entry("l/x", Regular, "")],
            vec![entry("dev", Char, "")],
            vec![entry("fifo", Fifo, "")],
        ];
        for entries in refused {
            assert_eq!(
                validate(&archive(&entries)[..], MAX_EXTRACTED_BYTES),
                Err(Error::UnsafeArchive),
                "{entries:?}"
            );
        }
        let fine = vec![
            entry("./", Directory, ""),
            entry("./d/", Directory, ""),
            entry("./d/f", Regular, ""),
            entry("./d/up", Symlink, "../d/f"),
            entry("./hard", Link, "d/f"),
        ];
        assert_eq!(validate(&archive(&fine)[..], MAX_EXTRACTED_BYTES), Ok(Summary { files: 1, bytes: 3 }));
        assert_eq!(validate(&archive(&fine)[..], 2), Err(Error::UnsafeArchive), "over the limit");
    }

    #[test]
    fn excludes_match_the_four_forms() {
        let set = excludes(&["node_modules", "*.log"]).unwrap();
        for hit in
            ["node_modules", "node_modules/a/b", "src/node_modules", "src/node_modules/x", "a.log", "d/b.log"]
        {
            assert!(set.is_match(hit), "{hit}");
        }
        for miss in ["node_modules2", "src/x_node_modules", "log", "a.logs"] {
            assert!(!set.is_match(miss), "{miss}");
        }
        assert!(excludes(&["/abs"]).is_err());
        assert!(excludes(&[""]).is_err());
    }

    fn hostile_name() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            prop::collection::vec(
                prop_oneof![Just(b'.'), Just(b'/'), Just(b'\\'), Just(0u8), Just(b'a')],
                1..12
            ),
            "[a-z]{1,3}(/[a-z.]{1,3}){0,3}".prop_map(String::into_bytes),
        ]
    }

    fn hostile_kind() -> impl Strategy<Value = EntryType> {
        prop_oneof![
            Just(EntryType::Regular),
            Just(EntryType::Directory),
            Just(EntryType::Symlink),
            Just(EntryType::Link),
            Just(EntryType::Fifo)
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]
        #[test]
        fn generated_hostile_archives_never_land_outside(
            entries in prop::collection::vec((hostile_name(), hostile_kind(), hostile_name()), 1..8)
        ) {
            let raw: Vec<_> = entries
                .into_iter()
                .map(|(name, kind, link)| {
                    let size = if kind == EntryType::Regular { 3 } else { 0 };
                    (name, kind, link, size)
                })
                .collect();
            let bytes = archive(&raw);
            let outer = tempfile::tempdir().unwrap();
            let target = outer.path().join("target");
            fs::create_dir(&target).unwrap();
            if validate(&bytes[..], MAX_EXTRACTED_BYTES).is_ok() {
                let _ = extract(&bytes[..], &target, &excludes::<&str>(&[]).unwrap());
            }
            // Nothing but `target` ever appears beside it.
            let beside: Vec<_> = fs::read_dir(outer.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
            prop_assert_eq!(beside, vec![std::ffi::OsString::from("target")]);
        }
    }
}
