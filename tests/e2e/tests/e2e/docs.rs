//! The documentation points at things that exist: every repository path a
//! page names in backticks, every test it names (`path.rs::test_name`, or
//! `::test_name` after one in the same cell) and every relative link.
//! Files move; a page that still names the old place sends a reader nowhere.

use regex::Regex;
use std::path::{Path, PathBuf};

/// The repository's root (this crate is `tests/e2e`).
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

/// The pages a reader navigates: the README and `docs/`. The changelog is
/// history and names files as they were.
fn pages(root: &Path) -> Vec<PathBuf> {
    let mut pages = vec![root.join("README.md")];
    for entry in std::fs::read_dir(root.join("docs")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|ext| ext == "md") {
            pages.push(path);
        }
    }
    pages.sort();
    pages
}

/// A path names a repository file when its first component is an entry of
/// the root (`src/lib.rs` inside a crate's own section does not), other than
/// `target/`, which builds fill. Patterns (`*`, `<version>`) name no file.
fn is_repository_path(root: &Path, path: &str) -> bool {
    let first = path.split('/').next().unwrap_or_default();
    path.contains('/')
        && !first.is_empty()
        && first != ".."
        && first != "target"
        && root.join(first).exists()
        && !path.contains(['*', '<'])
}

/// Whether `source` defines a function or module named `name`.
fn defines(source: &str, name: &str) -> bool {
    Regex::new(&format!(r"\b(fn|mod) {}\b", regex::escape(name))).unwrap().is_match(source)
}

/// Every broken reference of one page, as `page:line: what`.
fn broken_references(root: &Path, page: &Path) -> Vec<String> {
    let code = Regex::new(r"`([^`\s]+)`").unwrap();
    let link = Regex::new(r"\]\(([^)#\s]+)(#[^)]*)?\)").unwrap();
    let text = std::fs::read_to_string(page).unwrap();
    let name = page.strip_prefix(root).unwrap_or(page).display().to_string();
    let mut broken = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let at = format!("{name}:{}", number + 1);
        // The file a `::test` reference continues.
        let mut last_file: Option<String> = None;
        for captures in code.captures_iter(line) {
            let item = &captures[1];
            let (path, test) = match item.split_once("::") {
                Some(("", test)) => match &last_file {
                    Some(file) => (file.clone(), Some(test)),
                    None => continue,
                },
                Some((path, test)) => (path.to_string(), Some(test)),
                None => (item.to_string(), None),
            };
            if !is_repository_path(root, &path) {
                continue;
            }
            let file = root.join(&path);
            if !file.exists() {
                broken.push(format!("{at}: `{path}` does not exist"));
                continue;
            }
            last_file = Some(path.clone());
            if let Some(test) = test {
                let test = test.rsplit("::").next().unwrap();
                let source = std::fs::read_to_string(&file).unwrap_or_default();
                if !defines(&source, test) {
                    broken.push(format!("{at}: `{path}` has no `{test}`"));
                }
            }
        }
        for captures in link.captures_iter(line) {
            let target = &captures[1];
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            if !page.parent().unwrap().join(target).exists() {
                broken.push(format!("{at}: link `{target}` leads nowhere"));
            }
        }
    }
    broken
}

#[test]
fn every_path_test_and_link_the_docs_name_exists() {
    let root = root();
    let broken: Vec<String> = pages(&root).iter().flat_map(|page| broken_references(&root, page)).collect();
    assert!(broken.is_empty(), "{} broken references:\n{}", broken.len(), broken.join("\n"));
}

#[test]
fn a_moved_file_and_a_renamed_test_are_reported() {
    let root = root();
    let dir = tempfile::tempdir().unwrap();
    let page = dir.path().join("page.md");
    std::fs::write(
        &page,
        "See `docs/no-such-page.md`, `tests/e2e/tests/e2e/docs.rs::no_such_test` \
         and `::a_moved_file_and_a_renamed_test_are_reported`, [a link](nowhere.md), \
         `src/lib.rs` (crate-relative: not checked).\n",
    )
    .unwrap();
    let broken = broken_references(&root, &page);
    assert_eq!(broken.len(), 3, "{broken:#?}");
    assert!(broken[0].ends_with("`docs/no-such-page.md` does not exist"), "{broken:#?}");
    assert!(broken[1].ends_with("has no `no_such_test`"), "{broken:#?}");
    assert!(broken[2].ends_with("link `nowhere.md` leads nowhere"), "{broken:#?}");
}
