//! The embedded CreateOS simulator: the offline default of `lifecycle` and `soak`.

use crate::request::HarnessConfig;
use createos_sim::{SimConfig, Simulator};

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
