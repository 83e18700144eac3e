//! Which loaded object an address belongs to: the loader checks that every
//! function and table pointer a library hands over lies inside that library,
//! so a library cannot pass the layout check with a table that points at
//! other data or at another object's code; and it asks which file that object
//! was mapped from, to check it is the file it examined before loading.

use std::{
    ffi::{c_void, CStr, OsStr},
    os::unix::ffi::OsStrExt,
    path::PathBuf,
};

/// The loaded object (shared library or executable) a library's root module
/// was found in, identified by its base address.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) struct LoadedImage {
    base: usize,
}

impl LoadedImage {
    /// The object containing `address` (the library header abi_stable found).
    pub(crate) fn containing(address: *const c_void) -> Option<Self> {
        object_info(address).map(|info| Self { base: info.dli_fbase as usize })
    }

    /// True when `address` lies inside this same object.
    pub(crate) fn contains(self, address: *const c_void) -> bool {
        object_info(address).is_some_and(|info| info.dli_fbase as usize == self.base)
    }

    /// The file the dynamic loader mapped this object from, as it names it
    /// (`dli_fname`: the path it was opened by).
    pub(crate) fn file(self) -> Option<PathBuf> {
        let info = object_info(self.base as *const c_void)?;
        if info.dli_fname.is_null() || info.dli_fbase as usize != self.base {
            return None;
        }
        // SAFETY: a non-null `dli_fname` points at the loader's NUL-terminated
        // name of the object, which lives as long as the object stays mapped
        // (libraries are never unloaded here); it is copied at once.
        let name = unsafe { CStr::from_ptr(info.dli_fname) };
        Some(PathBuf::from(OsStr::from_bytes(name.to_bytes())))
    }
}

/// What the dynamic loader knows of the object whose mapped segments hold `address`.
fn object_info(address: *const c_void) -> Option<libc::Dl_info> {
    let mut info = std::mem::MaybeUninit::<libc::Dl_info>::zeroed();
    // SAFETY: `dladdr` only compares `address` with the loader's maps (it never
    // dereferences it) and writes `info`, which is valid for writes.
    let found = unsafe { libc::dladdr(address, info.as_mut_ptr()) };
    if found == 0 {
        return None;
    }
    // SAFETY: `dladdr` returned non-zero, so it filled `info` (and a zeroed
    // `Dl_info` is a valid value in any case: it holds only pointers).
    Some(unsafe { info.assume_init() })
}
