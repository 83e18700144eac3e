//! The `host-harness` binary as users run it: exit codes, JSON output and
//! the offline lifecycle against the embedded simulator.

use serde_json::Value;
use std::{
    io::Write,
    process::{Command, Output, Stdio},
};

/// Runs the harness with a ledger of its own (never the user's).
fn harness(args: &[&str], stdin: &str) -> Output {
    let state = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_host-harness"))
        .env("XDG_STATE_HOME", state.path())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run host-harness");
    child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
    child.wait_with_output().unwrap()
}

fn json_lines(output: &Output) -> Vec<Value> {
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|_| panic!("not JSON: {line}")))
        .collect()
}

#[test]
fn inspect_prints_the_manifest() {
    let output = harness(&["inspect", "--json"], "");
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    let manifest = &json_lines(&output)[0];
    assert_eq!(manifest["id"], "createos");
    assert_eq!(manifest["abiVersion"], provider_abi::ABI_VERSION.to_string());
    assert!(manifest["configSchema"]["properties"]["shape"].is_object());
}

#[test]
fn validate_exit_codes_follow_the_outcome() {
    let good = harness(&["validate", "--config", "-"], r#"{"shape":"s-1vcpu-1gb","apiKey":"secret-key"}"#);
    assert_eq!(good.status.code(), Some(0));
    assert!(!String::from_utf8_lossy(&good.stdout).contains("secret-key"), "the key is never printed");
    let bad = harness(&["validate", "--config", "-", "--json"], r#"{"shape":"tiny"}"#);
    assert_eq!(bad.status.code(), Some(1));
    assert_eq!(json_lines(&bad)[0]["ok"], false);
    let unreadable = harness(&["validate", "--config", "-"], "not json");
    assert_eq!(unreadable.status.code(), Some(2));
}

#[test]
fn a_file_that_is_not_a_provider_is_a_load_error() {
    let output = harness(&["--plugin", "/etc/hostname", "health"], "");
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("/etc/hostname"));
}

#[test]
fn lifecycle_runs_offline_against_the_embedded_simulator() {
    let output = harness(&["lifecycle", "--json"], "");
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stdout));
    let steps = json_lines(&output);
    let names: Vec<&str> = steps.iter().map(|step| step["step"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "validate",
            "probe",
            "acquire",
            "realize",
            "sync-in",
            "execute",
            "sync-out",
            "release",
            "resume",
            "execute-again",
            "destroy"
        ]
    );
    assert!(steps.iter().all(|step| step["ok"] == true), "{steps:?}");
}

#[test]
fn a_hostile_soak_of_200_leases_holds_every_invariant() {
    let output = harness(
        &[
            "soak",
            "--leases",
            "200",
            "--concurrency",
            "25",
            "--faults",
            "hostile",
            "--seed",
            "11",
            "--no-rate-limit",
            "--json",
        ],
        "",
    );
    let lines = json_lines(&output);
    let summary = lines.last().expect("a summary");
    assert_eq!(output.status.code(), Some(0), "{summary}");
    assert_eq!(summary["invariantsHeld"], true, "{summary}");
    assert_eq!(summary["leaked"], 0);
    assert_eq!(summary["unconfirmedReused"], 0);
    assert_eq!(summary["secretsSeen"], 0);
    assert_eq!(summary["panics"], 0);
    let failed: u64 = summary["failed"].as_object().unwrap().values().map(|n| n.as_u64().unwrap()).sum();
    assert_eq!(summary["succeeded"].as_u64().unwrap() + failed, 200);
    assert!(summary["apiRequests"].as_u64().unwrap() > 1000, "{summary}");
    assert!(summary["latency"]["acquire"]["p99Ms"].as_f64().unwrap() > 0.0);
    assert_eq!(lines.len(), 201, "one progress line per lifecycle, then the summary");
}

