//! Configuration messages keep the reference's words, which users search
//! for; any detail (which rule failed) follows the reference sentence. Every
//! problem is reported at once, and an unknown key's warning names it, even
//! when the configuration has errors too. Through the built binary.

use std::{
    io::Write,
    process::{Command, Output, Stdio},
};

fn validate(config: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_host-harness"))
        .env_remove("CREATEOS_API_KEY")
        .args(["validate", "--config", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run host-harness");
    child.stdin.take().unwrap().write_all(config.as_bytes()).unwrap();
    child.wait_with_output().unwrap()
}

/// The `error:` and `warning:` lines `validate` printed.
fn problems(output: &Output) -> Vec<String> {
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter(|line| line.starts_with("error: ") || line.starts_with("warning: "))
        .map(str::to_owned)
        .collect()
}

const URL_RULE: &str =
    "CreateOS API URL must be an HTTPS origin (optionally ending in /v1); HTTP is allowed on loopback only.";

#[test]
fn configuration_messages_use_the_reference_words() {
    let base = r#""shape": "s-1vcpu-1gb", "apiKey": "k-123""#;
    let cases: Vec<(String, String)> = vec![
        (format!(r#"{{{base}, "apiUrl": "http://example.com"}}"#), URL_RULE.into()),
        (format!(r#"{{{base}, "apiUrl": "https://user@example.com"}}"#), URL_RULE.into()),
        (format!(r#"{{{base}, "apiUrl": "https://example.com/v2"}}"#), URL_RULE.into()),
        (format!(r#"{{{base}, "apiUrl": "ftp://example.com"}}"#), URL_RULE.into()),
        (format!(r#"{{{base}, "apiUrl": ""}}"#), "CreateOS requires an API URL.".into()),
        (format!(r#"{{{base}, "apiUrl": "not a url"}}"#), "CreateOS API URL is invalid.".into()),
        (r#"{"apiKey": "k-123"}"#.into(), "CreateOS requires a shape from its shape catalog.".into()),
        (
            r#"{"apiKey": "k-123", "shape": "huge"}"#.into(),
            "CreateOS requires a shape from its shape catalog.".into(),
        ),
        (
            format!(r#"{{{base}, "timeoutMs": 0}}"#),
            "timeoutMs must be an integer between 1 and 86400000.".into(),
        ),
        (format!(r#"{{{base}, "reuseLease": "yes"}}"#), "reuseLease must be a boolean.".into()),
        (format!(r#"{{{base}, "region": ""}}"#), "region must be a non-empty string.".into()),
        (format!(r#"{{{base}, "rootfs": 7}}"#), "rootfs must be a non-empty string.".into()),
        (
            r#"{"shape": "s-1vcpu-1gb"}"#.into(),
            "CreateOS requires an API key in the environment config or CREATEOS_API_KEY.".into(),
        ),
    ];
    for (config, reference) in cases {
        let output = validate(&config);
        assert_eq!(output.status.code(), Some(1), "{config}");
        let lines = problems(&output);
        assert!(
            lines
                .iter()
                .any(|line| line.strip_prefix("error: ").is_some_and(|error| error.starts_with(&reference))),
            "{config}: {lines:?} lacks {reference}"
        );
    }
}

#[test]
fn every_problem_is_reported_at_once_and_unknown_keys_are_named() {
    let output =
        validate(r#"{"apiUrl": "http://example.com", "timeoutMs": 0, "reuseLease": 1, "colour": "red"}"#);
    assert_eq!(
        problems(&output),
        [
            "error: CreateOS requires an API key in the environment config or CREATEOS_API_KEY.",
            "error: CreateOS API URL must be an HTTPS origin (optionally ending in /v1); HTTP is allowed on loopback only. (it uses http on a host that is not loopback; use https)",
            "error: CreateOS requires a shape from its shape catalog.",
            "error: timeoutMs must be an integer between 1 and 86400000.",
            "error: reuseLease must be a boolean.",
            "warning: unknown config key colour is ignored.",
        ]
    );
}

#[test]
fn a_misspelt_key_gets_a_suggestion_in_one_format_at_both_layers() {
    let output = validate(
        r#"{"companyID": "acme", "config": {"shape": "s-1vcpu-1gb", "apiKey": "k-123", "reuselease": true}}"#,
    );
    assert_eq!(output.status.code(), Some(0));
    assert_eq!(
        problems(&output),
        [
            "warning: unknown key companyID in the configuration file is ignored; did you mean companyId?",
            "warning: unknown config key reuselease is ignored; did you mean reuseLease?",
        ]
    );
}

#[test]
fn lifecycle_names_an_unknown_key_once_before_its_steps() {
    let sim =
        createos_sim::Simulator::start(createos_sim::SimConfig { rate_limit: None, ..Default::default() })
            .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut provider = sim.provider_config(true);
    provider["reuselease"] = serde_json::json!(true);
    let config = dir.path().join("config.json");
    std::fs::write(&config, serde_json::json!({"config": provider}).to_string()).unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_host-harness"))
        .env_remove("RUST_LOG")
        .arg("--ledger")
        .arg(dir.path().join("ledger.sqlite3"))
        .args(["lifecycle", "--config", config.to_str().unwrap()])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert_eq!(
        stderr.matches("unknown config key reuselease is ignored; did you mean reuseLease?").count(),
        1,
        "{stderr}"
    );
}

#[test]
fn an_unknown_key_named_after_a_possible_api_key_is_never_shown() {
    // The environment's key is a secret whether or not the configuration's
    // own apiKey (not a string, or another key) is the one used, and so is a
    // key put in an array by mistake.
    let secret = "sk_live_Zq8Xv4Lm2Pn7Rt5Wy1";
    let other = "sk_live_Other9Key";
    for (api_key, hidden) in
        [("5".to_string(), 1), (r#""k-123""#.to_string(), 1), (format!(r#"["{other}"]"#), 2)]
    {
        let config =
            format!(r#"{{"shape": "s-1vcpu-1gb", "apiKey": {api_key}, "{secret}": 1, "x-{other}": 2}}"#);
        let mut child = Command::new(env!("CARGO_BIN_EXE_host-harness"))
            .env("CREATEOS_API_KEY", secret)
            .args(["validate", "--config", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run host-harness");
        child.stdin.take().unwrap().write_all(config.as_bytes()).unwrap();
        let output = child.wait_with_output().unwrap();
        let printed =
            format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
        assert!(!printed.contains(secret), "apiKey {api_key}: {printed}");
        assert_eq!(
            printed.matches("an unknown config key is ignored (its name is not shown").count(),
            hidden,
            "apiKey {api_key}: {printed}"
        );
        if hidden == 2 {
            assert!(!printed.contains(other), "apiKey {api_key}: {printed}");
        }
    }
}
