//! `host-harness`: load a sandbox provider by path and drive its hooks.
//!
//! A thin clap front end; the commands live in `commands/`.

mod commands;

use clap::{Args, Parser, Subcommand};
use commands::{Failure, Printer};
use host_harness::{
    interrupt,
    isolation::{IsolationOptions, Limits},
    plugin::find_plugin,
    providers::ProvidersDir,
};
use provider_abi::Provider;
use std::{path::PathBuf, process::ExitCode, time::Duration};

/// Load a sandbox provider library and drive its hooks.
///
/// Exit codes: 0 success, 1 the hook returned an error (or the configuration
/// is invalid, or a soak broke an invariant), 2 usage or load error; `exec`
/// exits with the command's own code.
#[derive(Parser)]
#[command(name = "host-harness", version, about, long_about)]
struct Cli {
    #[command(flatten)]
    global: Global,
    #[command(subcommand)]
    command: Command,
}

/// Options every command takes.
#[derive(Args)]
pub struct Global {
    /// Provider library to load. Searched in order: this flag;
    /// $HOST_HARNESS_PLUGIN; the active provider of the providers directory
    /// (`providers install`, `providers use`); the CreateOS provider built
    /// next to this binary.
    #[arg(long, global = true, value_name = "PATH")]
    plugin: Option<PathBuf>,
    /// The providers directory (default: $XDG_DATA_HOME/host-harness/providers,
    /// or ~/.local/share/host-harness/providers).
    #[arg(long, global = true, value_name = "DIR")]
    providers_dir: Option<PathBuf>,
    /// The lease ledger (default: $XDG_STATE_HOME/host-harness/ledger.sqlite3,
    /// or ~/.local/state/host-harness/ledger.sqlite3).
    #[arg(long, global = true, value_name = "PATH")]
    ledger: Option<PathBuf>,
    /// Print machine-readable JSON instead of text.
    #[arg(long, global = true)]
    json: bool,
    /// More logging (-v info, -vv debug); RUST_LOG overrides.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
    #[command(flatten)]
    isolation: IsolationArgs,
}

/// `--isolate` and the worker's limits, on every command that loads a provider.
#[derive(Args)]
pub struct IsolationArgs {
    /// Run the provider in a worker process: a crash in it (segmentation
    /// fault, abort, stack overflow, runaway allocation) fails the calls in
    /// flight, not the harness, and the next call starts a new worker.
    /// Costs microseconds a call instead of nanoseconds.
    #[arg(long, global = true)]
    isolate: bool,
    /// With --isolate: seconds a hook may run before its worker is killed
    /// and restarted [default: 900].
    #[arg(long, global = true, value_name = "SECONDS")]
    hook_deadline: Option<u64>,
    /// With --isolate: the worker's address space in MiB, 0 for the
    /// harness's own limit [default: 16384].
    #[arg(long, global = true, value_name = "MIB")]
    worker_memory: Option<u64>,
    /// With --isolate: the worker's CPU time in seconds, 0 for no limit
    /// [default: 3600].
    #[arg(long, global = true, value_name = "SECONDS")]
    worker_cpu: Option<u64>,
    /// With --isolate: the worker's open files, 0 for the harness's own
    /// limit [default: 8192].
    #[arg(long, global = true, value_name = "N")]
    worker_files: Option<u64>,
}

impl IsolationArgs {
    /// The isolation options, when `--isolate` was given.
    fn options(&self) -> Option<IsolationOptions> {
        if !self.isolate {
            return None;
        }
        let defaults = IsolationOptions::default();
        let limit = |value: Option<u64>, default: Option<u64>, scale: u64| match value {
            Some(0) => None,
            Some(value) => Some(value.saturating_mul(scale)),
            None => default,
        };
        let limits = Limits::default();
        Some(IsolationOptions {
            deadline: self.hook_deadline.map_or(defaults.deadline, Duration::from_secs),
            limits: Limits {
                address_space: limit(self.worker_memory, limits.address_space, 1 << 20),
                cpu_seconds: limit(self.worker_cpu, limits.cpu_seconds, 1),
                open_files: limit(self.worker_files, limits.open_files, 1),
            },
            ..defaults
        })
    }
}

/// `--config FILE`, required.
#[derive(Args)]
pub struct ConfigArg {
    /// Harness configuration (JSON), `-` for stdin: {"companyId", "environmentId", "config": {...}}
    /// or a bare provider configuration.
    #[arg(long, value_name = "FILE")]
    config: PathBuf,
}

/// `--config FILE --lease FILE`.
#[derive(Args)]
pub struct LeaseArgs {
    #[command(flatten)]
    config: ConfigArg,
    /// Lease JSON as printed by `acquire`: {"providerLeaseId", "metadata", "expired"}.
    #[arg(long, value_name = "FILE")]
    lease: PathBuf,
}

