//! `forward_provider!`: implements [`provider_abi::Provider`] on a wrapper by
//! handing every hook to the provider it wraps, so a wrapper is written once
//! and a hook appended to the trait is forwarded here, once.

/// Implements `Provider` for `$wrapper`, handing every hook to the provider
/// its method `$route` lends a closure: `self.$route(|provider|
/// provider.health())`.
///
/// `@hooks $sync, $async` writes the hooks but `manifest`, `shutdown` and
/// `grant_request_share`, for a wrapper that writes those itself: the plain
/// calls through `$sync`, those returning a future through `$async`.
macro_rules! forward_provider {
    ($wrapper:ty, $route:ident) => {
        impl provider_abi::Provider for $wrapper {
            fn manifest(&self) -> provider_abi::Manifest {
                self.$route(|provider| provider.manifest())
            }

            fn shutdown(&self) -> provider_abi::HookResult<()> {
                self.$route(|provider| provider.shutdown())
            }

            fn grant_request_share(&self, parts_per_million: u32) -> provider_abi::HookResult<()> {
                self.$route(|provider| provider.grant_request_share(parts_per_million))
            }

            $crate::forward::forward_provider!(@hooks $route, $route);
        }
    };
    (@hooks $sync:ident, $async:ident) => {
        fn setup(
            &self,
            params: &provider_abi::SetupParams,
            logs: provider_abi::LogSink,
            max_level: provider_abi::LogLevel,
        ) -> provider_abi::HookResult<()> {
            self.$sync(|provider| provider.setup(params, logs, max_level))
        }

        // Inlined across the crate boundary, as `Instance::health` is: a
        // polled `health` costs one call into the library.
        #[inline]
        fn health(&self) -> provider_abi::HookResult<provider_abi::HealthReport> {
            self.$sync(|provider| provider.health())
        }

        fn validate_config(
            &self,
            params: &provider_abi::EnvironmentParams,
        ) -> provider_abi::HookResult<provider_abi::ValidationReport> {
            self.$sync(|provider| provider.validate_config(params))
        }

        fn probe(
            &self,
            params: provider_abi::EnvironmentParams,
            recorder: provider_abi::CreationRecorder,
        ) -> provider_abi::HookFuture<provider_abi::ProbeReport> {
            self.$async(|provider| provider.probe(params, recorder))
        }

        fn acquire_lease(
            &self,
            params: provider_abi::AcquireParams,
            recorder: provider_abi::CreationRecorder,
        ) -> provider_abi::HookFuture<provider_abi::Lease> {
            self.$async(|provider| provider.acquire_lease(params, recorder))
        }

        fn resume_lease(&self, params: provider_abi::LeaseParams) -> provider_abi::HookFuture<provider_abi::Lease> {
            self.$async(|provider| provider.resume_lease(params))
        }

        fn release_lease(
            &self,
            params: provider_abi::LeaseParams,
        ) -> provider_abi::HookFuture<provider_abi::ReleaseReport> {
            self.$async(|provider| provider.release_lease(params))
        }

        fn destroy_lease(&self, params: provider_abi::LeaseParams) -> provider_abi::HookFuture<()> {
            self.$async(|provider| provider.destroy_lease(params))
        }

        fn realize_workspace(
            &self,
            params: &provider_abi::LeaseParams,
        ) -> provider_abi::HookResult<provider_abi::Workspace> {
            self.$sync(|provider| provider.realize_workspace(params))
        }

        fn execute(
            &self,
            params: provider_abi::ExecuteParams,
            stdin: provider_abi::ByteSource,
            output: provider_abi::ByteSink,
        ) -> provider_abi::HookFuture<provider_abi::ExecuteResult> {
            self.$async(|provider| provider.execute(params, stdin, output))
        }

        fn inspect_lease(
            &self,
            params: provider_abi::LeaseParams,
        ) -> provider_abi::HookFuture<provider_abi::LeaseStatus> {
            self.$async(|provider| provider.inspect_lease(params))
        }

        fn sync_files(&self, params: provider_abi::SyncParams) -> provider_abi::HookFuture<provider_abi::SyncResult> {
            self.$async(|provider| provider.sync_files(params))
        }

        fn import_unconfirmed(&self, params: &provider_abi::LeaseParams) -> provider_abi::HookResult<()> {
            self.$sync(|provider| provider.import_unconfirmed(params))
        }

        fn export_memory(&self) -> provider_abi::HookResult<Vec<provider_abi::MemoryEntry>> {
            self.$sync(|provider| provider.export_memory())
        }

        fn import_memory(&self, entries: &[provider_abi::MemoryEntry]) -> provider_abi::HookResult<()> {
            self.$sync(|provider| provider.import_memory(entries))
        }
    };
}

pub(crate) use forward_provider;
