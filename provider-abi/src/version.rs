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

/// Declares [`Hook`] and what each hook is, from one row per hook in table
/// order: its field of the hook table (and manifest name), whether a library
/// may leave it out of its table, and the ABI version that appended it.
macro_rules! hooks {
    (@optional required) => { false };
    (@optional optional) => { true };
    // A required hook's accessor answers its function, an optional one's an
    // `Option`, and one appended after 2.0 an `Option` of that `Option`
    // (`None` from a library built before it).
    (@address required $since:ident $accessor:expr) => { Some($accessor as _) };
    (@address optional ABI_2_0 $accessor:expr) => { $accessor.map(|f| f as _) };
    (@address optional $since:ident $accessor:expr) => { $accessor.flatten().map(|f| f as _) };
    ($($(#[doc = $doc:literal])* $hook:ident = $field:ident, $kind:ident, since $since:ident;)*) => {
        /// Every hook of the ABI, in table order.
        #[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Hook {
            $($(#[doc = $doc])* $hook,)*
        }

        impl Hook {
            /// All hooks, in table order.
            pub const ALL: [Hook; [$(Hook::$hook),*].len()] = [$(Hook::$hook),*];

            /// The hook's name as it appears in manifests and messages.
            pub const fn name(self) -> &'static str {
                match self {
                    $(Hook::$hook => stringify!($field),)*
                }
            }

            /// What the hook's function is called where a host checks it
            /// (`execute hook`).
            pub(crate) const fn function(self) -> &'static str {
                match self {
                    $(Hook::$hook => concat!(stringify!($field), " hook"),)*
                }
            }

            /// The ABI version whose table first has the hook.
            pub const fn since(self) -> AbiVersion {
                match self {
                    $(Hook::$hook => $since,)*
                }
            }

            /// True for the hooks a library may leave out of its table (the
            /// provider exports them with `export_provider!(P, optional = [...])`).
            pub const fn is_optional(self) -> bool {
                match self {
                    $(Hook::$hook => hooks!(@optional $kind),)*
                }
            }
        }

        impl crate::module::HookTableRef {
            /// The address of `hook`'s function; `None` when the table lacks it.
            pub(crate) fn address(self, hook: Hook) -> Option<*const std::ffi::c_void> {
                match hook {
                    $(Hook::$hook => hooks!(@address $kind $since self.$field()),)*
                }
            }
        }
    };
}

hooks! {
    /// `manifest`: identity, version and configuration schema.
    Manifest = manifest, required, since ABI_2_0;
    /// `setup`: called once after loading, with the host's log sink.
    Setup = setup, required, since ABI_2_0;
    /// `shutdown`: cancels work in flight.
    Shutdown = shutdown, required, since ABI_2_0;
    /// `health`: a cheap liveness check that sends no request.
    Health = health, required, since ABI_2_0;
    /// `validate_config`: checks a configuration.
    ValidateConfig = validate_config, required, since ABI_2_0;
    /// `probe` (optional): acquires, runs a command, destroys.
    Probe = probe, optional, since ABI_2_0;
    /// `acquire_lease`: creates a lease, recording it ahead.
    AcquireLease = acquire_lease, required, since ABI_2_0;
    /// `resume_lease`: makes a released lease usable again.
    ResumeLease = resume_lease, required, since ABI_2_0;
    /// `release_lease`: gives a lease back, saying whether it was kept.
    ReleaseLease = release_lease, required, since ABI_2_0;
    /// `destroy_lease`: deletes a lease.
    DestroyLease = destroy_lease, required, since ABI_2_0;
    /// `realize_workspace`: where work runs in a lease.
    RealizeWorkspace = realize_workspace, required, since ABI_2_0;
    /// `execute`: runs a command in a lease, streaming its output as bytes.
    Execute = execute, required, since ABI_2_0;
    /// `inspect_lease` (optional): a lease's remote state.
    InspectLease = inspect_lease, optional, since ABI_2_0;
    /// `sync_files` (optional): copies files into or out of a lease.
    SyncFiles = sync_files, optional, since ABI_2_0;
    /// `import_unconfirmed` (optional): learns that a lease's cleanup is
    /// unconfirmed (known to the host from another provider version).
    ImportUnconfirmed = import_unconfirmed, optional, since ABI_2_0;
    /// `grant_request_share` (optional): the share of its request budget the
    /// provider may spend, in parts per million.
    GrantRequestShare = grant_request_share, optional, since ABI_2_0;
    /// `export_memory` (optional, since 2.1): what the provider learnt that
    /// a later process may use, as keyed opaque entries.
    ExportMemory = export_memory, optional, since ABI_2_1;
    /// `import_memory` (optional, since 2.1): hands back what an earlier
    /// process exported.
    ImportMemory = import_memory, optional, since ABI_2_1;
}

impl Hook {
    /// The optional hooks, in table order.
    pub const OPTIONAL: [Hook; 7] = {
        let mut optional = [Hook::Manifest; 7];
        let (mut from, mut to) = (0, 0);
        while from < Hook::ALL.len() {
            if Hook::ALL[from].is_optional() {
                optional[to] = Hook::ALL[from];
                to += 1;
            }
            from += 1;
        }
        assert!(to == optional.len(), "OPTIONAL's length is the number of optional hooks");
        optional
    };

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
