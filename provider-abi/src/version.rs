//! ABI versioning: the version a library was built for, and the hooks.

use abi_stable::StableAbi;
use std::fmt;

/// A provider ABI version. Providers and hosts of the same `major` load each
/// other in both directions; `minor` says which appended hooks exist.
#[repr(C)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(StableAbi, Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AbiVersion {
    /// Incompatible changes bump this; a host refuses every other major.
    pub major: u16,
    /// Each release that appends hooks to the table bumps this.
    pub minor: u16,
}

impl AbiVersion {
    /// Builds a version.
    pub const fn new(major: u16, minor: u16) -> Self {
        Self { major, minor }
    }
}

impl fmt::Display for AbiVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// ABI 2.0: one hook per operation.
pub const ABI_2_0: AbiVersion = AbiVersion::new(2, 0);
/// ABI 2.1: appends `export_memory` and `import_memory`.
pub const ABI_2_1: AbiVersion = AbiVersion::new(2, 1);
/// The ABI this crate defines; also its crate version (`major.minor.x`).
pub const ABI_VERSION: AbiVersion = ABI_2_1;

/// Every hook of the ABI, in table order.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Hook {
    /// `manifest`: identity, version and configuration schema.
    Manifest,
    /// `setup`: called once after loading, with the host's log sink.
    Setup,
    /// `shutdown`: cancels work in flight.
    Shutdown,
    /// `health`: a cheap liveness check that sends no request.
    Health,
    /// `validate_config`: checks a configuration.
    ValidateConfig,
    /// `probe` (optional): acquires, runs a command, destroys.
    Probe,
    /// `acquire_lease`: creates a lease, recording it ahead.
    AcquireLease,
    /// `resume_lease`: makes a released lease usable again.
    ResumeLease,
    /// `release_lease`: gives a lease back, saying whether it was kept.
    ReleaseLease,
    /// `destroy_lease`: deletes a lease.
    DestroyLease,
    /// `realize_workspace`: where work runs in a lease.
    RealizeWorkspace,
    /// `execute`: runs a command in a lease, streaming its output as bytes.
    Execute,
    /// `inspect_lease` (optional): a lease's remote state.
    InspectLease,
    /// `sync_files` (optional): copies files into or out of a lease.
    SyncFiles,
    /// `import_unconfirmed` (optional): learns that a lease's cleanup is
    /// unconfirmed (known to the host from another provider version).
    ImportUnconfirmed,
    /// `grant_request_share` (optional): the share of its request budget the
    /// provider may spend, in parts per million.
    GrantRequestShare,
    /// `export_memory` (optional, since 2.1): what the provider learnt that
    /// a later process may use, as keyed opaque entries.
    ExportMemory,
    /// `import_memory` (optional, since 2.1): hands back what an earlier
    /// process exported.
    ImportMemory,
}

impl Hook {
    /// All hooks, in table order.
    pub const ALL: [Hook; 18] = [
        Hook::Manifest,
        Hook::Setup,
        Hook::Shutdown,
        Hook::Health,
        Hook::ValidateConfig,
        Hook::Probe,
        Hook::AcquireLease,
        Hook::ResumeLease,
        Hook::ReleaseLease,
        Hook::DestroyLease,
        Hook::RealizeWorkspace,
        Hook::Execute,
        Hook::InspectLease,
        Hook::SyncFiles,
        Hook::ImportUnconfirmed,
        Hook::GrantRequestShare,
        Hook::ExportMemory,
        Hook::ImportMemory,
    ];

    /// The optional hooks: a library's table has them only when the provider
    /// exported them (`export_provider!(P, optional = [...])`).
    pub const OPTIONAL: [Hook; 7] = [
        Hook::Probe,
        Hook::InspectLease,
        Hook::SyncFiles,
        Hook::ImportUnconfirmed,
        Hook::GrantRequestShare,
        Hook::ExportMemory,
        Hook::ImportMemory,
    ];

    /// The hook's name as it appears in manifests and messages.
    pub const fn name(self) -> &'static str {
        match self {
            Hook::Manifest => "manifest",
            Hook::Setup => "setup",
            Hook::Shutdown => "shutdown",
            Hook::Health => "health",
            Hook::ValidateConfig => "validate_config",
            Hook::Probe => "probe",
            Hook::AcquireLease => "acquire_lease",
            Hook::ResumeLease => "resume_lease",
            Hook::ReleaseLease => "release_lease",
            Hook::DestroyLease => "destroy_lease",
            Hook::RealizeWorkspace => "realize_workspace",
            Hook::Execute => "execute",
            Hook::InspectLease => "inspect_lease",
            Hook::SyncFiles => "sync_files",
            Hook::ImportUnconfirmed => "import_unconfirmed",
            Hook::GrantRequestShare => "grant_request_share",
            Hook::ExportMemory => "export_memory",
            Hook::ImportMemory => "import_memory",
        }
    }

    /// The ABI version whose table first has the hook.
    pub const fn since(self) -> AbiVersion {
        match self {
            Hook::ExportMemory | Hook::ImportMemory => ABI_2_1,
            _ => ABI_2_0,
        }
    }

    /// True for the hooks a library may leave out of its table.
    pub fn is_optional(self) -> bool {
        Hook::OPTIONAL.contains(&self)
    }

    /// Looks a hook up by its manifest name.
    pub fn from_name(name: &str) -> Option<Hook> {
        Hook::ALL.into_iter().find(|hook| hook.name() == name)
    }
}

impl fmt::Display for Hook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
