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

const PT_LOAD: u64 = 1;
const ET_DYN: u64 = 3;

/// Checks that `file` (open at its start) is an ELF shared object whose
/// headers and loadable segments lie inside the file. Returns a one-line
/// reason otherwise.
pub fn check_shared_object(file: &mut File) -> Result<(), String> {
    let len = file.metadata().map_err(|error| error.to_string())?.len();
    let mut ident = Vec::with_capacity(64);
    file.by_ref().take(64).read_to_end(&mut ident).map_err(|error| error.to_string())?;
    if ident.len() < 16 || &ident[..4] != b"\x7fELF" {
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
    if ident.len() < if wide { 64 } else { 52 } {
        return Err("truncated ELF header".into());
    }
    let fields = Fields { bytes: &ident, little };
    if fields.get(16, 2) != ET_DYN {
        return Err("not a shared object".into());
    }
    // Where the header keeps the two tables' offsets (a word each), then
    // their entry sizes and counts (two bytes each).
    let (at, word) = if wide { ([32, 40, 54, 56, 58, 60], 8) } else { ([28, 32, 42, 44, 46, 48], 4) };
    let [phoff, shoff, phentsize, phnum, shentsize, shnum] =
        std::array::from_fn(|i| fields.get(at[i], if i < 2 { word } else { 2 }));
    let within = |offset: u64, size: u64| offset.checked_add(size).is_some_and(|end| end <= len);
    if !within(phoff, phentsize * phnum) || (shoff != 0 && !within(shoff, shentsize * shnum)) {
        return Err("truncated file: its header tables lie past its end".into());
    }
    let mut table = vec![0u8; (phentsize * phnum) as usize];
    file.seek(SeekFrom::Start(phoff)).map_err(|error| error.to_string())?;
    file.read_exact(&mut table).map_err(|error| error.to_string())?;
    for entry in table.chunks_exact(phentsize.max(1) as usize) {
        let segment = Fields { bytes: entry, little };
        if segment.get(0, 4) != PT_LOAD {
            continue;
        }
        let (offset, size) = if wide {
            (segment.get(8, 8), segment.get(32, 8))
        } else {
            (segment.get(4, 4), segment.get(16, 4))
        };
        if !within(offset, size) {
            return Err("truncated file: a loadable segment lies past its end".into());
        }
    }
    Ok(())
}

/// Reads unsigned integers of the file's byte order; out-of-range reads are 0.
struct Fields<'a> {
    bytes: &'a [u8],
    little: bool,
}

