//! A command's output bytes as the text chunks of `execute.log`.
//!
//! JSON-RPC carries text, so bytes go out as UTF-8: a character split
//! between two pieces of output is held back until its last byte arrives,
//! and bytes that are not UTF-8 become U+FFFD (the replacement character),
//! as in the final `stdout` and `stderr` of the result. A chunk is at most
//! [`MAX_CHUNK_BYTES`] long (the host drops chunks over a million
//! characters; a UTF-16 length never exceeds the UTF-8 one).

/// The longest chunk sent, in bytes of UTF-8.
pub const MAX_CHUNK_BYTES: usize = 1_000_000;

/// Decodes one stream's output as it arrives.
#[derive(Debug, Default)]
pub struct Utf8Stream {
    /// The first bytes of a character whose last bytes have not arrived.
    pending: Vec<u8>,
}

impl Utf8Stream {
    /// The text of `bytes` after what came before, without a character
    /// still incomplete at its end.
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let complete = self.pending.len() - incomplete_tail(&self.pending);
        let text = String::from_utf8_lossy(&self.pending[..complete]).into_owned();
        self.pending.drain(..complete);
        text
    }

    /// What is left at the end of the output (an incomplete character, as U+FFFD).
    pub fn finish(&mut self) -> String {
        let text = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        text
    }
}

/// How many bytes at the end of `bytes` begin a character that needs more.
fn incomplete_tail(bytes: &[u8]) -> usize {
    for back in 1..=bytes.len().min(3) {
        let byte = bytes[bytes.len() - back];
        if byte & 0b1100_0000 == 0b1000_0000 {
            continue; // a continuation byte: look further back
        }
        let needed = match byte {
            0xC2..=0xDF => 2,
            0xE0..=0xEF => 3,
            0xF0..=0xF4 => 4,
            _ => return 0,
        };
        return if back < needed { back } else { 0 };
    }
    0
}

/// `text` in pieces of at most [`MAX_CHUNK_BYTES`], cut between characters.
pub fn chunks(text: &str) -> impl Iterator<Item = &str> {
    let mut rest = text;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let mut end = rest.len().min(MAX_CHUNK_BYTES);
        while !rest.is_char_boundary(end) {
            end -= 1;
        }
        let (chunk, after) = rest.split_at(end);
        rest = after;
        Some(chunk)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_character_split_between_pieces_arrives_whole() {
        let text = "añ€😀";
        let bytes = text.as_bytes();
        for split in 0..=bytes.len() {
            let mut stream = Utf8Stream::default();
            let mut out = stream.push(&bytes[..split]);
            out += &stream.push(&bytes[split..]);
            out += &stream.finish();
            assert_eq!(out, text, "split at {split}");
        }
        let mut stream = Utf8Stream::default();
        let got: String = bytes.iter().map(|byte| stream.push(&[*byte])).collect();
        assert_eq!(got, text, "one byte at a time");
    }

    #[test]
    fn bytes_that_are_not_utf8_become_replacement_characters() {
        let mut stream = Utf8Stream::default();
        assert_eq!(stream.push(b"ok \xff\xfe end"), "ok \u{FFFD}\u{FFFD} end");
        assert_eq!(stream.push(b"cut \xE2\x82"), "cut ");
        assert_eq!(stream.finish(), "\u{FFFD}");
        assert_eq!(stream.push(b"\x82 after"), "\u{FFFD} after", "a lone continuation byte");
    }

    #[test]
    fn chunks_stay_under_the_bound_and_between_characters() {
        let text = "é".repeat(MAX_CHUNK_BYTES); // 2 bytes each
        let pieces: Vec<&str> = chunks(&text).collect();
        assert!(pieces.iter().all(|piece| piece.len() <= MAX_CHUNK_BYTES && !piece.is_empty()));
        assert_eq!(pieces.concat(), text);
        assert_eq!(chunks("").count(), 0);
    }
}
