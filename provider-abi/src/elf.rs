//! A bounds check of an ELF shared object before the dynamic loader maps it.
//!
//! The loader maps segments without comparing them with the file's size, so a
//! truncated library "loads" and the process dies of SIGBUS when it touches a
//! missing page. This reads only the headers (a few hundred bytes), which
//! keeps loading fast; a full parser would read the whole file. Written by
//! hand because the check is small and must not read more than the headers.

use std::{
    fs::File,
    io::{Read, Seek, SeekFrom},
};

const PT_LOAD: u32 = 1;
const ET_DYN: u16 = 3;

/// Checks that `file` (open at its start) is an ELF shared object whose
/// headers and loadable segments lie inside the file. Returns a one-line
/// reason otherwise.
pub fn check_shared_object(file: &mut File) -> Result<(), String> {
    let len = file.metadata().map_err(|error| error.to_string())?.len();
    let mut ident = [0u8; 64];
    let read = read_up_to(file, &mut ident)?;
    if read < 16 || &ident[..4] != b"\x7fELF" {
        return Err("not an ELF file".into());
    }
    let wide = match ident[4] {
        1 => false,
        2 => true,
        _ => return Err("unknown ELF class".into()),
    };
    let little = match ident[5] {
        1 => true,
        2 => false,
        _ => return Err("unknown ELF byte order".into()),
    };
    let header_len = if wide { 64 } else { 52 };
    if read < header_len {
        return Err("truncated ELF header".into());
    }
    let fields = Fields { bytes: &ident, little };
    if fields.u16(16) != ET_DYN {
        return Err("not a shared object".into());
    }
    let (phoff, shoff, phentsize, phnum, shentsize, shnum) = if wide {
        (fields.u64(32), fields.u64(40), fields.u16(54), fields.u16(56), fields.u16(58), fields.u16(60))
    } else {
        let (phoff, shoff) = (u64::from(fields.u32(28)), u64::from(fields.u32(32)));
        (phoff, shoff, fields.u16(42), fields.u16(44), fields.u16(46), fields.u16(48))
    };
    let within = |offset: u64, size: u64| offset.checked_add(size).is_some_and(|end| end <= len);
    if !within(phoff, u64::from(phentsize) * u64::from(phnum))
        || (shoff != 0 && !within(shoff, u64::from(shentsize) * u64::from(shnum)))
    {
        return Err("truncated file: its header tables lie past its end".into());
    }
    let mut table = vec![0u8; usize::from(phentsize) * usize::from(phnum)];
    file.seek(SeekFrom::Start(phoff)).map_err(|error| error.to_string())?;
    file.read_exact(&mut table).map_err(|error| error.to_string())?;
    for entry in table.chunks_exact(usize::from(phentsize.max(1))) {
        let segment = Fields { bytes: entry, little };
        if segment.u32(0) != PT_LOAD {
            continue;
        }
        let (offset, size) = if wide {
            (segment.u64(8), segment.u64(32))
        } else {
            (u64::from(segment.u32(4)), u64::from(segment.u32(16)))
        };
        if !within(offset, size) {
            return Err("truncated file: a loadable segment lies past its end".into());
        }
    }
    Ok(())
}

fn read_up_to(file: &mut File, buffer: &mut [u8]) -> Result<usize, String> {
    let mut filled = 0;
    while filled < buffer.len() {
        match file.read(&mut buffer[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error.to_string()),
        }
    }
    Ok(filled)
}

/// Reads fixed-width integers of the file's byte order; out-of-range reads are 0.
struct Fields<'a> {
    bytes: &'a [u8],
    little: bool,
}

impl Fields<'_> {
    fn array<const N: usize>(&self, at: usize) -> [u8; N] {
        self.bytes.get(at..at + N).and_then(|slice| slice.try_into().ok()).unwrap_or([0; N])
    }
    fn u16(&self, at: usize) -> u16 {
        let raw = self.array(at);
        if self.little {
            u16::from_le_bytes(raw)
        } else {
            u16::from_be_bytes(raw)
        }
    }
    fn u32(&self, at: usize) -> u32 {
        let raw = self.array(at);
        if self.little {
            u32::from_le_bytes(raw)
        } else {
            u32::from_be_bytes(raw)
        }
    }
    fn u64(&self, at: usize) -> u64 {
        let raw = self.array(at);
        if self.little {
            u64::from_le_bytes(raw)
        } else {
            u64::from_be_bytes(raw)
        }
    }
}
