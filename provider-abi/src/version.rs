//! ABI versioning: which hooks exist at which minor version.

use abi_stable::StableAbi;
use std::fmt;

/// A provider ABI version. Providers and hosts of the same `major` load each
/// other in both directions; `minor` says which hooks exist.
#[repr(C)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(StableAbi, Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AbiVersion {
    /// Incompatible changes bump this; a host refuses every other major.
    pub major: u16,
    /// Each added hook bumps this.
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

/// ABI 1.0: the eleven lifecycle hooks.
pub const ABI_1_0: AbiVersion = AbiVersion::new(1, 0);
/// ABI 1.1: adds `inspect_lease`.
pub const ABI_1_1: AbiVersion = AbiVersion::new(1, 1);
/// ABI 1.2: adds `acquire_lease_recording` and `probe_recording` (write-ahead
/// records of created leases) and `release_lease_reporting` (kept or deleted).
pub const ABI_1_2: AbiVersion = AbiVersion::new(1, 2);
/// ABI 1.3: adds `execute_bytes` (output as raw bytes) and `setup_with_logs`
/// (the provider's log events forwarded to the host).
pub const ABI_1_3: AbiVersion = AbiVersion::new(1, 3);
/// ABI 1.4: adds `sync_in` and `sync_out` (file sync).
pub const ABI_1_4: AbiVersion = AbiVersion::new(1, 4);
/// ABI 1.5: adds `import_unconfirmed` (a lease whose cleanup is unconfirmed,
/// handed by the host to a newly active provider version).
pub const ABI_1_5: AbiVersion = AbiVersion::new(1, 5);
/// ABI 1.6: adds `grant_request_share` (the share of its own request budget
/// a provider may spend, when several hosts share one account and caller).
pub const ABI_1_6: AbiVersion = AbiVersion::new(1, 6);
/// ABI 1.7: adds the async hooks (`health_async`, `probe_async`,
/// `acquire_lease_async`, `resume_lease_async`, `release_lease_async`,
/// `destroy_lease_async`, `execute_async`), which return an FFI-safe future.
pub const ABI_1_7: AbiVersion = AbiVersion::new(1, 7);
/// ABI 1.8: adds async file sync (`sync_in_async`, `sync_out_async`) and the
/// async write-ahead creation hooks (`acquire_lease_recording_async`,
/// `probe_recording_async`), whose recorder answers with a future.
pub const ABI_1_8: AbiVersion = AbiVersion::new(1, 8);
/// ABI 1.9: adds `execute_stdin_async`, `execute_async` whose standard
/// input the provider pulls from a byte source (any size, bounded memory).
pub const ABI_1_9: AbiVersion = AbiVersion::new(1, 9);
/// The ABI this crate defines; also its crate version (`major.minor.x`).
pub const ABI_VERSION: AbiVersion = ABI_1_9;

/// Every hook of the ABI, with the minor version that introduced it.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Hook {
    /// `setup`: called once after loading.
    Setup,
    /// `shutdown`: cancels work in flight.
    Shutdown,
    /// `health`: a cheap liveness check.
    Health,
    /// `validate_config`: checks a configuration.
    ValidateConfig,
    /// `probe`: acquires, runs a command, destroys.
    Probe,
    /// `acquire_lease`: creates a lease.
    AcquireLease,
    /// `resume_lease`: makes a released lease usable again.
    ResumeLease,
    /// `release_lease`: gives a lease back.
    ReleaseLease,
    /// `destroy_lease`: deletes a lease.
    DestroyLease,
    /// `realize_workspace`: where work runs in a lease.
    RealizeWorkspace,
    /// `execute`: runs a command in a lease.
    Execute,
    /// `inspect_lease` (ABI 1.1): a lease's remote state.
    InspectLease,
    /// `acquire_lease_recording` (ABI 1.2): acquire, recording the lease ahead.
    AcquireLeaseRecording,
    /// `probe_recording` (ABI 1.2): probe, recording its lease ahead.
    ProbeRecording,
    /// `release_lease_reporting` (ABI 1.2): release, saying if the lease was kept.
    ReleaseLeaseReporting,
    /// `execute_bytes` (ABI 1.3): execute, streaming output as raw bytes.
    ExecuteBytes,
    /// `setup_with_logs` (ABI 1.3): setup, with a sink for the provider's logs.
    SetupWithLogs,
    /// `sync_in` (ABI 1.4): copies host files into a lease.
    SyncIn,
    /// `sync_out` (ABI 1.4): copies lease files to the host.
    SyncOut,
    /// `import_unconfirmed` (ABI 1.5): learns that a lease's cleanup is
    /// unconfirmed (known to the host from another provider version).
    ImportUnconfirmed,
    /// `grant_request_share` (ABI 1.6): the share of its request budget the
    /// provider may spend, in parts per million.
    GrantRequestShare,
    /// `health_async` (ABI 1.7): `health`, as a future.
    HealthAsync,
    /// `probe_async` (ABI 1.7): `probe`, as a future.
    ProbeAsync,
    /// `acquire_lease_async` (ABI 1.7): `acquire_lease`, as a future.
    AcquireLeaseAsync,
    /// `resume_lease_async` (ABI 1.7): `resume_lease`, as a future.
    ResumeLeaseAsync,
    /// `release_lease_async` (ABI 1.7): `release_lease_reporting`, as a future.
    ReleaseLeaseAsync,
    /// `destroy_lease_async` (ABI 1.7): `destroy_lease`, as a future.
    DestroyLeaseAsync,
    /// `execute_async` (ABI 1.7): `execute_bytes`, as a future streaming to
    /// an owned sink.
    ExecuteAsync,
    /// `acquire_lease_recording_async` (ABI 1.8): `acquire_lease_recording`,
    /// as a future whose recorder answers with a future.
    AcquireLeaseRecordingAsync,
    /// `probe_recording_async` (ABI 1.8): `probe_recording`, as a future
    /// whose recorder answers with a future.
    ProbeRecordingAsync,
    /// `sync_in_async` (ABI 1.8): `sync_in`, as a future.
    SyncInAsync,
    /// `sync_out_async` (ABI 1.8): `sync_out`, as a future.
    SyncOutAsync,
    /// `execute_stdin_async` (ABI 1.9): `execute_async`, its standard input
    /// pulled from a byte source.
    ExecuteStdinAsync,
}

