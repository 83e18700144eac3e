//! What loading a library gives a host: the hooks it offers (every hook,
//! the ABI 1.0 ones included, exactly when both the library and the host
//! have its version, as `supports` and the manifest both say), and an
//! instance that goes when the loaded provider is dropped.

use crate::support::Bed;
use e2e::library;
use provider_abi::{AbiVersion, Hook, LoadedProvider, Provider};
use serde_json::json;
use std::time::{Duration, Instant};

#[test]
fn a_hook_is_offered_exactly_when_library_and_host_both_have_its_version() {
    // Every version a hook was added in (1.0 and each minor since), as a
    // host and as a library: the fixture library `fixture_vMAJOR_MINOR`.
    let mut versions: Vec<AbiVersion> = Hook::ALL.iter().map(|hook| hook.since()).collect();
    versions.dedup();
    let libraries = versions.iter().map(|v| (format!("fixture_v{}_{}", v.major, v.minor), *v));
    for (name, library_abi) in libraries {
        for &host in &versions {
            let provider = LoadedProvider::load_as(library(&name), host)
                .unwrap_or_else(|error| panic!("{name} should load as ABI {host}: {error}"));
            let offered: Vec<Hook> = Hook::ALL
                .into_iter()
                .filter(|hook| hook.since() <= library_abi && hook.since() <= host)
                .collect();
            for hook in Hook::ALL {
                assert_eq!(provider.supports(hook), offered.contains(&hook), "{name} as {host}: {hook}");
            }
            let mut listed: Vec<String> =
                provider.manifest().hooks.iter().map(|hook| hook.to_string()).collect();
            let mut expected: Vec<String> = offered.iter().map(|hook| hook.name().to_string()).collect();
            listed.sort();
            expected.sort();
            assert_eq!(listed, expected, "{name} as {host}");
        }
    }
}

/// Dropping a loaded provider drops its instance: the CreateOS provider's
/// runtime and connection pool go with it, so its connections to the API
/// close (an instance kept alive would hold them open until they idle out).
#[test]
fn dropping_a_loaded_provider_drops_its_instance_and_closes_its_connections() {
    let bed = Bed::new();
    bed.acquire(&bed.config(json!({})));
    assert!(bed.sim.open_connections() > 0, "the pool keeps its connection to the API open");
    let Bed { sim, provider } = bed;
    drop(provider);
    let deadline = Instant::now() + Duration::from_secs(20);
    while sim.open_connections() > 0 {
        assert!(Instant::now() < deadline, "the dropped provider's connections are still open");
        std::thread::sleep(Duration::from_millis(5));
    }
}
