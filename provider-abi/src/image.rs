//! Which loaded object an address belongs to: the loader checks that every
//! function and table pointer a library hands over lies inside that library,
//! so a library cannot pass the layout check with a table that points at
//! other data or at another object's code.

use std::ffi::c_void;

/// The loaded object (shared library or executable) a library's root module
/// was found in, identified by its base address.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) struct LoadedImage {
    base: usize,
}

impl LoadedImage {
    /// The object containing `address` (the library header abi_stable found).
    pub(crate) fn containing(address: *const c_void) -> Option<Self> {
        object_base(address).map(|base| Self { base })
    }

    /// True when `address` lies inside this same object.
    pub(crate) fn contains(self, address: *const c_void) -> bool {
        object_base(address) == Some(self.base)
    }
}

/// The base address of the loaded object whose mapped segments hold `address`.
fn object_base(address: *const c_void) -> Option<usize> {
    let mut info = std::mem::MaybeUninit::<libc::Dl_info>::zeroed();
    // SAFETY: `dladdr` only compares `address` with the loader's maps (it never
    // dereferences it) and writes `info`, which is valid for writes.
    let found = unsafe { libc::dladdr(address, info.as_mut_ptr()) };
    if found == 0 {
        return None;
    }
    // SAFETY: `dladdr` returned non-zero, so it filled `info` (and a zeroed
    // `Dl_info` is a valid value in any case: it holds only pointers).
    let info = unsafe { info.assume_init() };
    Some(info.dli_fbase as usize)
}
