//! The small public values hosts and providers build on: how a version, an
//! error kind and an output stream are written (load errors, logs and
//! output show them), which hooks a library built for a version can have,
//! and what an error carries.

use provider_abi::{
    AbiVersion, ErrorKind, Hook, MemoryEntry, OutputStream, ProviderError, ABI_2_0, ABI_2_1, MEMORY_LIMIT,
};

#[test]
fn a_version_is_written_major_dot_minor() {
    assert_eq!(ABI_2_0.to_string(), "2.0");
    assert_eq!(AbiVersion::new(2, 13).to_string(), "2.13");
}

#[test]
fn every_hook_has_one_name_and_is_found_by_it() {
    for hook in Hook::ALL {
        assert_eq!(Hook::from_name(hook.name()), Some(hook), "{hook}");
        let appended_in_2_1 = matches!(hook, Hook::ExportMemory | Hook::ImportMemory);
        assert_eq!(hook.since(), if appended_in_2_1 { ABI_2_1 } else { ABI_2_0 }, "{hook}");
    }
    assert_eq!(Hook::from_name("execute_bytes"), None, "a 1.x name is no hook of 2.0");
    let optional: Vec<Hook> = Hook::ALL.into_iter().filter(|hook| hook.is_optional()).collect();
    assert_eq!(optional, Hook::OPTIONAL);
}

#[test]
fn an_error_kind_is_written_by_its_name_or_its_code() {
    assert_eq!(ErrorKind::CLEANUP_UNCONFIRMED.to_string(), "cleanup_unconfirmed");
    assert_eq!(format!("{:?}", ErrorKind::TIMEOUT), "timeout");
    assert_eq!(ErrorKind(999).to_string(), "unknown(999)");
}

#[test]
fn an_api_error_carries_its_status_and_operation() {
    let error = ProviderError::api(503, "sandbox lifecycle", "CreateOS answered 503.");
    assert_eq!(error.kind, ErrorKind::API);
    assert_eq!(error.status(), Some(503));
    assert_eq!(error.operation(), Some("sandbox lifecycle"));
    assert_eq!(error.message, "CreateOS answered 503.");
    assert_eq!(error.to_string(), "CreateOS answered 503.");
    assert_eq!(
        format!("{error:?}"),
        r#"ProviderError { kind: api, http_status: 503, operation: "sandbox lifecycle", message: "CreateOS answered 503." }"#
    );
}

#[test]
fn an_error_without_a_status_or_operation_has_none() {
    let error = ProviderError::internal("a broken invariant");
    assert_eq!((error.status(), error.operation()), (None, None));
    assert_eq!(format!("{error:?}"), r#"ProviderError { kind: internal, message: "a broken invariant" }"#);
    let error = error.with_http(Some(409), Some("process creation"));
    assert_eq!((error.status(), error.operation()), (Some(409), Some("process creation")));
}

#[test]
fn an_output_stream_is_written_by_its_name() {
    assert_eq!((OutputStream::Stdout.name(), OutputStream::Stderr.name()), ("stdout", "stderr"));
}

#[test]
fn a_memory_entry_counts_its_key_and_value_against_the_64_kib_limit() {
    assert_eq!(MEMORY_LIMIT, 65_536);
    assert_eq!(MemoryEntry::new("https://api.example", vec![0u8; 100]).size(), 19 + 100);
    assert_eq!(MemoryEntry::new("k", Vec::new()).size(), 1);
    assert_eq!(MemoryEntry::default().size(), 0);
}
