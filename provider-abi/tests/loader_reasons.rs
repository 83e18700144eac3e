//! What a host is told when the dynamic loader itself refuses a file that
//! the loader's own header check let through: the dynamic loader's reason,
//! once, without the path it repeats.
#![cfg(all(target_os = "linux", target_env = "gnu", target_arch = "x86_64"))]

use provider_abi::{LoadError, LoadedProvider};

/// The ELF header of an x86-64 shared object whose program header entries
/// are declared 1 byte long (an ELF64 one is 56), with none of them: its
/// tables lie inside the file, so the header check passes it, and glibc's
/// dynamic loader refuses it.
fn header_with_a_wrong_entry_size() -> Vec<u8> {
    let mut header = vec![0u8; 64];
    header[..7].copy_from_slice(b"\x7fELF\x02\x01\x01");
    header[16..18].copy_from_slice(&3u16.to_le_bytes()); // ET_DYN
    header[18..20].copy_from_slice(&62u16.to_le_bytes()); // EM_X86_64
    header[20..24].copy_from_slice(&1u32.to_le_bytes()); // EV_CURRENT
    header[52..54].copy_from_slice(&64u16.to_le_bytes()); // e_ehsize
    header[54..56].copy_from_slice(&1u16.to_le_bytes()); // e_phentsize
    header
}

#[test]
fn the_dynamic_loaders_reason_is_shown_once_without_the_path_it_repeats() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("odd.so");
    std::fs::write(&path, header_with_a_wrong_entry_size()).unwrap();
    let error = LoadedProvider::load(&path).err().expect("the dynamic loader refuses the file");
    let text = error.to_string();
    let LoadError::NotALibrary { path: shown, reason } = &error else { panic!("{text}") };
    assert_eq!(reason, "ELF file's phentsize not the expected size", "{text}");
    assert_eq!(text.matches(&shown.display().to_string()).count(), 1, "{text}");
    assert!(!text.contains('\n'), "{text}");
}