#[test]
fn a_soak_where_no_lifecycle_succeeds_exits_non_zero() {
    // `requestsPerMinute` 0 is an invalid configuration: every lifecycle fails.
    let output =
        harness(&["soak", "--leases", "3", "--concurrency", "3", "--requests-per-minute", "0", "--json"], "");
    let summary = json_lines(&output).pop().expect("a summary");
    assert_eq!(summary["succeeded"], 0, "{summary}");
    assert_eq!(output.status.code(), Some(1), "{summary}");
    assert!(
        summary["broken"].as_array().unwrap().iter().any(|line| line == "no lifecycle succeeded"),
        "{summary}"
    );
}

#[test]
fn a_soak_scans_the_providers_log_lines_for_secrets() {
    let output =
        harness(&["-vv", "soak", "--leases", "2", "--concurrency", "2", "--no-rate-limit", "--json"], "");
    let summary = json_lines(&output).pop().expect("a summary");
    assert_eq!(output.status.code(), Some(0), "{summary}");
    assert!(
        summary["logLinesScanned"].as_u64().unwrap() > 0,
        "the provider's logs reached the scan: {summary}"
    );
    assert_eq!(summary["secretsSeen"], 0, "{summary}");
}

/// The subcommands `--help` lists for the command `path` names (the
/// harness itself when `path` is empty).
fn subcommands_of(path: &[&str]) -> Vec<String> {
    let help = harness(&[path, &["--help"]].concat(), "");
    let text = String::from_utf8(help.stdout).unwrap();
    let Some(listed) = text.split("Commands:\n").nth(1) else { return Vec::new() };
    listed
        .lines()
        .take_while(|line| line.starts_with("  "))
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_owned)
        .collect()
}

/// The top-level subcommands `--help` lists.
fn subcommands() -> Vec<String> {
    subcommands_of(&[])
}

/// Every command the help reaches, as the words that name it.
fn every_command() -> Vec<Vec<String>> {
    let mut commands = Vec::new();
    for name in subcommands() {
        let nested = subcommands_of(&[name.as_str()]);
        commands.extend(nested.into_iter().map(|sub| vec![name.clone(), sub]));
        commands.push(vec![name]);
    }
    commands
}

#[test]
fn every_commands_help_has_an_example_and_only_the_global_options_it_uses() {
    let commands = every_command();
    assert!(commands.len() >= 24, "{commands:?}");
    for words in commands {
        let name = words.join(" ");
        let args: Vec<&str> = words.iter().map(String::as_str).chain(["--help"]).collect();
        let help = harness(&args, "");
        let text = String::from_utf8_lossy(&help.stdout);
        let examples =
            text.split("Examples:\n").nth(1).unwrap_or_else(|| panic!("{name} --help has no example"));
        assert!(examples.lines().next().unwrap_or("").contains("host-harness"), "{name}: {examples}");
        // The command's own options come first, the global ones after.
        let own = text.find("Options:\n").unwrap_or_else(|| panic!("{name}: {text}"));
        let output = text.find("Output options:\n").unwrap_or_else(|| panic!("{name}: {text}"));
        assert!(own < output, "{name}");
        let uses_hooks = !["sim", "completions", "man", "providers", "lock"].contains(&words[0].as_str());
        assert_eq!(text.contains("--isolate"), uses_hooks, "{name}: {text}");
        assert_eq!(text.contains("--ledger"), uses_hooks, "{name}: {text}");
    }
}

