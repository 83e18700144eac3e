//! What loading a library gives a host: the hooks it offers (exactly its
//! table's, as `supports` and the manifest both say), and an instance that
//! goes when the loaded provider is dropped.

use crate::support::Bed;
use e2e::library;
use provider_abi::{Hook, Provider};
use provider_host::loader::LoadedProvider;
use serde_json::json;
use std::time::{Duration, Instant};

/// CreateOS exports every hook: `supports` says so for each, and the
/// manifest lists each by name, in table order.
#[test]
fn a_library_offers_exactly_the_hooks_of_its_table() {
    let provider = LoadedProvider::load(library("createos_provider")).unwrap();
    for hook in Hook::ALL {
        assert!(provider.supports(hook), "{hook}");
    }
    let listed: Vec<String> = provider.manifest().hooks.iter().map(|hook| hook.to_string()).collect();
    let expected: Vec<&str> = Hook::ALL.iter().map(|hook| hook.name()).collect();
    assert_eq!(listed, expected);
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
