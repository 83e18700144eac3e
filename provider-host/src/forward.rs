//! `forward_provider!`: implements [`provider_abi::Provider`] on a wrapper by
//! handing every hook to the provider it wraps, so a wrapper is written once
//! and a hook appended to the trait is forwarded here, once.

/// Implements `Provider` for `$wrapper`, forwarding every hook to the
/// `&dyn Provider` (or `&impl Provider`) that `$inner` evaluates to with
/// `$this` bound to `&self`.
macro_rules! forward_provider {
    ($wrapper:ty, |$this:ident| $inner:expr) => {
        impl provider_abi::Provider for $wrapper {
            fn manifest(&self) -> provider_abi::Manifest {
                let $this = self;
                $inner.manifest()
            }

            fn setup(
                &self,
                params: &provider_abi::SetupParams,
                logs: provider_abi::LogSink,
                max_level: provider_abi::LogLevel,
            ) -> provider_abi::HookResult<()> {
                let $this = self;
                $inner.setup(params, logs, max_level)
            }

            fn shutdown(&self) -> provider_abi::HookResult<()> {
                let $this = self;
                $inner.shutdown()
            }

            fn health(&self) -> provider_abi::HookResult<provider_abi::HealthReport> {
                let $this = self;
                $inner.health()
            }

            fn validate_config(
                &self,
                params: &provider_abi::EnvironmentParams,
            ) -> provider_abi::HookResult<provider_abi::ValidationReport> {
                let $this = self;
                $inner.validate_config(params)
            }

            fn probe(
                &self,
                params: provider_abi::EnvironmentParams,
                recorder: provider_abi::CreationRecorder,
            ) -> provider_abi::HookFuture<provider_abi::ProbeReport> {
                let $this = self;
                $inner.probe(params, recorder)
            }

            fn acquire_lease(
                &self,
                params: provider_abi::AcquireParams,
                recorder: provider_abi::CreationRecorder,
            ) -> provider_abi::HookFuture<provider_abi::Lease> {
                let $this = self;
                $inner.acquire_lease(params, recorder)
            }

            fn resume_lease(
                &self,
                params: provider_abi::LeaseParams,
            ) -> provider_abi::HookFuture<provider_abi::Lease> {
                let $this = self;
                $inner.resume_lease(params)
            }

            fn release_lease(
                &self,
                params: provider_abi::LeaseParams,
            ) -> provider_abi::HookFuture<provider_abi::ReleaseReport> {
                let $this = self;
                $inner.release_lease(params)
            }

            fn destroy_lease(&self, params: provider_abi::LeaseParams) -> provider_abi::HookFuture<()> {
                let $this = self;
                $inner.destroy_lease(params)
            }

            fn realize_workspace(
                &self,
                params: &provider_abi::LeaseParams,
            ) -> provider_abi::HookResult<provider_abi::Workspace> {
                let $this = self;
                $inner.realize_workspace(params)
            }

            fn execute(
                &self,
                params: provider_abi::ExecuteParams,
                stdin: provider_abi::ByteSource,
                output: provider_abi::ByteSink,
            ) -> provider_abi::HookFuture<provider_abi::ExecuteResult> {
                let $this = self;
                $inner.execute(params, stdin, output)
            }

            fn inspect_lease(
                &self,
                params: provider_abi::LeaseParams,
            ) -> provider_abi::HookFuture<provider_abi::LeaseStatus> {
                let $this = self;
                $inner.inspect_lease(params)
            }

            fn sync_files(
                &self,
                params: provider_abi::SyncParams,
            ) -> provider_abi::HookFuture<provider_abi::SyncResult> {
                let $this = self;
                $inner.sync_files(params)
            }

            fn import_unconfirmed(&self, params: &provider_abi::LeaseParams) -> provider_abi::HookResult<()> {
                let $this = self;
                $inner.import_unconfirmed(params)
            }

            fn grant_request_share(&self, parts_per_million: u32) -> provider_abi::HookResult<()> {
                let $this = self;
                $inner.grant_request_share(parts_per_million)
            }

            fn export_memory(&self) -> provider_abi::HookResult<Vec<provider_abi::MemoryEntry>> {
                let $this = self;
                $inner.export_memory()
            }

            fn import_memory(&self, entries: &[provider_abi::MemoryEntry]) -> provider_abi::HookResult<()> {
                let $this = self;
                $inner.import_memory(entries)
            }
        }
    };
}

pub(crate) use forward_provider;
