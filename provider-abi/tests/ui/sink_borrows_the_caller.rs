// A byte sink outlives the call that made it (the provider owns it), so its
// closure may not borrow the caller's stack.
#![forbid(unsafe_code)]
use provider_abi::{ByteSink, OutputStream};

fn main() {
    let mut collected = Vec::new();
    let _borrowing = ByteSink::new(|_: OutputStream, chunk: &[u8]| collected.extend_from_slice(chunk));
}
