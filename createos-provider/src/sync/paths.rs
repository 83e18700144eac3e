//! Path checks of file sync, on both sides of the boundary: the lexical
//! checks every mapping passes before any side effect, and the shell guard
//! that re-checks a sandbox path with `realpath` right before it is used.

use std::path::{Path, PathBuf};

use crate::error::Error;
use crate::metadata::REMOTE_CWD;
use crate::script::quote;

/// A sandbox path that is not absolute, holds a NUL or a `..` segment.
pub const NOT_CONFINED: &str = "CreateOS transfer requires a confined absolute sandbox path.";
/// Exit status of the guard when a path resolves outside the workspace.
pub const ESCAPE_STATUS: i64 = 90;
/// Exit status of a transfer script whose file mapping names a directory.
pub const IS_A_DIRECTORY_STATUS: i64 = 91;
/// Exit status of a transfer script whose directory mapping names something
/// else than a directory.
pub const NOT_A_DIRECTORY_STATUS: i64 = 92;

/// Checks a sandbox path lexically: absolute, no NUL, no `..` segment, and
/// normalised (`.` and empty segments dropped, no trailing `/`) equal to the
/// workspace or below it. Returns the normalised path.
pub fn sandbox_path(path: &str) -> Result<String, Error> {
    if !path.starts_with('/') || path.contains('\0') || path.split('/').any(|segment| segment == "..") {
        return Err(Error::invalid_input(NOT_CONFINED));
    }
    let segments: Vec<&str> =
        path.split('/').filter(|segment| !segment.is_empty() && *segment != ".").collect();
    let normalised = format!("/{}", segments.join("/"));
    let inside = normalised == REMOTE_CWD || normalised.starts_with(&format!("{REMOTE_CWD}/"));
    inside.then_some(normalised).ok_or(Error::PathEscapes)
}

/// Checks a host path: absolute and without NUL.
pub fn host_path(path: &str) -> Result<PathBuf, Error> {
    let absolute = path.starts_with('/') && !path.contains('\0');
    absolute
        .then(|| PathBuf::from(path))
        .ok_or_else(|| Error::invalid_input("CreateOS transfer requires an absolute host path."))
}

/// True when a link at `location` (a relative path inside a tree, the
/// link's own name included) pointing at `target` resolves inside the tree,
/// lexically. Absolute targets, NUL and backslashes are refused.
pub fn link_stays_inside(location: &[String], target: &str) -> bool {
    if target.is_empty() || target.starts_with('/') || target.contains('\0') || target.contains('\\') {
        return false;
    }
    let mut resolved: Vec<&str> =
        location[..location.len().saturating_sub(1)].iter().map(String::as_str).collect();
    for segment in target.split('/') {
        match segment {
            "" | "." => {}
            ".." => {
                if resolved.pop().is_none() {
                    return false;
                }
            }
            other => resolved.push(other),
        }
    }
    true
}

/// The relative segments of an archive or tree path: no leading `/`, no
/// `..`, no backslash, no NUL, valid UTF-8; `.` and empty segments dropped.
/// `None` for an unsafe path; an empty list is the root itself.
pub fn relative_segments(raw: &[u8]) -> Option<Vec<String>> {
    let text = std::str::from_utf8(raw).ok()?;
    if text.starts_with('/') || text.contains('\0') || text.contains('\\') {
        return None;
    }
    let segments = text.split('/').filter(|segment| !matches!(*segment, "" | "."));
    segments.map(|segment| (segment != "..").then(|| segment.to_owned())).collect()
}

/// A bash fragment that checks, inside the sandbox, that the workspace
/// resolves to itself and that `path` resolves (`realpath -m`, or `-e` when
/// it must exist) under it, leaving the resolved path in `$var`; otherwise
/// it exits [`ESCAPE_STATUS`] (a missing path that must exist exits 1).
pub fn guard(var: &str, path: &str, must_exist: bool) -> String {
    let workspace = quote(REMOTE_CWD);
    let quoted = quote(path);
    let resolve = if must_exist {
        format!("[ -e {quoted} ] || exit 1\n{var}=$(realpath -e -- {quoted}) || exit {ESCAPE_STATUS}\n")
    } else {
        format!("{var}=$(realpath -m -- {quoted}) || exit {ESCAPE_STATUS}\n")
    };
    format!(
        "r=$(realpath -e -- {workspace}) && [ \"$r\" = {workspace} ] || exit {ESCAPE_STATUS}\n{resolve}case \"${var}\" in {workspace}|{workspace}/*) ;; *) exit {ESCAPE_STATUS};; esac\n"
    )
}

