//! Simulator configuration.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

/// Per-client-IP rate limit: at most `requests` accepted requests in any
/// rolling `window` (exact sliding log). Requests over the limit answer 429
/// with `Retry-After: <seconds, rounded up>` and are not counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimit {
    /// Maximum number of requests accepted in any rolling window.
    pub requests: u32,
    /// Length of the rolling window.
    pub window: Duration,
}

impl RateLimit {
    /// The published CreateOS limit: 300 requests per minute per caller IP.
    pub fn createos_default() -> RateLimit {
        RateLimit { requests: 300, window: Duration::from_secs(60) }
    }
}

/// Configuration for [`crate::Simulator::start`].
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// The only accepted `X-Api-Key` value. Default: `sim-dev-key-<random>`.
    pub api_key: String,
    /// Listen address; only loopback addresses are accepted. Default `127.0.0.1:0`.
    pub listen: SocketAddr,
    /// Rate limit per client IP; `None` disables it. Default 300 per 60 s.
    pub rate_limit: Option<RateLimit>,
    /// Duration of `creating` before `running`. Default 50 ms.
    pub create_delay: Duration,
    /// Duration of `pausing` before `paused`. Default 50 ms.
    pub pause_delay: Duration,
    /// Duration of `resuming` before `running`. Default 50 ms.
    pub resume_delay: Duration,
    /// Size of each managed process's output journal (data bytes). Default 1 MiB.
    pub journal_bytes: usize,
    /// Directory holding sandbox roots (`<state_dir>/<id>/{workspace,tmp}`).
    /// Default: a fresh temporary directory removed when the simulator drops.
    /// A given directory is kept, but every sandbox directory in it is removed
    /// on delete and on drop.
    pub state_dir: Option<PathBuf>,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            api_key: format!("sim-dev-key-{}", uuid::Uuid::new_v4().simple()),
            listen: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
            rate_limit: Some(RateLimit::createos_default()),
            create_delay: Duration::from_millis(50),
            pause_delay: Duration::from_millis(50),
            resume_delay: Duration::from_millis(50),
            journal_bytes: 1024 * 1024,
            state_dir: None,
        }
    }
}

/// The shape catalog published by CreateOS; any other shape answers 400.
pub const SHAPES: &[&str] = &[
    "s-1vcpu-256mb",
    "s-0.25vcpu-512mb",
    "s-0.5vcpu-1gb",
    "s-1vcpu-1gb",
    "s-1vcpu-2gb",
    "s-2vcpu-2gb",
    "s-2vcpu-4gb",
    "s-4vcpu-4gb",
    "s-4vcpu-8gb",
    "s-8vcpu-8gb",
    "s-8vcpu-16gb",
];
