//! `sim`: serve the CreateOS simulator.

use super::{Failure, Printer};

/// Serves the simulator on `listen` until SIGINT or SIGTERM, after printing
/// its URL and development API key; `rate_limit` keeps CreateOS's 300
/// requests a minute.
pub fn serve(listen: std::net::SocketAddr, rate_limit: bool, out: Printer) -> Result<(), Failure> {
    let config = createos_sim::SimConfig {
        listen,
        rate_limit: rate_limit.then(createos_sim::RateLimit::createos_default),
        ..Default::default()
    };
    let sim = createos_sim::Simulator::start(config)
        .map_err(|error| Failure::Usage(format!("cannot start the simulator: {error}")))?;
    out.value(&serde_json::json!({"url": sim.url(), "apiKey": sim.api_key()}), || {
        format!(
            "CreateOS simulator listening at {}\ndevelopment API key: {}\n(Ctrl-C to stop)",
            sim.url(),
            sim.api_key()
        )
    });
    sim.serve_until_ctrl_c().map_err(|error| Failure::Usage(format!("simulator failed: {error}")))
}
