//! Which hooks a loaded library offers a host: every hook, the ABI 1.0 ones
//! included, exactly when both the library and the host have its version,
//! as `supports` and the manifest both say.

use e2e::library;
use provider_abi::{
    AbiVersion, Hook, LoadedProvider, Provider, ABI_1_0, ABI_1_1, ABI_1_2, ABI_1_3, ABI_1_4, ABI_1_5,
    ABI_1_6, ABI_1_7,
};

#[test]
fn a_hook_is_offered_exactly_when_library_and_host_both_have_its_version() {
    // Every host version a hook was added in (1.0 and each minor since).
    let mut hosts: Vec<AbiVersion> = Hook::ALL.iter().map(|hook| hook.since()).collect();
    hosts.dedup();
    let libraries = [
        ("fixture_v1_0", ABI_1_0),
        ("fixture_v1_1", ABI_1_1),
        ("fixture_v1_2", ABI_1_2),
        ("fixture_v1_3", ABI_1_3),
        ("fixture_v1_4", ABI_1_4),
        ("fixture_v1_5", ABI_1_5),
        ("fixture_v1_6", ABI_1_6),
        ("fixture_v1_7", ABI_1_7),
    ];
    for (name, library_abi) in libraries {
        for &host in &hosts {
            let provider = LoadedProvider::load_as(library(name), host)
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