/// `soak` options.
#[derive(Args)]
pub struct SoakArgs {
    /// Number of lifecycles.
    #[arg(long, default_value_t = 20)]
    leases: usize,
    /// Lifecycles in flight at once.
    #[arg(long, default_value_t = 4)]
    concurrency: usize,
    /// Fault profile of the embedded simulator: none, flaky, hostile, or a JSON rules file.
    #[arg(long, default_value = "none", value_name = "PROFILE")]
    faults: String,
    /// Seed of the fault profile.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Turn the embedded simulator's rate limit (300 requests a minute) off.
    #[arg(long)]
    no_rate_limit: bool,
    /// The provider's request budget (`requestsPerMinute`; default: 100000
    /// with --no-rate-limit, else the provider's).
    #[arg(long, value_name = "N")]
    requests_per_minute: Option<u32>,
    /// Run against this API instead of the embedded simulator (no faults injected).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
}

#[derive(Subcommand)]
enum Command {
    /// Print the provider's manifest: id, version, ABI version, hooks and config schema.
    Inspect,
    /// Call the provider's `health` hook (no remote request).
    Health,
    /// Validate a provider configuration and print the normalised result.
    Validate(ConfigArg),
    /// Run a whole lease lifecycle: validate, probe, acquire, realize, execute,
    /// release for reuse, resume, execute again, destroy. Without --config it
    /// runs against an embedded CreateOS simulator (offline, no account).
    /// Sweeps leases left behind by earlier runs first.
    Lifecycle {
        /// Harness configuration (JSON): {"companyId", "environmentId", "config": {...}}.
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
    },
    /// Run many lifecycles at once against the embedded simulator under a
    /// fault profile and check the invariants (exit 1 if one broke).
    Soak(SoakArgs),
    /// Acquire a lease and print it as lease JSON.
    Acquire(ConfigArg),
    /// Resume a released lease; prints the lease (expired: acquire a new one).
    Resume(LeaseArgs),
    /// Release a lease for reuse (or destroy it); prints the lease to keep.
    Release {
        #[command(flatten)]
        lease: LeaseArgs,
        /// Destroy the lease instead of keeping it for reuse.
        #[arg(long)]
        destroy: bool,
    },
    /// Destroy a lease.
    Destroy(LeaseArgs),
    /// Acquire a lease, run a real command in it and destroy it.
    Probe(ConfigArg),
    /// Run a command in a lease, streaming its output; exits with its exit code
    /// (124 on timeout, 125 when it ended without one).
    Exec {
        #[command(flatten)]
        lease: LeaseArgs,
        /// The command and its arguments.
        #[arg(last = true, required = true, value_name = "CMD")]
        command: Vec<String>,
    },
    /// Destroy every lease a crashed or interrupted run left behind. Leases
    /// the hook commands left active or paused are held on purpose and are
    /// kept unless --include-held. Exits 1 when a destroy failed or a row
    /// names no sandbox (a creation was in flight when its run died).
    Sweep {
        /// Configuration whose secrets are used for leases of the same
        /// account (else the provider's own fallback).
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
        /// Also destroy leases held by the hook commands (`acquire`...).
        #[arg(long)]
        include_held: bool,
        /// Remove rows that name no sandbox, once checked by hand.
        #[arg(long)]
        forget_unresolvable: bool,
    },
    /// List the lease ledger.
    Leases,
    /// Serve the CreateOS simulator until Ctrl-C, printing its URL and API key.
    Sim {
        /// Loopback address to listen on.
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: std::net::SocketAddr,
        /// Turn the simulator's rate limit (300 requests a minute per client) off.
        #[arg(long)]
        no_rate_limit: bool,
    },
    /// Manage installed provider libraries (the providers directory).
    #[command(subcommand)]
    Providers(ProvidersCommand),
    /// The worker process of --isolate: serves the library's hooks on the
    /// socket the harness hands it (file descriptor 3).
    #[command(name = "__worker", hide = true)]
    Worker {
        /// The provider library.
        library: PathBuf,
    },
}

/// `providers` subcommands.
#[derive(Subcommand)]
enum ProvidersCommand {
    /// Check a provider library as a load would and install it as
    /// <id>/<version>; the first version installed becomes active.
    ///
    /// Example: host-harness providers install target/release/libcreateos_provider.so
    Install {
        /// The library to install.
        path: PathBuf,
        /// Replace an installed version built from another library.
        #[arg(long)]
        force: bool,
    },
    /// List installed versions: id, version, ABI, SHA-256, active, path.
    List,
    /// Make an installed version active (ID@VERSION, e.g. createos@0.1.0).
    Use {
        /// ID@VERSION.
        spec: String,
    },
    /// Remove an installed version (never the active one).
    Remove {
        /// ID@VERSION.
        spec: String,
    },
}

