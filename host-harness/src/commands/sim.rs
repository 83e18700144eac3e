//! `sim`: serve the CreateOS simulator.

use super::{Failure, Printer};

/// Serves the simulator on `listen` until SIGINT or SIGTERM, after printing
/// its URL, development API key and a configuration file that runs against
/// it (for `--config`), then prints the requests it answered
/// and the sandboxes still live. Its rate limit: none with
/// `no_rate_limit`, a token bucket of `token_bucket` (BURST) requests at
/// CreateOS's 300 a minute, else CreateOS's own.
pub fn serve(
    listen: std::net::SocketAddr,
    no_rate_limit: bool,
    token_bucket: Option<u32>,
    out: Printer,
) -> Result<(), Failure> {
    use createos_sim::RateLimit;
    let bucket = |burst| RateLimit::token_bucket(300, std::time::Duration::from_secs(60), burst);
    let rate_limit = (!no_rate_limit).then(|| token_bucket.map_or_else(RateLimit::createos_default, bucket));
    let config = createos_sim::SimConfig { listen, rate_limit, ..Default::default() };
    // Watch before the URL is printed: a signal right after it must still
    // stop the simulator through its `Drop` (processes, then files).
    let mut signals = signal_hook::iterator::Signals::new([libc::SIGINT, libc::SIGTERM])
        .map_err(|error| Failure::Usage(format!("cannot watch for signals: {error}")))?;
    let sim = createos_sim::Simulator::start(config)
        .map_err(|error| Failure::Usage(format!("cannot start the simulator on {listen}: {error}")))?;
    let config = serde_json::json!({"driverKey": "createos", "config": sim.provider_config(true)});
    out.value(&serde_json::json!({"url": sim.url(), "apiKey": sim.api_key(), "configuration": config}), || {
        format!(
            "CreateOS simulator listening at {}\ndevelopment API key: {}\na configuration for --config (save it as sim.json):\n{config}\n(Ctrl-C to stop)",
            sim.url(),
            sim.api_key()
        )
    });
    signals.forever().next();
    // What a run against it left behind, for the run's own checks.
    let live = sim.live_sandboxes().len();
    let requests = sim.ledger().requests.len();
    out.value(&serde_json::json!({"stopped": true, "liveSandboxes": live, "requests": requests}), || {
        format!("stopped after {requests} requests; {live} sandboxes were still live")
    });
    drop(sim);
    Ok(())
}
