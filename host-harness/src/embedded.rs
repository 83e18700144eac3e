//! The embedded CreateOS simulator: the offline default of `lifecycle` and `soak`.

use crate::request::HarnessConfig;
use createos_sim::{SimConfig, Simulator};
use provider_abi::Provider;

/// The driver key of the one provider the embedded simulator serves.
pub const SERVES_DRIVER_KEY: &str = "createos";

/// Starts a simulator on an ephemeral loopback port and returns it with a
/// harness configuration pointing at it (lease reuse on, so release pauses).
pub fn start() -> std::io::Result<(Simulator, HarnessConfig)> {
    start_with(SimConfig::default())
}

/// Like [`start`], with a simulator configuration of the caller's.
pub fn start_with(sim_config: SimConfig) -> std::io::Result<(Simulator, HarnessConfig)> {
    let sim = Simulator::start(sim_config)?;
    let config = HarnessConfig::for_config(sim.provider_config(true));
    Ok((sim, config))
}

/// What a command without `--config` runs `provider` against: the embedded
/// simulator (started with `sim_config`) for the provider it serves; for
/// any other provider, that provider's own defaults (an empty configuration)
/// when it finds them valid, else a one-line error saying `--config` is
/// needed.
pub fn offline_target<P: Provider + ?Sized>(
    provider: &P,
    sim_config: SimConfig,
) -> Result<(Option<Simulator>, HarnessConfig), String> {
    let manifest = provider.manifest();
    if manifest.driver_key.as_str() == SERVES_DRIVER_KEY {
        let (sim, config) = start_with(sim_config)
            .map_err(|error| format!("cannot start the embedded simulator: {error}"))?;
        return Ok((Some(sim), config));
    }
    let config = HarnessConfig::for_config(serde_json::json!({}));
    let report = provider.validate_config(&config.environment(&manifest.driver_key)).map_err(|error| {
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
