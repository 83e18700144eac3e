//! The output sinks `execute` (text, [`OutputSink`]) and `execute_bytes`
//! (raw bytes, [`ByteSink`], ABI 1.3) stream chunks to while a command runs.

use abi_stable::{
    std_types::{RSlice, RStr},
    StableAbi,
};
use std::{
    ffi::c_void,
    marker::PhantomData,
    panic::{catch_unwind, AssertUnwindSafe},
};

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

/// An FFI-safe callback receiving output chunks as they arrive.
///
/// The host builds it from a closure; the provider calls [`OutputSink::write`]
/// once per decoded chunk, in order, possibly from one of its own threads but
/// never from two threads at once. A panic in the host's closure is caught at
/// the boundary and the chunk is dropped: it never unwinds into the provider.
#[repr(C)]
#[derive(StableAbi)]
pub struct OutputSink<'a> {
    context: *mut c_void,
    write_chunk: unsafe extern "C" fn(*mut c_void, OutputStream, RStr<'_>),
    _borrow: PhantomData<&'a mut ()>,
}

// SAFETY: `new` only accepts `Send` closures, and `write` needs `&mut self`,
// so the closure is never called from two threads at once.
unsafe impl Send for OutputSink<'_> {}

impl<'a> OutputSink<'a> {
    /// A sink calling `callback(stream, chunk)` for every chunk.
    pub fn new<F>(callback: &'a mut F) -> Self
    where
        F: FnMut(OutputStream, &str) + Send,
    {
        unsafe extern "C" fn trampoline<F>(context: *mut c_void, stream: OutputStream, chunk: RStr<'_>)
        where
            F: FnMut(OutputStream, &str) + Send,
        {
            // SAFETY: `context` is the `&'a mut F` given to `new`, alive for 'a;
            // `write` takes `&mut self`, so no other reference to it is live.
            let callback = unsafe { &mut *context.cast::<F>() };
            if let Err(payload) = catch_unwind(AssertUnwindSafe(|| callback(stream, chunk.as_str()))) {
                crate::export::drop_panic_payload(payload);
            }
        }
        Self { context: (callback as *mut F).cast(), write_chunk: trampoline::<F>, _borrow: PhantomData }
    }

    /// Delivers one chunk to the host.
    pub fn write(&mut self, stream: OutputStream, chunk: &str) {
        // SAFETY: `context` and `write_chunk` were paired by `new` (the fields
        // are private, so nothing else can pair them), and `chunk` outlives
        // the call.
        unsafe { (self.write_chunk)(self.context, stream, RStr::from_str(chunk)) }
    }
}

/// An FFI-safe callback receiving output chunks as raw bytes, exactly as the
/// command wrote them (ABI 1.3, `execute_bytes`).
///
/// The same contract as [`OutputSink`]: chunks in order, never from two
/// threads at once, and a panic in the host's closure is caught at the
/// boundary and the chunk dropped.
#[repr(C)]
#[derive(StableAbi)]
pub struct ByteSink<'a> {
    context: *mut c_void,
    write_chunk: unsafe extern "C" fn(*mut c_void, OutputStream, RSlice<'_, u8>),
    _borrow: PhantomData<&'a mut ()>,
}

// SAFETY: as for `OutputSink`: `Send` closures only, `write` needs `&mut self`.
unsafe impl Send for ByteSink<'_> {}

impl<'a> ByteSink<'a> {
    /// A sink calling `callback(stream, bytes)` for every chunk.
    pub fn new<F>(callback: &'a mut F) -> Self
    where
        F: FnMut(OutputStream, &[u8]) + Send,
    {
        // `context` is the `&'a mut F` given here, alive for 'a.
        Self { context: (callback as *mut F).cast(), write_chunk: write_bytes::<F>, _borrow: PhantomData }
    }

    /// Delivers one chunk to the host.
    pub fn write(&mut self, stream: OutputStream, chunk: &[u8]) {
        // SAFETY: `context` and `write_chunk` were paired by `new` (private
        // fields), and `chunk` outlives the call.
        unsafe { (self.write_chunk)(self.context, stream, RSlice::from_slice(chunk)) }
    }
}

/// An FFI-safe, owned callback receiving output chunks as raw bytes: what an
/// async `execute` (ABI 1.7) streams to while the host awaits its future.
///
/// The same contract as [`ByteSink`] (chunks in order, never from two threads
/// at once, a panic in the host's closure caught at the boundary and the
/// chunk dropped), but the provider owns it for as long as the call runs and
/// drops it (dropping the host's closure) when the call ends.
#[repr(C)]
#[derive(StableAbi)]
pub struct OwnedByteSink {
    context: *mut c_void,
    write_chunk: unsafe extern "C" fn(*mut c_void, OutputStream, RSlice<'_, u8>),
    drop_context: unsafe extern "C" fn(*mut c_void),
}

// SAFETY: `new` only accepts `Send` closures, and `write` needs `&mut self`.
unsafe impl Send for OwnedByteSink {}

impl OwnedByteSink {
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

    /// Delivers one chunk to the host.
    pub fn write(&mut self, stream: OutputStream, chunk: &[u8]) {
        // SAFETY: `context` and `write_chunk` were paired by `new` (private
        // fields), and `chunk` outlives the call.
        unsafe { (self.write_chunk)(self.context, stream, RSlice::from_slice(chunk)) }
    }
}

/// The write function of both byte sinks: hands `chunk` to the closure
/// `context` points at, catching its panic (the chunk is dropped).
///
/// # Safety
/// `context` must point at a live `F` to which no other reference is live
/// (both sinks pair it with their own closure, and `write` takes `&mut self`).
unsafe extern "C" fn write_bytes<F>(context: *mut c_void, stream: OutputStream, chunk: RSlice<'_, u8>)
where
    F: FnMut(OutputStream, &[u8]) + Send,
{
    // SAFETY: as the caller promises.
    let callback = unsafe { &mut *context.cast::<F>() };
    if let Err(payload) = catch_unwind(AssertUnwindSafe(|| callback(stream, chunk.as_slice()))) {
        crate::export::drop_panic_payload(payload);
    }
}

/// Drops the `Box<F>` an owned callback leaked as its context (the sink's,
/// the async recorder's), swallowing a panic of the closure's `Drop`.
///
/// # Safety
/// `context` is a `Box<F>` leaked with `Box::into_raw`, and this is its one
/// and only drop.
pub(crate) unsafe extern "C" fn drop_boxed<F>(context: *mut c_void) {
    // SAFETY: the caller's contract.
    let callback = unsafe { Box::from_raw(context.cast::<F>()) };
    if let Err(payload) = catch_unwind(AssertUnwindSafe(move || drop(callback))) {
        crate::export::drop_panic_payload(payload);
    }
}

impl Drop for OwnedByteSink {
    fn drop(&mut self) {
        // SAFETY: paired by `new`; `drop` runs once.
        unsafe { (self.drop_context)(self.context) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_owned_sink_delivers_in_order_survives_a_panic_and_drops_its_closure() {
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let shared = std::sync::Arc::clone(&seen);
        let mut sink = OwnedByteSink::new(move |stream: OutputStream, chunk: &[u8]| {
            if chunk == b"boom" {
                panic!("host callback failed");
            }
            shared.lock().unwrap().push((stream, chunk.to_vec()));
        });
        sink.write(OutputStream::Stdout, b"a");
        sink.write(OutputStream::Stdout, b"boom");
        sink.write(OutputStream::Stderr, b"b");
        drop(sink);
        assert_eq!(std::sync::Arc::strong_count(&seen), 1, "dropping the sink drops the closure");
        assert_eq!(
            *seen.lock().unwrap(),
            [(OutputStream::Stdout, b"a".to_vec()), (OutputStream::Stderr, b"b".to_vec())]
        );
    }

    #[test]
    fn bytes_reach_the_closure_unchanged_and_panics_stay_on_the_host_side() {
        let mut seen = Vec::new();
        let mut callback = |stream: OutputStream, chunk: &[u8]| {
            if chunk == b"boom" {
                std::panic::panic_any(PanicsWhenDropped);
            }
            seen.push((stream, chunk.to_vec()));
        };
        let mut sink = ByteSink::new(&mut callback);
        sink.write(OutputStream::Stdout, b"\xff\xfeA\0B\n");
        sink.write(OutputStream::Stderr, b"boom");
        sink.write(OutputStream::Stderr, b"\x80");
        assert_eq!(
            seen,
            [(OutputStream::Stdout, b"\xff\xfeA\0B\n".to_vec()), (OutputStream::Stderr, b"\x80".to_vec())]
        );
    }

    #[test]
    fn chunks_reach_the_closure_in_order_and_panics_stay_on_the_host_side() {
        let mut seen = Vec::new();
        let mut callback = |stream: OutputStream, chunk: &str| {
            if chunk == "boom" {
                panic!("host callback failed");
            }
            seen.push((stream, chunk.to_owned()));
        };
        let mut sink = OutputSink::new(&mut callback);
        sink.write(OutputStream::Stdout, "a");
        sink.write(OutputStream::Stderr, "boom");
        sink.write(OutputStream::Stderr, "b");
        assert_eq!(seen, [(OutputStream::Stdout, "a".to_owned()), (OutputStream::Stderr, "b".to_owned())]);
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
        let mut seen = Vec::new();
        let mut callback = |_: OutputStream, chunk: &str| {
            if chunk == "boom" {
                std::panic::panic_any(PanicsWhenDropped);
            }
            seen.push(chunk.to_owned());
        };
        let mut sink = OutputSink::new(&mut callback);
        sink.write(OutputStream::Stdout, "a");
        sink.write(OutputStream::Stdout, "boom");
        sink.write(OutputStream::Stdout, "b");
        assert_eq!(seen, ["a", "b"], "the process survived and later chunks still arrive");
    }
}
