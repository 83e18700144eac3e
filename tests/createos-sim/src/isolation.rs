//! Per-sandbox filesystem isolation.
//!
//! A sandbox is one root filesystem, as a real one is: `<root>/` holds its
//! `paperclip-workspace/` and `tmp/` as plain directories (so a rename or a
//! hard link between them is a rename, never a cross-device copy), and the
//! host's system directories appear in it read-only. Every child process
//! runs in its own session (`setsid`) and its own mount namespace
//! (`unshare(CLONE_NEWNS)`, `/` made recursively private), where the system
//! directories are bind-mounted onto their mount points under `<root>` and
//! the process is `chroot`ed into `<root>`: it sees neither the host's other
//! files nor another sandbox's. With [`crate::SimConfig::pid_namespaces`]
//! the command then runs in a PID namespace of its own, whose `/proc` is
//! mounted at `/proc` ([`crate::pidns`]): it sees neither the host's
//! processes nor another sandbox's; without, the host's `/proc` is bound
//! read-only as the other system directories are. This needs root
//! (`CAP_SYS_ADMIN`, `CAP_SYS_CHROOT`); it is probed once at start and,
//! when unavailable, process creation answers 500.
//!
//! `/files` requests map absolute paths under `/paperclip-workspace` and
//! `/tmp` to the same host directories.

use std::ffi::{CStr, CString};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

/// In-sandbox path of the workspace.
pub const WORKSPACE: &str = "/paperclip-workspace";

/// Host directories a sandbox sees (read-only) at the same path; a host
/// entry that is a symlink (`/bin -> usr/bin`) is a symlink in the sandbox
/// too, and one the host lacks is left out.
const SYSTEM_DIRS: &[&str] =
    &["bin", "sbin", "lib", "lib32", "lib64", "libx32", "usr", "etc", "opt", "dev", "sys"];

/// The mount point of `/proc`: each command's own, or the host's.
const PROC_DIR: &str = "proc";

/// Host directories of one sandbox.
#[derive(Debug, Clone)]
pub(crate) struct SandboxDirs {
    pub root: PathBuf,
    /// Each command in a PID namespace of its own.
    pid_namespace: bool,
}

impl SandboxDirs {
    pub(crate) fn new(state_dir: &Path, id: &str) -> Self {
        SandboxDirs { root: state_dir.join(id), pid_namespace: false }
    }

    /// The same directories, whose commands each run in a PID namespace of
    /// their own when `on`.
    pub(crate) fn with_pid_namespace(self, on: bool) -> Self {
        SandboxDirs { pid_namespace: on, ..self }
    }
    pub(crate) fn workspace(&self) -> PathBuf {
        self.root.join(&WORKSPACE[1..])
    }
    pub(crate) fn tmp(&self) -> PathBuf {
        self.root.join("tmp")
    }

    /// Create the root with `paperclip-workspace/`, a world-writable sticky
    /// `tmp/` and the system directories' mount points (or symlinks). Never
    /// the state directory above the root: once the simulator removed it
    /// (on its way out), a late creation fails instead of bringing it back.
    pub(crate) fn create(&self) -> io::Result<()> {
        use std::os::unix::fs::PermissionsExt;
        let existing_ok = |result: io::Result<()>| match result {
            Err(error) if error.kind() == io::ErrorKind::AlreadyExists => Ok(()),
            other => other,
        };
        existing_ok(std::fs::create_dir(&self.root))?;
        existing_ok(std::fs::create_dir(self.workspace()))?;
        existing_ok(std::fs::create_dir(self.tmp()))?;
        std::fs::set_permissions(self.tmp(), std::fs::Permissions::from_mode(0o1777))?;
        existing_ok(std::fs::create_dir(self.root.join(PROC_DIR)))?;
        for name in SYSTEM_DIRS {
            let host = Path::new("/").join(name);
            let Ok(meta) = std::fs::symlink_metadata(&host) else { continue };
            let inside = self.root.join(name);
            if meta.file_type().is_symlink() {
                existing_ok(std::os::unix::fs::symlink(std::fs::read_link(&host)?, inside))?;
            } else if meta.is_dir() {
                existing_ok(std::fs::create_dir(inside))?;
            }
        }
        Ok(())
    }

    /// The system directories to bind-mount: `(host path, mount point)`,
    /// those whose mount point `create` made a directory (the host's `/proc`
    /// too, without a PID namespace).
    fn system_mounts(&self) -> impl Iterator<Item = (PathBuf, PathBuf)> + '_ {
        let proc = (!self.pid_namespace).then_some(&PROC_DIR);
        SYSTEM_DIRS.iter().chain(proc).filter_map(|name| {
            let inside = self.root.join(name);
            let is_dir = std::fs::symlink_metadata(&inside).is_ok_and(|m| m.is_dir());
            is_dir.then(|| (Path::new("/").join(name), inside))
        })
    }

    /// Map an in-sandbox absolute path to the host path, or `None` when the
    /// path is not under `/paperclip-workspace` or `/tmp`, is not normalised
    /// (`..`, `.`), or names a mount point itself.
    pub(crate) fn map_path(&self, path: &str) -> Option<PathBuf> {
        let p = Path::new(path);
        if !p.is_absolute() {
            return None;
        }
        let mut comps = p.components();
        if comps.next() != Some(Component::RootDir) {
            return None;
        }
        let base = match comps.next() {
            Some(Component::Normal(c)) if c == "paperclip-workspace" => self.workspace(),
            Some(Component::Normal(c)) if c == "tmp" => self.tmp(),
            _ => return None,
        };
        let mut out = base;
        let mut any = false;
        for c in comps {
            match c {
                Component::Normal(c) => {
                    out.push(c);
                    any = true;
                }
                _ => return None,
            }
        }
        any.then_some(out)
    }

    /// True if `host` (canonicalised) stays inside this sandbox's directories.
    pub(crate) fn contains(&self, host: &Path) -> bool {
        let Ok(root) = self.root.canonicalize() else {
            return false;
        };
        host.starts_with(root)
    }
}

