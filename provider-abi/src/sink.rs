//! The byte sink `execute` streams a command's output to while it runs.

use crate::export::quietly;
use abi_stable::{std_types::RSlice, StableAbi};
use std::ffi::c_void;

/// Which stream a chunk came from.
#[repr(u8)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(StableAbi, Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum OutputStream {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

impl OutputStream {
    /// `stdout` or `stderr`.
    pub const fn name(self) -> &'static str {
        match self {
            OutputStream::Stdout => "stdout",
            OutputStream::Stderr => "stderr",
        }
    }
}

/// An FFI-safe, owned callback receiving a command's output as raw bytes,
/// exactly as the command wrote them.
///
/// The provider calls [`ByteSink::write`] once per chunk, in order, possibly
/// from one of its own threads but never from two threads at once. A panic
/// in the host's closure is caught at the boundary and the chunk dropped: it
/// never unwinds into the provider. The provider owns the sink for as long
/// as the call runs and drops it (dropping the host's closure) when it ends.
#[repr(C)]
#[derive(StableAbi)]
pub struct ByteSink {
    context: *mut c_void,
    write_chunk: unsafe extern "C" fn(*mut c_void, OutputStream, RSlice<'_, u8>),
    drop_context: unsafe extern "C" fn(*mut c_void),
}

// SAFETY: `new` only accepts `Send` closures, and `write` needs `&mut self`,
// so the closure is never called from two threads at once.
unsafe impl Send for ByteSink {}

impl ByteSink {
    /// A sink calling `callback(stream, bytes)` for every chunk.
    pub fn new<F>(callback: F) -> Self
    where
        F: FnMut(OutputStream, &[u8]) + Send + 'static,
    {
        // `context` is the `Box<F>` leaked here, freed only by `drop_context`.
        Self {
            context: Box::into_raw(Box::new(callback)).cast(),
            write_chunk: write_bytes::<F>,
            drop_context: drop_boxed::<F>,
        }
    }

    /// A sink that drops every chunk.
    pub fn discard() -> Self {
        Self::new(|_: OutputStream, _: &[u8]| {})
    }

    /// Delivers one chunk to the host.
    pub fn write(&mut self, stream: OutputStream, chunk: &[u8]) {
        // SAFETY: `context` and `write_chunk` were paired by `new` (private
        // fields), and `chunk` outlives the call.
        unsafe { (self.write_chunk)(self.context, stream, RSlice::from_slice(chunk)) }
    }
}

/// Hands `chunk` to the closure `context` points at, catching its panic (the
/// chunk is dropped).
///
/// # Safety
/// `context` must point at a live `F` to which no other reference is live
/// (the sink pairs it with its own closure, and `write` takes `&mut self`).
unsafe extern "C" fn write_bytes<F>(context: *mut c_void, stream: OutputStream, chunk: RSlice<'_, u8>)
where
    F: FnMut(OutputStream, &[u8]) + Send,
{
    // SAFETY: as the caller promises.
    let callback = unsafe { &mut *context.cast::<F>() };
    quietly(|| callback(stream, chunk.as_slice()));
}

/// Drops the `Box<F>` an owned callback leaked as its context (the sink's,
/// the source's, the recorder's), swallowing a panic of the closure's `Drop`.
///
/// # Safety
/// `context` is a `Box<F>` leaked with `Box::into_raw`, and this is its one
/// and only drop.
pub(crate) unsafe extern "C" fn drop_boxed<F>(context: *mut c_void) {
    // SAFETY: the caller's contract.
    let callback = unsafe { Box::from_raw(context.cast::<F>()) };
    quietly(move || drop(callback));
}

impl Drop for ByteSink {
    fn drop(&mut self) {
        // SAFETY: paired by `new`; `drop` runs once.
        unsafe { (self.drop_context)(self.context) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sink_delivers_bytes_in_order_survives_a_panic_and_drops_its_closure() {
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let shared = std::sync::Arc::clone(&seen);
        let mut sink = ByteSink::new(move |stream: OutputStream, chunk: &[u8]| {
            if chunk == b"boom" {
                panic!("host callback failed");
            }
            shared.lock().unwrap().push((stream, chunk.to_vec()));
        });
        sink.write(OutputStream::Stdout, b"\xff\xfeA\0B\n");
        sink.write(OutputStream::Stdout, b"boom");
        sink.write(OutputStream::Stderr, b"\x80");
        drop(sink);
        assert_eq!(std::sync::Arc::strong_count(&seen), 1, "dropping the sink drops the closure");
        assert_eq!(
            *seen.lock().unwrap(),
            [(OutputStream::Stdout, b"\xff\xfeA\0B\n".to_vec()), (OutputStream::Stderr, b"\x80".to_vec())]
        );
    }

    /// A panic payload whose own `Drop` panics.
    struct PanicsWhenDropped;

    impl Drop for PanicsWhenDropped {
        fn drop(&mut self) {
            panic!("the payload's drop panicked too");
        }
    }

    #[test]
    fn a_closure_panicking_with_a_payload_that_panics_on_drop_does_not_abort() {
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let shared = std::sync::Arc::clone(&seen);
        let mut sink = ByteSink::new(move |_: OutputStream, chunk: &[u8]| {
            if chunk == b"boom" {
                std::panic::panic_any(PanicsWhenDropped);
            }
            shared.lock().unwrap().push(chunk.to_vec());
        });
        for chunk in [&b"a"[..], b"boom", b"b"] {
            sink.write(OutputStream::Stdout, chunk);
        }
        assert_eq!(*seen.lock().unwrap(), [b"a".to_vec(), b"b".to_vec()], "later chunks still arrive");
    }
}