/// Hooks block their calling thread, so `soak` runs one thread per lifecycle
/// in flight (a thousand at `--concurrency 1000`). glibc gives threads up to
/// eight malloc arenas per core, and a thousand threads spread over them
/// roughly doubled the resident memory through fragmentation (measured:
/// 299 MiB against 150 MiB with two arenas for 3,000 lifecycles, 1,000 at
/// once). Two arenas cost nothing measurable in throughput here.
fn limit_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator tuning; called before any thread starts.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}

fn main() -> ExitCode {
    limit_malloc_arenas();
    let cli = Cli::parse();
    if let Command::Worker { library } = &cli.command {
        return host_harness::isolation::serve_worker(library);
    }
    init_logging(cli.global.verbose);
    let out = Printer { json: cli.global.json };
    match run(&cli, out) {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => failure.report(out),
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
    use commands::{info, ledger};
    let global = &cli.global;
    if let Command::Sim { listen, no_rate_limit } = &cli.command {
        return commands::sim::serve(*listen, !no_rate_limit, out);
    }
    if let Command::Leases = &cli.command {
        return ledger::leases(global.ledger.as_deref(), out);
    }
    let providers =
        ProvidersDir::new(global.providers_dir.clone().unwrap_or_else(ProvidersDir::default_root));
    if let Command::Providers(command) = &cli.command {
        return commands::providers::run(&providers, command.into(), out);
    }
    let (plugin, _) = find_plugin(global.plugin.as_deref(), &providers).map_err(Failure::Usage)?;
    let plugin = Some(plugin.as_path());
    let isolation = global.isolation.options();
    if let Command::Inspect | Command::Health | Command::Validate(_) = &cli.command {
        // No lease involved: no ledger opened.
        let provider = commands::load(plugin, isolation.as_ref())?;
        let result = match &cli.command {
            Command::Validate(args) => info::validate(&provider, out, &args.config),
            Command::Health => info::health(&provider, out),
            _ => info::inspect(&provider, out),
        };
        return commands::shut_down(&provider, result);
    }
    let session = commands::Session::open(plugin, isolation.as_ref(), global.ledger.as_deref(), out)?;
    let shut_down = || {
        if let Err(error) = session.provider.shutdown() {
            tracing::warn!(kind = %error.kind, "the provider's shutdown failed");
        }
    };
    let result = interrupt::watch(shut_down, || dispatch(cli, &session))
        .map_err(|error| Failure::Usage(format!("cannot watch for signals: {error}")))?;
    let result = session.finish(result);
    match interrupt::requested() {
        Some(signal) => {
            eprintln!("{}: stopped; leases in flight were cleaned up", interrupt::name(Some(signal)));
            Err(Failure::Exit(interrupt::exit_code(signal)))
        }
        None => result,
    }
}

/// Runs a command that acts on leases (with the provider and the ledger).
fn dispatch(cli: &Cli, session: &commands::Session) -> Result<(), Failure> {
    use commands::{hooks, ledger, runs};
    match &cli.command {
        Command::Lifecycle { config } => runs::lifecycle(session, config.as_deref()),
        Command::Soak(args) => runs::soak(session, &runs::SoakOptions::from(args)),
        Command::Acquire(args) => hooks::acquire(session, &args.config),
        Command::Resume(args) => hooks::resume(session, &args.config.config, &args.lease),
        Command::Release { lease, destroy } => {
            hooks::release(session, &lease.config.config, &lease.lease, *destroy)
        }
        Command::Destroy(args) => hooks::release(session, &args.config.config, &args.lease, true),
        Command::Probe(args) => hooks::probe(session, &args.config),
        Command::Exec { lease, command } => hooks::exec(session, &lease.config.config, &lease.lease, command),
        Command::Sweep { config, include_held, forget_unresolvable } => {
            ledger::sweep(session, config.as_deref(), *include_held, *forget_unresolvable)
        }
        Command::Inspect
        | Command::Health
        | Command::Validate(_)
        | Command::Leases
        | Command::Sim { .. }
        | Command::Providers(_)
        | Command::Worker { .. } => unreachable!("handled before opening the ledger"),
    }
}

impl<'a> From<&'a ProvidersCommand> for commands::providers::Action<'a> {
    fn from(command: &'a ProvidersCommand) -> Self {
        use commands::providers::Action;
        match command {
            ProvidersCommand::Install { path, force } => Action::Install { path, force: *force },
            ProvidersCommand::List => Action::List,
            ProvidersCommand::Use { spec } => Action::Use(spec),
            ProvidersCommand::Remove { spec } => Action::Remove(spec),
        }
    }
}

impl From<&SoakArgs> for commands::runs::SoakOptions {
    fn from(args: &SoakArgs) -> Self {
        commands::runs::SoakOptions {
            leases: args.leases,
            concurrency: args.concurrency,
            faults: args.faults.clone(),
            seed: args.seed,
            rate_limit: !args.no_rate_limit,
            requests_per_minute: args.requests_per_minute,
            config: args.config.clone(),
        }
    }
}