/// Which child [`ChildSetup::apply`] sets up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Child {
    /// A sandbox's command: a session of its own, whose processes may
    /// outlive it (its tree is the simulator's to end).
    Command,
    /// The start-up probe's child, which the probe waits for: it stays in
    /// the simulator's session, and nothing of it outlives it.
    Probe,
}

/// Everything the forked child needs, prepared before `fork`.
pub(crate) struct ChildSetup {
    root: CString,
    /// `(host directory, mount point under the root)`.
    system: Vec<(CString, CString)>,
    cwd: CString,
    pid_namespace: bool,
}

impl ChildSetup {
    pub(crate) fn new(dirs: &SandboxDirs, cwd: Option<&str>) -> io::Result<Self> {
        let c = |p: &Path| {
            CString::new(p.as_os_str().as_bytes())
                .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in path"))
        };
        Ok(ChildSetup {
            root: c(&dirs.root)?,
            system: dirs
                .system_mounts()
                .map(|(host, inside)| Ok((c(&host)?, c(&inside)?)))
                .collect::<io::Result<_>>()?,
            cwd: CString::new(cwd.unwrap_or(WORKSPACE))
                .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in cwd"))?,
            pid_namespace: dirs.pid_namespace,
        })
    }

    /// Runs in the forked child before `exec`: only async-signal-safe calls.
    /// Returns in the process that is to `exec` the command (in its own PID
    /// namespace, when the sandbox has them: [`crate::pidns::enter`]).
    pub(crate) fn apply(&self, child: Child) -> io::Result<()> {
        // SAFETY: plain syscalls on NUL-terminated strings prepared before fork.
        unsafe {
            if child == Child::Command && libc::setsid() < 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::unshare(libc::CLONE_NEWNS) != 0 {
                return Err(io::Error::last_os_error());
            }
            mount(None, c"/", libc::MS_REC | libc::MS_PRIVATE)?;
            for (host, inside) in &self.system {
                mount(Some(host), inside, libc::MS_BIND | libc::MS_REC)?;
                mount(None, inside, libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY)?;
            }
            if libc::chroot(self.root.as_ptr()) != 0 || libc::chdir(self.cwd.as_ptr()) != 0 {
                return Err(io::Error::last_os_error());
            }
            if self.pid_namespace {
                return crate::pidns::enter(child == Child::Probe);
            }
        }
        Ok(())
    }
}

unsafe fn mount(src: Option<&CStr>, target: &CStr, flags: libc::c_ulong) -> io::Result<()> {
    let src = src.map_or(std::ptr::null(), |s| s.as_ptr());
    if libc::mount(src, target.as_ptr(), std::ptr::null(), flags, std::ptr::null()) != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Create the host mount point and check, in a forked child, that the
/// isolation steps work. `Err` carries a message for the server log.
pub(crate) fn probe(state_dir: &Path, pid_namespace: bool) -> Result<(), String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err("process isolation needs root (mount namespaces); \
                    the simulator is not running as root"
            .into());
    }
    let dirs = SandboxDirs::new(state_dir, ".isolation-probe").with_pid_namespace(pid_namespace);
    let result = (|| {
        dirs.create().map_err(|e| format!("cannot create probe directories: {e}"))?;
        let setup = ChildSetup::new(&dirs, None).map_err(|e| e.to_string())?;
        // SAFETY: the child only performs syscalls and `_exit`.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err(format!("fork failed: {}", io::Error::last_os_error()));
        }
        if pid == 0 {
            let code = match setup.apply(Child::Probe) {
                Ok(()) => 0,
                Err(e) => e.raw_os_error().unwrap_or(1).clamp(1, 255),
            };
            // SAFETY: terminating the forked child without running destructors.
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: waiting for the child we just forked.
        while unsafe { libc::waitpid(pid, &mut status, 0) } < 0 {
            if io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
                return Err("waitpid failed".into());
            }
        }
        if libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0 {
            Ok(())
        } else {
            let errno = libc::WEXITSTATUS(status);
            Err(format!(
                "process isolation unavailable: unshare(CLONE_NEWNS)/bind mount/chroot/PID namespace failed: {} \
                 (the simulator must run as root with CAP_SYS_ADMIN and CAP_SYS_CHROOT)",
                io::Error::from_raw_os_error(errno)
            ))
        }
    })();
    let _ = std::fs::remove_dir_all(&dirs.root);
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_only_sandbox_paths() {
        let d = SandboxDirs::new(Path::new("/s"), "a");
        assert_eq!(
            d.map_path("/paperclip-workspace/x/y"),
            Some(PathBuf::from("/s/a/paperclip-workspace/x/y"))
        );
        assert_eq!(d.map_path("/tmp/x"), Some(PathBuf::from("/s/a/tmp/x")));
        assert_eq!(d.map_path("/tmp"), None);
        assert_eq!(d.map_path("/etc/passwd"), None);
        assert_eq!(d.map_path("/tmp/../etc/passwd"), None);
        assert_eq!(d.map_path("tmp/x"), None);
        assert_eq!(d.map_path("/paperclip-workspacex/a"), None);
    }
}
