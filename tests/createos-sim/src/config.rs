//! Simulator configuration.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

/// Per-client-IP rate limit of `requests` per `window`, counted by
/// `algorithm`. Requests over the limit answer 429 with
/// `Retry-After: <seconds until one would be accepted, rounded up, ≥ 1>`
/// and are not counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimit {
    /// Requests accepted per window.
    pub requests: u32,
    /// Length of the window.
    pub window: Duration,
    /// How requests are counted.
    pub algorithm: Algorithm,
}

/// How a [`RateLimit`] counts requests.
///
/// The API document says "300 requests per minute per caller IP" and no
/// more. The default is the sliding window: it is the strictest reading of
/// "per minute" (any 60 s, not only those starting on a clock minute), so a
/// client that never sees a 429 from it never sees one from a fixed-window
/// limiter either. The token bucket is the other common implementation, and
/// the one a client pacing by the window gets wrong at first: it is here to
/// test the provider's fallback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    /// At most `requests` accepted in any rolling `window` (exact sliding log).
    SlidingWindow,
    /// A bucket of `burst` tokens, full at the start, refilled at
    /// `requests / window`; each accepted request takes one.
    TokenBucket {
        /// The bucket's size: requests accepted back to back.
        burst: u32,
    },
}

impl RateLimit {
    /// The published CreateOS limit: 300 requests per minute per caller IP,
    /// as a sliding window.
    pub fn createos_default() -> RateLimit {
        RateLimit::sliding_window(300, Duration::from_secs(60))
    }

    /// At most `requests` in any rolling `window`.
    pub fn sliding_window(requests: u32, window: Duration) -> RateLimit {
        RateLimit { requests, window, algorithm: Algorithm::SlidingWindow }
    }

    /// `requests` per `window` through a token bucket of `burst`.
    pub fn token_bucket(requests: u32, window: Duration, burst: u32) -> RateLimit {
        RateLimit { requests, window, algorithm: Algorithm::TokenBucket { burst } }
    }

    /// CreateOS's 300 requests per minute as a token bucket with a burst of
    /// [`SMALL_BURST`].
    pub fn createos_token_bucket() -> RateLimit {
        RateLimit::token_bucket(300, Duration::from_secs(60), SMALL_BURST)
    }
}

/// The burst of [`RateLimit::createos_token_bucket`]: one second of the
/// rate at 300 per minute.
pub const SMALL_BURST: u32 = 5;

/// Configuration for [`crate::Simulator::start`].
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// The only accepted `X-Api-Key` value. Default: `sim-dev-key-<random>`.
    pub api_key: String,
    /// Listen address; only loopback addresses are accepted. Default `127.0.0.1:0`.
    pub listen: SocketAddr,
    /// Rate limit per client IP; `None` disables it. Default 300 per 60 s,
    /// sliding window.
    pub rate_limit: Option<RateLimit>,
    /// Duration of `creating` before `running`. Default 50 ms.
    pub create_delay: Duration,
    /// Duration of `pausing` before `paused`. Default 50 ms.
    pub pause_delay: Duration,
    /// Duration of `resuming` before `running`. Default 50 ms.
    pub resume_delay: Duration,
    /// Size of each managed process's output journal (data bytes). Default 1 MiB.
    pub journal_bytes: usize,
    /// Output waits for its reader instead of being evicted: a command's
    /// output that would evict a frame no reader has taken yet is held
    /// back, so the command blocks on its full pipe as it would behind a
    /// slow reader of a pipe. CreateOS evicts (default off); on, a test that
    /// streams more than [`Self::journal_bytes`] gets all of it however
    /// slowly its reader runs. Output nobody reads then holds its command
    /// (and its admission room) until the simulator stops.
    pub pace_output: bool,
    /// Directory holding sandbox roots (`<state_dir>/<id>/`, each a sandbox's `/`).
    /// Default: a fresh temporary directory removed when the simulator drops.
    /// A given directory is kept, but every sandbox directory in it is removed
    /// on delete and on drop.
    pub state_dir: Option<PathBuf>,
    /// Runs each command in a PID namespace of its own, with its own
    /// `/proc`, so a sandbox sees only its own processes, as a real one
    /// does. Default off: it costs each command two more forks of the
    /// simulator's process, which in a large test process (one embedding
    /// the simulator beside many other tests) is enough to push commands
    /// past short deadlines (see docs/benchmarks.md, "The simulator"); off, a
    /// sandbox sees the host's process table (read-only).
    pub pid_namespaces: bool,
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
            pace_output: false,
            state_dir: None,
            pid_namespaces: false,
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