impl Hook {
    /// All hooks, in table order.
    pub const ALL: [Hook; 33] = [
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
        Hook::AcquireLeaseRecording,
        Hook::ProbeRecording,
        Hook::ReleaseLeaseReporting,
        Hook::ExecuteBytes,
        Hook::SetupWithLogs,
        Hook::SyncIn,
        Hook::SyncOut,
        Hook::ImportUnconfirmed,
        Hook::GrantRequestShare,
        Hook::HealthAsync,
        Hook::ProbeAsync,
        Hook::AcquireLeaseAsync,
        Hook::ResumeLeaseAsync,
        Hook::ReleaseLeaseAsync,
        Hook::DestroyLeaseAsync,
        Hook::ExecuteAsync,
        Hook::AcquireLeaseRecordingAsync,
        Hook::ProbeRecordingAsync,
        Hook::SyncInAsync,
        Hook::SyncOutAsync,
        Hook::ExecuteStdinAsync,
    ];

    /// The hook's name as it appears in manifests and messages.
    pub const fn name(self) -> &'static str {
        match self {
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
            Hook::AcquireLeaseRecording => "acquire_lease_recording",
            Hook::ProbeRecording => "probe_recording",
            Hook::ReleaseLeaseReporting => "release_lease_reporting",
            Hook::ExecuteBytes => "execute_bytes",
            Hook::SetupWithLogs => "setup_with_logs",
            Hook::SyncIn => "sync_in",
            Hook::SyncOut => "sync_out",
            Hook::ImportUnconfirmed => "import_unconfirmed",
            Hook::GrantRequestShare => "grant_request_share",
            Hook::HealthAsync => "health_async",
            Hook::ProbeAsync => "probe_async",
            Hook::AcquireLeaseAsync => "acquire_lease_async",
            Hook::ResumeLeaseAsync => "resume_lease_async",
            Hook::ReleaseLeaseAsync => "release_lease_async",
            Hook::DestroyLeaseAsync => "destroy_lease_async",
            Hook::ExecuteAsync => "execute_async",
            Hook::AcquireLeaseRecordingAsync => "acquire_lease_recording_async",
            Hook::ProbeRecordingAsync => "probe_recording_async",
            Hook::SyncInAsync => "sync_in_async",
            Hook::SyncOutAsync => "sync_out_async",
            Hook::ExecuteStdinAsync => "execute_stdin_async",
        }
    }

    /// The ABI version that introduced the hook.
    pub const fn since(self) -> AbiVersion {
        match self {
            Hook::InspectLease => ABI_1_1,
            Hook::AcquireLeaseRecording | Hook::ProbeRecording | Hook::ReleaseLeaseReporting => ABI_1_2,
            Hook::ExecuteBytes | Hook::SetupWithLogs => ABI_1_3,
            Hook::SyncIn | Hook::SyncOut => ABI_1_4,
            Hook::ImportUnconfirmed => ABI_1_5,
            Hook::GrantRequestShare => ABI_1_6,
            Hook::HealthAsync
            | Hook::ProbeAsync
            | Hook::AcquireLeaseAsync
            | Hook::ResumeLeaseAsync
            | Hook::ReleaseLeaseAsync
            | Hook::DestroyLeaseAsync
            | Hook::ExecuteAsync => ABI_1_7,
            Hook::AcquireLeaseRecordingAsync
            | Hook::ProbeRecordingAsync
            | Hook::SyncInAsync
            | Hook::SyncOutAsync => ABI_1_8,
            Hook::ExecuteStdinAsync => ABI_1_9,
            _ => ABI_1_0,
        }
    }

    /// True for the async hooks (ABI 1.7 to 1.9), which return a future.
    pub const fn is_async(self) -> bool {
        matches!(self.since(), ABI_1_7 | ABI_1_8 | ABI_1_9)
    }

    /// Looks a hook up by its manifest name.
    pub fn from_name(name: &str) -> Option<Hook> {
        Hook::ALL.into_iter().find(|hook| hook.name() == name)
    }

    /// The hooks a provider built against `abi` can have.
    pub fn available_at(abi: AbiVersion) -> impl Iterator<Item = Hook> {
        Hook::ALL.into_iter().filter(move |hook| hook.since().major == abi.major && hook.since() <= abi)
    }
}

impl fmt::Display for Hook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
