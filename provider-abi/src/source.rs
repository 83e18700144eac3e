//! The byte source `execute` pulls a command's
//! standard input from, piece by piece, so that input of any size crosses
//! the boundary in bounded memory.

use crate::{
    error::{HookResult, ProviderError},
    export::quietly,
};
use abi_stable::{
    std_types::{RResult, RSliceMut},
    StableAbi,
};
use std::{ffi::c_void, io::Read};

/// What a panic in the host's source becomes: the host's panic text stays on
/// the host side.
const SOURCE_PANICKED: &str = "The host panicked while reading the command's standard input.";

/// An FFI-safe, owned source of bytes the provider pulls: a command's
/// standard input (`execute`).
///
/// [`ByteSource::read`] fills a buffer the provider owns with the next
/// bytes and returns how many it wrote; `0` is the end of the input. A read
/// may block (a pipe, a terminal), so the provider calls it from a thread it
/// may block, never from its async runtime, and stops calling it once it no
/// longer needs the input (the call was cancelled or timed out); it may then
/// drop the source while a read is still blocked on another of its threads
/// only after that read returned. A host error comes back as the read's
/// `Err`; a panic in the host's closure is caught at the boundary and comes
/// back as an `internal` error. The provider owns the source for as long as
/// the call needs it and drops it (dropping the host's closure) when done.
#[repr(C)]
#[derive(StableAbi)]
pub struct ByteSource {
    context: *mut c_void,
    read_chunk: unsafe extern "C" fn(*mut c_void, RSliceMut<'_, u8>) -> RResult<usize, ProviderError>,
    drop_context: unsafe extern "C" fn(*mut c_void),
}

// SAFETY: `new` only accepts `Send` closures, and `read` needs `&mut self`,
// so the closure is never called from two threads at once.
unsafe impl Send for ByteSource {}

impl ByteSource {
    /// A source calling `callback(buffer)` for the next bytes; it returns
    /// how many it wrote at the start of `buffer` (`0`: the end).
    pub fn new<F>(callback: F) -> Self
    where
        F: FnMut(&mut [u8]) -> HookResult<usize> + Send + 'static,
    {
        unsafe extern "C" fn trampoline<F>(
            context: *mut c_void,
            buffer: RSliceMut<'_, u8>,
        ) -> RResult<usize, ProviderError>
        where
            F: FnMut(&mut [u8]) -> HookResult<usize> + Send,
        {
            // SAFETY: `context` is the `Box<F>` leaked by `new`, freed only by
            // `drop_context`; `read` takes `&mut self`, so no other reference
            // to it is live.
            let callback = unsafe { &mut *context.cast::<F>() };
            let mut buffer = buffer;
            let capacity = buffer.len();
            match quietly(|| callback(buffer.as_mut_slice())) {
                Some(Ok(written)) if written <= capacity => RResult::ROk(written),
                Some(Ok(_)) => {
                    RResult::RErr(ProviderError::internal("The host's input source overstated a read."))
                }
                Some(Err(error)) => RResult::RErr(error),
                None => RResult::RErr(ProviderError::internal(SOURCE_PANICKED)),
            }
        }
        Self {
            context: Box::into_raw(Box::new(callback)).cast(),
            read_chunk: trampoline::<F>,
            drop_context: crate::sink::drop_boxed::<F>,
        }
    }

    /// A source reading `reader` (a file, a pipe); an I/O error is an
    /// `internal` error naming its kind (never a path or the bytes).
    pub fn from_reader<R: Read + Send + 'static>(mut reader: R) -> Self {
        Self::new(move |buffer: &mut [u8]| loop {
            match reader.read(buffer) {
                Ok(read) => return Ok(read),
                Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
                Err(error) => {
                    return Err(ProviderError::internal(format!(
                        "The command's standard input could not be read: {}.",
                        error.kind()
                    )))
                }
            }
        })
    }

    /// A source of no bytes: a command without standard input. Its context
    /// is null (no closure, not even an empty one, has a null box), which
    /// marks it in any library: see [`ByteSource::is_empty`].
    pub fn empty() -> Self {
        unsafe extern "C" fn read_nothing(
            _: *mut c_void,
            _: RSliceMut<'_, u8>,
        ) -> RResult<usize, ProviderError> {
            RResult::ROk(0)
        }
        unsafe extern "C" fn drop_nothing(_: *mut c_void) {}
        Self { context: std::ptr::null_mut(), read_chunk: read_nothing, drop_context: drop_nothing }
    }

    /// True for a source made by [`ByteSource::empty`]: a provider may skip
    /// reading it (and the thread a read that may block needs).
    pub fn is_empty(&self) -> bool {
        self.context.is_null()
    }

