//! What a provider learnt that a later process may use (ABI 2.1): keyed
//! opaque entries the host keeps in its lease store between processes and
//! hands back after `setup`.

use abi_stable::{
    std_types::{RString, RVec},
    StableAbi,
};

/// The most a host keeps of one provider's memory, keys and values
/// together: a provider exports less, and a host hands back no more.
pub const MEMORY_LIMIT: usize = 64 * 1024;

/// One entry of a provider's memory: a key the provider chooses (for
/// example an API origin) and bytes only the provider reads.
///
/// A host stores entries as they are and may hand back an entry of an older
/// provider version, a damaged one or none at all: a provider checks what
/// it imports and ignores what it cannot use. Never a secret: the host
/// stores entries in the clear.
#[repr(C)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(StableAbi, Clone, Debug, Default, PartialEq, Eq)]
pub struct MemoryEntry {
    /// What the entry is about, unique within one provider's memory.
    pub key: RString,
    /// The provider's own encoding of what it learnt.
    pub value: RVec<u8>,
}

impl MemoryEntry {
    /// An entry of `key` holding `value`.
    pub fn new(key: impl Into<RString>, value: impl Into<RVec<u8>>) -> Self {
        MemoryEntry { key: key.into(), value: value.into() }
    }

    /// The bytes the entry takes against [`MEMORY_LIMIT`]: its key and value.
    pub fn size(&self) -> usize {
        self.key.len() + self.value.len()
    }
}
