//! What the harness knows of CreateOS, the provider it is built with: that
//! provider's library, found beside the binary when no other is named, and
//! the embedded CreateOS simulator, the offline default of `lifecycle`,
//! `soak` and `conform`, linked only with the `embedded-sim` feature (on by
//! default). A build without it has a [`Simulator`] and a [`FaultRule`]
//! with no values, and a command that would start a simulator fails with
//! [`ABSENT`]. The rest of the harness names no provider.

use crate::{config_file::harness_environment, soak::SimFigures};
#[cfg(feature = "embedded-sim")]
pub use createos_sim::{FaultRule, Simulator};
use provider_abi::Provider;
use provider_host::environment::Environment;

#[cfg(not(feature = "embedded-sim"))]
pub use absent::{FaultRule, Simulator};

/// The crate of the provider the harness is built with: `cargo build -p
/// host-harness` builds its library beside the binary.
pub const BUNDLED_PROVIDER_CRATE: &str = "createos-provider";

/// The file name of the bundled provider's library on this platform.
pub fn bundled_library_name() -> String {
    provider_host::loader::library_file_name(&BUNDLED_PROVIDER_CRATE.replace('-', "_"))
}

/// What a command says when it runs against the simulator.
pub fn banner(sim: &Simulator) -> String {
    format!("embedded CreateOS simulator at {}", sim.url())
}

/// The driver key of the one provider the embedded simulator serves.
pub const SERVES_DRIVER_KEY: &str = "createos";

/// What a command that needs the simulator says in a build without it.
pub const ABSENT: &str =
    "this build of host-harness has no embedded simulator (its `embedded-sim` feature is off): pass --config FILE";

/// The request budget the simulator's provider gets when the simulator's
/// rate limit is off: high enough never to be what a run waits on.
pub const UNLIMITED_REQUEST_BUDGET: u32 = 100_000;

/// Removes the files of the simulator's sandboxes (for a process exiting
/// at once).
pub fn remove_temp_dirs() {
    #[cfg(feature = "embedded-sim")]
    createos_sim::remove_temp_dirs();
}

/// What a command without `--config` runs `provider` against, and the
/// simulator it runs against, if any: the embedded simulator for the
/// provider it serves, on an ephemeral loopback port (with CreateOS's rate
/// limit when `rate_limited`; its harness configuration reuses leases, so
/// release pauses, has the API in this process, so its leases are gone with
/// it, and sets CreateOS's `requestsPerMinute` to `budget` when given); for
/// any other provider, that provider's own defaults (an empty
/// configuration: its own budget) when it finds them valid, else a one-line
/// error saying `--config` is needed.
pub fn offline_target<P: Provider + ?Sized>(
    provider: &P,
    rate_limited: bool,
    budget: Option<u32>,
) -> Result<(Option<Simulator>, Environment), String> {
    let manifest = provider.manifest();
    if manifest.driver_key.as_str() == SERVES_DRIVER_KEY {
        #[cfg(not(feature = "embedded-sim"))]
        {
            let _ = (rate_limited, budget);
            return Err(ABSENT.to_owned());
        }
        #[cfg(feature = "embedded-sim")]
        {
            let rate_limit = rate_limited.then(createos_sim::RateLimit::createos_default);
            let sim = Simulator::start(createos_sim::SimConfig { rate_limit, ..Default::default() })
                .map_err(|error| format!("cannot start the embedded simulator: {error}"))?;
            let mut provider_config = sim.provider_config(true);
            if let Some(budget) = budget {
                provider_config["requestsPerMinute"] = budget.into();
            }
            let mut config = harness_environment(provider_config);
            config.api_in_process = true;
            return Ok((Some(sim), config));
        }
    }
    let config = harness_environment(serde_json::json!({}));
    let report = provider.validate_config(&config.params(&manifest.driver_key)).map_err(|error| {
        format!("provider `{}` needs --config FILE: its validate failed: {}", manifest.id, error.message)
    })?;
    if report.ok {
        return Ok((None, config));
    }
    let errors: Vec<&str> = report.errors.iter().map(|error| error.as_str()).collect();
    Err(format!(
        "provider `{}` needs --config FILE: the embedded simulator serves CreateOS only, and an empty configuration is not valid for it ({})",
        manifest.id,
        errors.join(" ")
    ))
}

/// Parses `--faults`: `none`, `flaky`, `hostile` or a JSON rules file.
#[cfg(feature = "embedded-sim")]
pub fn fault_profile(name: &str, seed: u64) -> Result<Vec<FaultRule>, String> {
    use createos_sim::FaultProfile;
    match name {
        "none" => Ok(FaultProfile::none()),
        "flaky" => Ok(FaultProfile::flaky(seed)),
        "hostile" => Ok(FaultProfile::hostile(seed)),
        path => {
            let text = crate::config_file::read_text(std::path::Path::new(path))
                .map_err(|error| format!("--faults: {error}"))?;
            createos_sim::parse_rules(&text).map_err(|error| format!("--faults {path}: {error}"))
        }
    }
}

/// Parses `--faults` in a build without the simulator: `none` only.
#[cfg(not(feature = "embedded-sim"))]
pub fn fault_profile(name: &str, _seed: u64) -> Result<Vec<FaultRule>, String> {
    match name {
        "none" => Ok(Vec::new()),
        _ => Err(format!("--faults {name}: {}", ABSENT)),
    }
}

/// What the simulator saw: its requests, its 429s, and its live sandboxes
/// classified (for a soak's summary, after its final sweep).
#[cfg(feature = "embedded-sim")]
pub fn figures(sim: &Simulator) -> SimFigures {
    let seen = sim.ledger();
    let ids = |sandboxes: Vec<&createos_sim::SandboxRecord>| -> Vec<String> {
        sandboxes.into_iter().map(|sandbox| sandbox.id.clone()).collect()
    };
    let leaked = ids(seen.leaked_nameable());
    let leaked_unnameable = ids(seen.leaked()).into_iter().filter(|id| !leaked.contains(id)).collect();
    SimFigures {
        requests: seen.requests.len(),
        rate_limited: seen.count_status(429),
        leaked,
        leaked_unnameable,
    }
}

/// Never called: no simulator exists in this build.
#[cfg(not(feature = "embedded-sim"))]
pub fn figures(sim: &Simulator) -> SimFigures {
    match *sim {}
}

/// The simulator's types in a build without it: no value of either exists,
/// so the code holding an `Option<Simulator>` holds `None`.
#[cfg(not(feature = "embedded-sim"))]
mod absent {
    /// No simulator in this build.
    pub enum Simulator {}

    /// No fault to inject without a simulator.
    pub enum FaultRule {}

    impl Simulator {
        /// Never called: no value exists.
        pub fn url(&self) -> String {
            match *self {}
        }

        /// Never called: no value exists.
        pub fn add_faults(&self, _rules: Vec<FaultRule>) {
            match *self {}
        }

        /// Never called: no value exists.
        pub fn clear_faults(&self) {
            match *self {}
        }
    }

    /// Holders drop their simulator to stop it, as they would the real one.
    impl Drop for Simulator {
        fn drop(&mut self) {
            match *self {}
        }
    }
}