/// What bash offers for the last of `words` (a `host-harness` command line),
/// through the completion script the harness prints, sourced in a real bash.
fn bash_completes(words: &[&str]) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("host-harness.bash");
    std::fs::write(&script, harness(&["completions", "bash"], "").stdout).unwrap();
    let complete = r#"
        source "$1"; shift
        function=$(complete -p host-harness | sed -E 's/.* -F ([^ ]+) .*/\1/')
        COMP_WORDS=("$@"); COMP_CWORD=$(( $# - 1 ))
        "$function" host-harness "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]}"
        printf '%s\n' "${COMPREPLY[@]}"
    "#;
    let output =
        Command::new("bash").arg("-c").arg(complete).arg("bash").arg(&script).args(words).output().unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .filter(|line| !line.is_empty())
        .map(str::to_owned)
        .collect()
}

#[test]
fn bash_completes_subcommands_and_their_options() {
    assert_eq!(bash_completes(&["host-harness", "soak", "--lea"]), ["--leases"]);
    assert_eq!(bash_completes(&["host-harness", "lock", "a"]), ["add"]);
    assert_eq!(bash_completes(&["host-harness", "providers", "ins"]), ["install"]);
    assert_eq!(bash_completes(&["host-harness", "exec", "--std"]), ["--stdin"]);
    assert!(bash_completes(&["host-harness", "li"]).contains(&"lifecycle".to_owned()));
    // The --isolate worker is the harness talking to itself, never offered.
    assert_eq!(bash_completes(&["host-harness", "__"]), Vec::<String>::new());
    for shell in ["zsh", "fish"] {
        let output = harness(&["completions", shell], "");
        assert_eq!(output.status.code(), Some(0), "{shell}");
        let script = String::from_utf8(output.stdout).unwrap();
        assert!(script.contains("leases") && !script.contains("__worker"), "{shell}");
    }
}

/// `man` run on the pages in `directory` (a `man1` folder's parent).
fn man(directory: &std::path::Path, page: &str) -> String {
    let output = Command::new("man")
        .env("MANPATH", directory)
        .env("MANWIDTH", "200")
        .args(["-P", "cat", page])
        .output()
        .unwrap();
    assert!(output.status.success(), "man {page}: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout).unwrap()
}

#[test]
fn man_opens_a_page_for_the_harness_and_every_subcommand() {
    let root = tempfile::tempdir().unwrap();
    let pages = root.path().join("man1");
    let written = harness(&["man", "--out", pages.to_str().unwrap()], "");
    assert_eq!(written.status.code(), Some(0), "{}", String::from_utf8_lossy(&written.stderr));
    let top = man(root.path(), "host-harness");
    for name in subcommands() {
        assert!(top.contains(&format!("host-harness-{name}(1)")), "the top page names {name}'s page");
        let page = man(root.path(), &format!("host-harness-{name}"));
        assert!(page.contains(&format!("host-harness {name}")), "{page}");
    }
    assert!(man(root.path(), "host-harness-soak").contains("--leases"));
    assert!(man(root.path(), "host-harness-lock-add").contains("<PATH>"));
    assert!(!pages.join("host-harness-__worker.1").exists());

    // One page printed, as `man -l` reads it.
    let printed = harness(&["man", "lock", "add"], "");
    assert!(String::from_utf8_lossy(&printed.stdout).contains(".TH host-harness-lock-add 1"));
    let unknown = harness(&["man", "lock", "ad"], "");
    assert_eq!(unknown.status.code(), Some(2));
    assert_eq!(String::from_utf8_lossy(&unknown.stderr).lines().count(), 1, "{unknown:?}");
}

#[test]
fn lifecycle_gives_an_invalid_configuration_one_verdict() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("keyless.json");
    std::fs::write(&config, r#"{"apiUrl": "http://127.0.0.1:1", "shape": "s-1vcpu-1gb"}"#).unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_host-harness"))
        .env("XDG_STATE_HOME", dir.path())
        .env_remove("CREATEOS_API_KEY")
        .args(["lifecycle", "--config", config.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let verdicts: Vec<&str> = stdout.lines().filter(|line| line.starts_with("validate")).collect();
    assert_eq!(verdicts.len(), 1, "{stdout}");
    assert!(verdicts[0].contains("FAILED") && verdicts[0].contains("API key"), "{stdout}");
}

#[test]
fn a_configuration_for_another_provider_is_refused_naming_both() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("other.json");
    std::fs::write(
        &config,
        r#"{"driverKey": "my-local", "config": {"apiKey": "k-1", "shape": "s-1vcpu-1gb"}}"#,
    )
    .unwrap();
    let config = config.to_str().unwrap();
    for command in [
        vec!["validate", "--config", config],
        vec!["lifecycle", "--config", config],
        vec!["soak", "--leases", "1", "--config", config],
        vec!["acquire", "--config", config],
        vec!["conform", "--config", config],
    ] {
        let output = harness(&command, "");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{command:?}: {stderr}");
        let errors: Vec<&str> =
            stderr.lines().filter(|line| !line.starts_with("created ledger directory")).collect();
        assert_eq!(errors.len(), 1, "{command:?}: {stderr}");
        assert!(stderr.contains("`my-local`") && stderr.contains("`createos`"), "{command:?}: {stderr}");
        assert!(output.stdout.is_empty(), "{command:?}: nothing ran");
    }
}

#[test]
fn sim_prints_a_configuration_that_runs_and_names_a_busy_address() {
    use std::io::{BufRead, BufReader};
    let dir = tempfile::tempdir().unwrap();
    let mut sim = Command::new(env!("CARGO_BIN_EXE_host-harness"))
        .env("TMPDIR", dir.path())
        .args(["sim", "--listen", "127.0.0.1:0"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(sim.stdout.take().unwrap()).lines().map(Result::unwrap);
    let printed: Vec<String> = lines.by_ref().take_while(|line| !line.starts_with("(Ctrl-C")).collect();
    let url = printed[0].rsplit(' ').next().unwrap().to_owned();
    let pasted = printed.iter().skip_while(|line| !line.starts_with("a configuration")).nth(1).unwrap();
    let config = dir.path().join("sim.json");
    std::fs::write(&config, pasted).unwrap();
    let lifecycle = harness(&["lifecycle", "--config", config.to_str().unwrap()], "");
    assert_eq!(lifecycle.status.code(), Some(0), "{}", String::from_utf8_lossy(&lifecycle.stderr));

    let address = url.trim_start_matches("http://");
    let second = harness(&["sim", "--listen", address], "");
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert_eq!(second.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains(address) && stderr.lines().count() == 1, "{stderr}");
    // SAFETY: `kill` only sends a signal to our own child process.
    assert_eq!(unsafe { libc::kill(sim.id() as i32, libc::SIGTERM) }, 0);
    sim.wait().unwrap();
}

#[test]
fn an_unreachable_api_creates_nothing_and_leaves_nothing_to_sweep() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("unreachable.json");
    std::fs::write(
        &config,
        r#"{"config": {"apiUrl": "http://127.0.0.1:1", "apiKey": "k-1", "shape": "s-1vcpu-1gb"}}"#,
    )
    .unwrap();
    let ledger = dir.path().join("ledger.sqlite3");
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_host-harness"))
            .arg("--ledger")
            .arg(&ledger)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    for command in ["acquire", "probe", "lifecycle"] {
        let output = run(&[command, "--config", config.to_str().unwrap()]);
        let said =
            format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
        assert_eq!(output.status.code(), Some(1), "{command}: {said}");
        assert!(said.contains("was not sent: cannot connect to http://127.0.0.1:1."), "{command}: {said}");
        assert!(!said.contains("could not be confirmed") && !said.contains("k-1"), "{command}: {said}");
    }
    let sweep = run(&["sweep"]);
    let said = String::from_utf8_lossy(&sweep.stdout);
    assert_eq!(sweep.status.code(), Some(0), "{said}");
    assert!(said.contains("0 unresolvable"), "{said}");
}

#[test]
fn without_config_another_provider_runs_on_its_defaults_or_is_told_to_give_one() {
    let hello = e2e::library("hello_provider");
    for command in [vec!["lifecycle"], vec!["soak", "--leases", "2"], vec!["conform"]] {
        let args: Vec<&str> =
            ["--plugin", hello.to_str().unwrap()].into_iter().chain(command.clone()).collect();
        let output = harness(&args, "");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{command:?}: {stderr}");
        let errors: Vec<&str> =
            stderr.lines().filter(|line| !line.starts_with("created ledger directory")).collect();
        assert_eq!(errors.len(), 1, "{command:?}: {stderr}");
        assert!(errors[0].contains("provider `hello` needs --config FILE"), "{command:?}: {stderr}");
    }
    // A provider whose empty configuration is valid runs on it, without the
    // CreateOS simulator.
    let fixture = e2e::library("fixture_provider");
    let output = harness(&["--plugin", fixture.to_str().unwrap(), "lifecycle"], "");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{stdout}{}", String::from_utf8_lossy(&output.stderr));
    assert!(!stdout.contains("simulator"), "{stdout}");
}

/// The rows of the ledger at `ledger`, as `leases --json` lists them.
fn ledger_rows(ledger: &str) -> Vec<Value> {
    let output = harness(&["--ledger", ledger, "leases", "--json"], "");
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    json_lines(&output)
}

#[test]
fn a_soak_writes_a_request_budget_only_into_the_embedded_simulators_configuration() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = e2e::library("fixture_provider");
    let plugin = ["--plugin", fixture.to_str().unwrap()];
    let config = dir.path().join("fixture.json");
    std::fs::write(&config, r#"{"holdOnRelease": false}"#).unwrap();
    let config = config.to_str().unwrap();

    // Another provider's configuration is its own, offline or from a file:
    // the harness adds no key to it, whatever the simulator's rate limit.
    let ledger = dir.path().join("other.sqlite3");
    let ledger = ledger.to_str().unwrap();
    for run in
        [vec!["soak", "--leases", "1", "--no-rate-limit"], vec!["soak", "--leases", "1", "--config", config]]
    {
        let args: Vec<&str> = [&plugin[..], &["--ledger", ledger], &run[..]].concat();
        let output = harness(&args, "");
        assert_eq!(output.status.code(), Some(0), "{run:?}: {}", String::from_utf8_lossy(&output.stderr));
    }
    let rows = ledger_rows(ledger);
    assert!(!rows.is_empty());
    for row in &rows {
        assert!(row["config"].get("requestsPerMinute").is_none(), "{row}");
    }

    // The embedded simulator's provider gets the budget asked for.
    let ledger = dir.path().join("sim.sqlite3");
    let ledger = ledger.to_str().unwrap();
    let output = harness(&["--ledger", ledger, "soak", "--leases", "1", "--requests-per-minute", "4242"], "");
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    let rows = ledger_rows(ledger);
    assert!(!rows.is_empty());
    for row in &rows {
        assert_eq!(row["config"]["requestsPerMinute"], 4242, "{row}");
    }
}

#[test]
fn a_request_budget_beside_a_configuration_file_is_refused_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = e2e::library("fixture_provider");
    let config = dir.path().join("config.json");
    std::fs::write(&config, r#"{"holdOnRelease": false}"#).unwrap();
    let config = config.to_str().unwrap();
    let cases = [
        vec!["soak", "--leases", "1", "--config", config, "--requests-per-minute", "300"],
        // Offline, a provider the embedded simulator does not serve.
        vec!["--plugin", fixture.to_str().unwrap(), "soak", "--leases", "1", "--requests-per-minute", "300"],
    ];
    for args in cases {
        let output = harness(&args, "");
        let stderr = String::from_utf8_lossy(&output.stderr);
        let errors: Vec<&str> =
            stderr.lines().filter(|line| !line.starts_with("created ledger directory")).collect();
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert_eq!(errors.len(), 1, "{args:?}: {stderr}");
        assert!(errors[0].contains("--requests-per-minute"), "{args:?}: {stderr}");
        assert!(output.stdout.is_empty(), "{args:?}: nothing ran");
    }
}
