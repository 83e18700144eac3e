//! `host-harness`: load a sandbox provider by path and drive its hooks.

use clap::{Args, Parser, Subcommand};
use host_harness::{plugin::load_provider, render, request::HarnessConfig};
use provider_abi::{LoadedProvider, Provider, ProviderError};
use serde_json::Value;
use std::{
    io::Write,
    path::{Path, PathBuf},
    process::ExitCode,
};

/// Load a sandbox provider library and drive its hooks.
///
/// Exit codes: 0 success, 1 the hook returned an error (or the configuration
/// is invalid), 2 usage or load error.
#[derive(Parser)]
#[command(name = "host-harness", version, about, long_about)]
struct Cli {
    #[command(flatten)]
    global: Global,
    #[command(subcommand)]
    command: Command,
}

#[derive(Args)]
struct Global {
    /// Provider library to load (default: the CreateOS provider built next to this binary).
    #[arg(long, global = true, value_name = "PATH")]
    plugin: Option<PathBuf>,
    /// Print machine-readable JSON instead of text.
    #[arg(long, global = true)]
    json: bool,
    /// More logging (-v info, -vv debug); RUST_LOG overrides.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
}

#[derive(Subcommand)]
enum Command {
    /// Print the provider's manifest: id, version, ABI version, hooks and config schema.
    Inspect,
    /// Call the provider's `health` hook (no remote request).
    Health,
    /// Run a whole lease lifecycle: validate, probe, acquire, realize, execute,
    /// release for reuse, resume, execute again, destroy. Without --config it
    /// runs against an embedded CreateOS simulator (offline, no account).
    Lifecycle {
        /// Harness configuration (JSON): {"companyId", "environmentId", "config": {...}}.
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
    },
    /// Serve the CreateOS simulator until Ctrl-C, printing its URL and API key.
    Sim {
        /// Loopback address to listen on.
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: std::net::SocketAddr,
    },
    /// Validate a provider configuration and print the normalised result.
    Validate {
        /// Configuration file (JSON), `-` for stdin: a provider config object, or
        /// {"companyId", "environmentId", "config": {...}}.
        #[arg(long, value_name = "FILE")]
        config: PathBuf,
    },
}

/// How a command failed; maps to the exit code.
enum Failure {
    /// The hook returned an error (`None`: already reported): exit 1.
    Hook(Option<ProviderError>),
    /// Bad usage, unreadable input or an unloadable provider: exit 2.
    Usage(String),
}

impl From<ProviderError> for Failure {
    fn from(error: ProviderError) -> Self {
        Failure::Hook(Some(error))
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.global.verbose);
    let out = Printer { json: cli.global.json };
    match run(&cli, out) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Hook(error)) => {
            if let Some(error) = error {
                out.failure(render::error(&error), &render::error_line(&error));
            }
            ExitCode::from(1)
        }
        Err(Failure::Usage(message)) => {
            out.failure(serde_json::json!({"kind": "usage", "message": message}), &message);
            ExitCode::from(2)
        }
    }
}

fn init_logging(verbose: u8) {
    let default = match verbose {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
}

fn run(cli: &Cli, out: Printer) -> Result<(), Failure> {
    if let Command::Sim { listen } = &cli.command {
        return serve_simulator(*listen, out);
    }
    let provider =
        load_provider(cli.global.plugin.as_deref()).map_err(|error| Failure::Usage(error.to_string()))?;
    let result = match &cli.command {
        Command::Inspect => {
            inspect(&provider, out);
            Ok(())
        }
        Command::Health => {
            let report = provider.health()?;
            out.value(&render::health(&report), || format!("{}: {}", report.status, report.message));
            Ok(())
        }
        Command::Validate { config } => validate(&provider, config, out),
        Command::Lifecycle { config } => lifecycle(&provider, config.as_deref(), out),
        Command::Sim { .. } => unreachable!("handled before loading a provider"),
    };
    let shutdown = provider.shutdown();
    result?;
    Ok(shutdown?)
}

fn inspect(provider: &LoadedProvider, out: Printer) {
    let manifest = provider.manifest();
    out.value(&render::manifest(&manifest), || {
        format!(
            "{} {} ({}), driver `{}`, ABI {}\nhooks: {}\nloaded from {}",
            manifest.display_name,
            manifest.version,
            manifest.id,
            manifest.driver_key,
            manifest.abi_version,
            manifest.hooks.iter().map(|hook| hook.as_str()).collect::<Vec<_>>().join(", "),
            provider.path().display()
        )
    });
}

fn validate(provider: &LoadedProvider, path: &Path, out: Printer) -> Result<(), Failure> {
    let config = HarnessConfig::read(path).map_err(Failure::Usage)?;
    let report = provider.validate_config(&config.environment(&provider.manifest().driver_key))?;
    out.value(&render::validation(&report), || {
        let verdict = match report.normalized_config_json.as_ref().into_option() {
            Some(normalized) if report.ok => format!("valid; normalised configuration: {normalized}"),
            _ => "invalid configuration".to_owned(),
        };
        std::iter::once(verdict)
            .chain(report.errors.iter().map(|error| format!("error: {error}")))
            .chain(report.warnings.iter().map(|warning| format!("warning: {warning}")))
            .collect::<Vec<_>>()
            .join("\n")
    });
    if report.ok {
        Ok(())
    } else {
        Err(Failure::Hook(None))
    }
}

fn lifecycle(provider: &LoadedProvider, config: Option<&Path>, out: Printer) -> Result<(), Failure> {
    let (_simulator, config) = match config {
        Some(path) => (None, HarnessConfig::read(path).map_err(Failure::Usage)?),
        None => {
            let (sim, config) = host_harness::embedded::start()
                .map_err(|error| Failure::Usage(format!("cannot start the embedded simulator: {error}")))?;
            if !out.json {
                println!("embedded CreateOS simulator at {}", sim.url());
            }
            (Some(sim), config)
        }
    };
    let ok = host_harness::lifecycle::run(provider, &config, |step| {
        out.value(&step.to_json(), || {
            let outcome = match &step.error {
                None => "ok".to_owned(),
                Some(error) => format!("FAILED: {}", render::error_line(error)),
            };
            let lease = step.lease_id.as_deref().map(|id| format!(" lease {id}")).unwrap_or_default();
            let note = if step.note.is_empty() { String::new() } else { format!(" ({})", step.note) };
            format!("{:<14} {:>9.1} ms  {outcome}{lease}{note}", step.step, step.duration.as_secs_f64() * 1e3)
        })
    });
    if ok {
        Ok(())
    } else {
        Err(Failure::Hook(None))
    }
}

fn serve_simulator(listen: std::net::SocketAddr, out: Printer) -> Result<(), Failure> {
    let config = createos_sim::SimConfig { listen, ..Default::default() };
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

/// Prints results as text on stdout or JSON lines on stdout; failures as
/// text on stderr.
#[derive(Clone, Copy)]
struct Printer {
    json: bool,
}

impl Printer {
    fn value(&self, value: &Value, text: impl FnOnce() -> String) {
        // A closed stdout (`| head`) is not an error worth a panic.
        let line = if self.json { value.to_string() } else { text() };
        let _ = writeln!(std::io::stdout(), "{line}");
    }

    fn failure(&self, error: Value, line: &str) {
        if self.json {
            println!("{}", serde_json::json!({"ok": false, "error": error}));
        } else {
            eprintln!("error: {line}");
        }
    }
}