/// The parent directory of a host path (the path itself has one: it is
/// absolute and not `/`), created if it is missing.
pub fn created_parent(path: &Path) -> Result<&Path, Error> {
    let parent = path
        .parent()
        .ok_or_else(|| Error::invalid_input("CreateOS transfer host path has no parent directory."))?;
    std::fs::create_dir_all(parent).map_err(Error::host_write)?;
    Ok(parent)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn sandbox_paths_of_the_reference() {
        for (path, expected) in [
            ("/paperclip-workspace", Ok("/paperclip-workspace")),
            ("/paperclip-workspace/", Ok("/paperclip-workspace")),
            ("/paperclip-workspace//a/./b/", Ok("/paperclip-workspace/a/b")),
            ("/etc/passwd", Err(Error::PathEscapes)),
            ("/paperclip-workspace-other/file", Err(Error::PathEscapes)),
            ("/paperclip-workspace/../secret", Err(Error::invalid_input(NOT_CONFINED))),
            ("relative", Err(Error::invalid_input(NOT_CONFINED))),
            ("/paperclip-workspace/a\0b", Err(Error::invalid_input(NOT_CONFINED))),
            ("", Err(Error::invalid_input(NOT_CONFINED))),
        ] {
            assert_eq!(sandbox_path(path), expected.map(str::to_owned), "{path:?}");
        }
    }

    #[test]
    fn links_resolve_lexically_from_their_directory() {
        let at = |path: &str| path.split('/').map(str::to_owned).collect::<Vec<_>>();
        assert!(link_stays_inside(&at("a/link"), "b"));
        assert!(link_stays_inside(&at("a/link"), "../b"));
        assert!(link_stays_inside(&at("a/b/link"), "../../c"));
        assert!(!link_stays_inside(&at("link"), "../x"));
        assert!(!link_stays_inside(&at("a/link"), "../../x"));
        assert!(!link_stays_inside(&at("a/link"), "/etc/passwd"));
        assert!(!link_stays_inside(&at("a/link"), "a\\b"));
        assert!(!link_stays_inside(&at("a/link"), ""));
    }

    proptest! {
        #[test]
        fn an_accepted_sandbox_path_is_inside_the_workspace(segments in prop::collection::vec("[a-z.\\-]{0,4}|\\.\\.|\\.|", 0..6), lead in "(/paperclip-workspace)?/?") {
            let path = format!("{lead}{}", segments.join("/"));
            if let Ok(normalised) = sandbox_path(&path) {
                prop_assert!(normalised == REMOTE_CWD || normalised.starts_with("/paperclip-workspace/"));
                prop_assert!(!normalised.split('/').any(|segment| segment == ".." || segment == "."));
                prop_assert!(!path.split('/').any(|segment| segment == ".."));
            }
        }

        #[test]
        fn an_accepted_link_never_climbs_above_the_root(depth in 1usize..4, target in prop::collection::vec("\\.\\.|\\.|[a-z]{1,3}|", 0..6)) {
            let location: Vec<String> = (0..depth).map(|i| format!("d{i}")).collect();
            let target = target.join("/");
            if link_stays_inside(&location, &target) {
                let mut level = depth as i64 - 1;
                for segment in target.split('/') {
                    match segment {
                        ".." => level -= 1,
                        "" | "." => {}
                        _ => level += 1,
                    }
                    prop_assert!(level >= 0);
                }
            }
        }

        #[test]
        fn relative_segments_never_hold_a_parent_or_separator(raw in prop::collection::vec(any::<u8>(), 0..40)) {
            if let Some(segments) = relative_segments(&raw) {
                for segment in segments {
                    prop_assert!(segment != ".." && segment != "." && !segment.is_empty());
                    prop_assert!(!segment.contains('/') && !segment.contains('\\') && !segment.contains('\0'));
                }
            }
        }
    }
}