    /// A source of `bytes`, held in memory.
    pub fn from_bytes(bytes: Vec<u8>) -> Self {
        Self::from_reader(std::io::Cursor::new(bytes))
    }

    /// Fills the start of `buffer` with the next bytes; `Ok(0)` at the end.
    pub fn read(&mut self, buffer: &mut [u8]) -> HookResult<usize> {
        // SAFETY: `context` and `read_chunk` were paired by `new` (private
        // fields), and `buffer` outlives the call.
        unsafe { (self.read_chunk)(self.context, RSliceMut::from_mut_slice(buffer)) }.into()
    }
}

impl Drop for ByteSource {
    fn drop(&mut self) {
        // SAFETY: paired by `new`; `drop` runs once.
        unsafe { (self.drop_context)(self.context) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_empty_source_is_known_empty_and_it_reads_nothing() {
        let mut empty = ByteSource::empty();
        assert!(empty.is_empty());
        assert_eq!(empty.read(&mut [0; 8]).unwrap(), 0);
        assert!(!ByteSource::new(|_: &mut [u8]| Ok(0)).is_empty(), "an empty closure is a closure");
        assert!(!ByteSource::from_bytes(Vec::new()).is_empty(), "its end is known only by reading");
    }

    /// A reader that counts its drops in `dropped`.
    struct Counted(std::io::Cursor<Vec<u8>>, std::sync::Arc<std::sync::atomic::AtomicUsize>);

    impl Read for Counted {
        fn read(&mut self, buffer: &mut [u8]) -> std::io::Result<usize> {
            self.0.read(buffer)
        }
    }

    impl Drop for Counted {
        fn drop(&mut self) {
            self.1.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    #[test]
    fn a_source_reads_to_its_end_and_drops_its_reader() {
        let data: Vec<u8> = (0..100_000u32).map(|i| i as u8).collect();
        let dropped = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut source =
            ByteSource::from_reader(Counted(std::io::Cursor::new(data.clone()), dropped.clone()));
        let (mut read, mut buffer) = (Vec::new(), [0u8; 4096]);
        loop {
            match source.read(&mut buffer).unwrap() {
                0 => break,
                n => read.extend_from_slice(&buffer[..n]),
            }
        }
        assert_eq!(read, data);
        assert_eq!(dropped.load(std::sync::atomic::Ordering::SeqCst), 0, "read to the end, still held");
        drop(source);
        assert_eq!(dropped.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    #[test]
    fn an_interrupted_read_is_retried_and_another_error_is_named_by_its_kind() {
        use std::io::{Error, ErrorKind};
        let mut replies =
            vec![Err(ErrorKind::PermissionDenied), Ok(b"ab".as_slice()), Err(ErrorKind::Interrupted)];
        let mut source =
            ByteSource::from_reader(FnReader(move |buffer: &mut [u8]| match replies.pop().unwrap() {
                Ok(bytes) => {
                    buffer[..bytes.len()].copy_from_slice(bytes);
                    Ok(bytes.len())
                }
                Err(kind) => Err(Error::from(kind)),
            }));
        let mut buffer = [0u8; 8];
        assert_eq!(source.read(&mut buffer).unwrap(), 2, "the interruption is not the reader's answer");
        assert_eq!(&buffer[..2], b"ab");
        let error = source.read(&mut buffer).unwrap_err();
        assert_eq!(
            error.message.as_str(),
            "The command's standard input could not be read: permission denied."
        );
    }

    /// A reader made of a closure.
    struct FnReader<F>(F);

    impl<F: FnMut(&mut [u8]) -> std::io::Result<usize>> Read for FnReader<F> {
        fn read(&mut self, buffer: &mut [u8]) -> std::io::Result<usize> {
            (self.0)(buffer)
        }
    }

    #[test]
    fn panics_errors_and_overstated_reads_stay_on_the_host_side() {
        let mut calls = 0;
        let mut source = ByteSource::new(move |buffer: &mut [u8]| {
            calls += 1;
            match calls {
                1 => panic!("host source failed"),
                2 => Err(ProviderError::internal("no input")),
                _ => Ok(buffer.len() + 1),
            }
        });
        let mut buffer = [0u8; 8];
        assert_eq!(source.read(&mut buffer).unwrap_err().message.as_str(), SOURCE_PANICKED);
        assert_eq!(source.read(&mut buffer).unwrap_err().message.as_str(), "no input");
        assert!(source.read(&mut buffer).is_err(), "more bytes than the buffer holds is refused");
    }
}