impl Fields<'_> {
    /// The `width`-byte integer at `at`.
    fn get(&self, at: usize, width: usize) -> u64 {
        let Some(bytes) = self.bytes.get(at..at + width) else { return 0 };
        let next = |value: u64, byte: &u8| value << 8 | u64::from(*byte);
        if self.little {
            bytes.iter().rev().fold(0, next)
        } else {
            bytes.iter().fold(0, next)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    const PT_NOTE: u64 = 4;
    const ET_EXEC: u64 = 2;

    /// An ELF image under construction, in one class and byte order.
    struct Elf {
        wide: bool,
        little: bool,
        bytes: Vec<u8>,
    }

    /// Where the header keeps a table's offset, entry size and entry count
    /// (ELF64, ELF32).
    const PROGRAM_TABLE: [(usize, usize, usize); 2] = [(32, 54, 56), (28, 42, 44)];
    const SECTION_TABLE: [(usize, usize, usize); 2] = [(40, 58, 60), (32, 46, 48)];

    impl Elf {
        /// The bare ELF header of a shared object: no tables.
        fn header(wide: bool, little: bool) -> Elf {
            let mut elf = Elf { wide, little, bytes: vec![0; if wide { 64 } else { 52 }] };
            elf.bytes[..4].copy_from_slice(b"\x7fELF");
            elf.bytes[4] = if wide { 2 } else { 1 };
            elf.bytes[5] = if little { 1 } else { 2 };
            elf.bytes[6] = 1;
            elf.put(16, 2, ET_DYN);
            elf
        }

        /// A small shared object: the header, a program header table with a
        /// loadable segment covering the whole file and a note, a section
        /// header table of three entries, and some contents.
        fn library(wide: bool, little: bool) -> Elf {
            let mut elf = Elf::header(wide, little);
            let phentsize = if wide { 56 } else { 32 };
            let shentsize = if wide { 64 } else { 40 };
            let phoff = elf.bytes.len();
            let shoff = phoff + 2 * phentsize;
            let len = shoff + 3 * shentsize + 256;
            elf.bytes.resize(len, 0xa5);
            elf.table(PROGRAM_TABLE, phoff as u64, phentsize as u16, 2);
            elf.table(SECTION_TABLE, shoff as u64, shentsize as u16, 3);
            elf.bytes[phoff..shoff + 3 * shentsize].fill(0);
            elf.segment(0, PT_LOAD, 0, len as u64);
            elf.segment(1, PT_NOTE, 0, 0);
            elf
        }

        /// Writes `value` as a `width`-byte integer of the image's byte order.
        fn put(&mut self, at: usize, width: usize, value: u64) {
            let field = if self.little {
                value.to_le_bytes()[..width].to_vec()
            } else {
                value.to_be_bytes()[8 - width..].to_vec()
            };
            self.bytes[at..at + width].copy_from_slice(&field);
        }

        /// A word: 4 bytes in ELF32, 8 in ELF64.
        fn word(&self) -> usize {
            if self.wide {
                8
            } else {
                4
            }
        }

        /// Points the header at a table.
        fn table(&mut self, fields: [(usize, usize, usize); 2], offset: u64, entsize: u16, count: u16) {
            let (at_offset, at_entsize, at_count) = fields[usize::from(!self.wide)];
            self.put(at_offset, self.word(), offset);
            self.put(at_entsize, 2, entsize.into());
            self.put(at_count, 2, count.into());
        }

        /// Sets entry `index` of the program header table.
        fn segment(&mut self, index: usize, kind: u64, offset: u64, size: u64) {
            let table = Fields { bytes: &self.bytes, little: self.little };
            let (phoff, phentsize) = if self.wide {
                (table.get(32, 8), table.get(54, 2))
            } else {
                (table.get(28, 4), table.get(42, 2))
            };
            let at = (phoff + phentsize * index as u64) as usize;
            self.put(at, 4, kind);
            let (at_offset, at_size) = if self.wide { (at + 8, at + 32) } else { (at + 4, at + 16) };
            self.put(at_offset, self.word(), offset);
            self.put(at_size, self.word(), size);
        }

        fn check(&self) -> Result<(), String> {
            check(&self.bytes)
        }
    }

    fn check(bytes: &[u8]) -> Result<(), String> {
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(bytes).unwrap();
        file.seek(SeekFrom::Start(0)).unwrap();
        check_shared_object(&mut file)
    }

    const SHAPES: [(bool, bool); 4] = [(true, true), (true, false), (false, true), (false, false)];

    #[test]
    fn shared_objects_of_either_class_and_byte_order_pass() {
        for (wide, little) in SHAPES {
            let shape = format!("wide {wide}, little {little}");
            assert_eq!(Elf::library(wide, little).check(), Ok(()), "{shape}");
            // The bare header (no tables, no contents) passes too.
            assert_eq!(Elf::header(wide, little).check(), Ok(()), "{shape}");
        }
    }

    #[test]
    fn a_file_without_the_elf_magic_or_its_identification_is_not_an_elf_file() {
        let ident = &Elf::header(true, true).bytes[..16];
        let mut garbage = Elf::library(true, true).bytes;
        garbage[..4].copy_from_slice(b"\x7fELG");
        let text = b"#!/bin/sh\necho not a library\n";
        for bytes in [&[][..], &ident[..4], &ident[..15], &text[..], &garbage[..]] {
            assert_eq!(check(bytes), Err("not an ELF file".into()), "{bytes:?}");
        }
    }

    #[test]
    fn a_header_cut_short_is_truncated() {
        let wide = Elf::header(true, true).bytes;
        let narrow = Elf::header(false, false).bytes;
        for bytes in [&wide[..16], &wide[..63], &narrow[..16], &narrow[..51]] {
            assert_eq!(check(bytes), Err("truncated ELF header".into()), "{} bytes", bytes.len());
        }
    }

    #[test]
    fn unknown_classes_and_byte_orders_are_refused() {
        for class in [0, 3] {
            let mut elf = Elf::library(true, true);
            elf.bytes[4] = class;
            assert_eq!(elf.check(), Err("unknown ELF class".into()), "class {class}");
        }
        for order in [0, 3] {
            let mut elf = Elf::library(true, true);
            elf.bytes[5] = order;
            assert_eq!(elf.check(), Err("unknown ELF byte order".into()), "byte order {order}");
        }
    }

    #[test]
    fn an_executable_is_not_a_shared_object() {
        for (wide, little) in SHAPES {
            let mut elf = Elf::library(wide, little);
            elf.put(16, 2, ET_EXEC);
            assert_eq!(elf.check(), Err("not a shared object".into()), "wide {wide}, little {little}");
        }
    }

    #[test]
    fn header_tables_past_the_end_are_refused_and_an_absent_section_table_is_not_read() {
        const PAST: &str = "truncated file: its header tables lie past its end";
        for (wide, little) in SHAPES {
            let shape = format!("wide {wide}, little {little}");
            let library = Elf::library(wide, little);
            let len = library.bytes.len() as u64;
            let (phentsize, shentsize) = if wide { (56, 64) } else { (32, 40) };
            let header = if wide { 64 } else { 52 };
            // Twenty entries run past the end; entry size plus count, or
            // entry size over count, would not.
            let mut elf = Elf::library(wide, little);
            elf.table(PROGRAM_TABLE, header, phentsize, 20);
            assert_eq!(elf.check(), Err(PAST.into()), "program headers, {shape}");
            let mut elf = Elf::library(wide, little);
            elf.table(SECTION_TABLE, header, shentsize, 20);
            assert_eq!(elf.check(), Err(PAST.into()), "section headers, {shape}");
            // A table that ends exactly at the end of the file is inside it.
            let mut elf = Elf::library(wide, little);
            elf.table(SECTION_TABLE, len - u64::from(shentsize), shentsize, 1);
            assert_eq!(elf.check(), Ok(()), "section headers up to the end, {shape}");
            let mut elf = Elf::library(wide, little);
            elf.table(SECTION_TABLE, len - u64::from(shentsize) + 1, shentsize, 1);
            assert_eq!(elf.check(), Err(PAST.into()), "section headers one byte past the end, {shape}");
            // Section header offset 0: there is no section table, whatever
            // its entry size and count say.
            let mut elf = Elf::library(wide, little);
            elf.table(SECTION_TABLE, 0, shentsize, 20);
            assert_eq!(elf.check(), Ok(()), "no section headers, {shape}");
        }
        // An offset so large that offset plus size overflows lies past the end.
        let mut elf = Elf::library(true, true);
        elf.table(PROGRAM_TABLE, u64::MAX, 56, 2);
        assert_eq!(elf.check(), Err(PAST.into()));
    }

    #[test]
    fn a_loadable_segment_past_the_end_is_refused_and_other_segments_are_not_checked() {
        const PAST: &str = "truncated file: a loadable segment lies past its end";
        for (wide, little) in SHAPES {
            let shape = format!("wide {wide}, little {little}");
            let len = Elf::library(wide, little).bytes.len() as u64;
            let mut elf = Elf::library(wide, little);
            elf.segment(0, PT_LOAD, 0, len + 1);
            assert_eq!(elf.check(), Err(PAST.into()), "size one past the end, {shape}");
            let mut elf = Elf::library(wide, little);
            elf.segment(0, PT_LOAD, len, 1);
            assert_eq!(elf.check(), Err(PAST.into()), "offset at the end, {shape}");
            // The second entry is checked as well as the first.
            let mut elf = Elf::library(wide, little);
            elf.segment(1, PT_LOAD, 1, len);
            assert_eq!(elf.check(), Err(PAST.into()), "second segment, {shape}");
            // A segment that is not loaded is never mapped: not checked.
            let mut elf = Elf::library(wide, little);
            elf.segment(1, PT_NOTE, len + 4096, 16);
            assert_eq!(elf.check(), Ok(()), "a note past the end, {shape}");
        }
        let mut elf = Elf::library(true, true);
        elf.segment(0, PT_LOAD, u64::MAX, 2);
        assert_eq!(elf.check(), Err(PAST.into()), "offset plus size overflows");
    }

    #[test]
    fn a_read_error_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let mut directory = File::open(dir.path()).unwrap();
        let error = check_shared_object(&mut directory).unwrap_err();
        assert!(error.to_lowercase().contains("directory"), "{error}");
    }
}
