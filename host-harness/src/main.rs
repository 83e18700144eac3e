//! `host-harness`: load a sandbox provider by path and drive its hooks.
//!
//! A thin clap front end; the commands live in `commands/`.

mod commands;

use clap::{Args, FromArgMatches, Parser, Subcommand};
use commands::{
    hooks::{ConfigArg, LeaseArgs},
    Failure, Printer,
};
use host_harness::{
    interrupt,
    plugin::{find_plugin, load_hosted, Library},
};
use provider_host::isolation::{run_worker_if_requested, IsolationOptions, Limits};
use provider_host::{
    pin_file::{check_signature, LockFile},
    providers::ProvidersDir,
    staging::Staging,
    store::{LedgerLocation, StoreOptions},
};
use std::{
    path::{Path, PathBuf},
    process::ExitCode,
    time::Duration,
};

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

/// Headings of the global options in `--help`, after each command's own.
const HEADING_PROVIDER: &str = "Provider options";
const HEADING_LEDGER: &str = "Ledger options";
const HEADING_OUTPUT: &str = "Output options";
const HEADING_ISOLATION: &str = "Isolation options";

/// The groups of global options a top-level command has no use for: hidden
/// from its help, man page and completions (still accepted, so one alias can
/// carry them to every command).
fn unused_global_headings(command: &str) -> &'static [&'static str] {
    match command {
        "sim" | "completions" | "man" => &[HEADING_PROVIDER, HEADING_LEDGER, HEADING_ISOLATION],
        "providers" | "lock" => &[HEADING_LEDGER, HEADING_ISOLATION],
        _ => &[],
    }
}

/// The command line's definition: the derived one, with each command showing
/// only the global options it uses. A subcommand that holds its own hidden
/// copy of a global option is not given the visible one.
fn cli_command() -> clap::Command {
    let command = <Cli as clap::CommandFactory>::command();
    let globals: Vec<clap::Arg> =
        command.get_arguments().filter(|arg| arg.is_global_set()).cloned().collect();
    command.mut_subcommands(|sub| {
        let unused = unused_global_headings(sub.get_name());
        let hidden = globals
            .iter()
            .filter(|arg| arg.get_help_heading().is_some_and(|heading| unused.contains(&heading)))
            .map(|arg| arg.clone().hide(true));
        sub.args(hidden)
    })
}

/// Options every command takes.
#[derive(Args)]
pub struct Global {
    /// Provider library to load. Searched in order: this flag;
    /// $HOST_HARNESS_PLUGIN; the active provider of the providers directory
    /// (`providers install`, `providers use`); the CreateOS provider built
    /// next to this binary.
    #[arg(long, global = true, help_heading = HEADING_PROVIDER, value_name = "PATH")]
    plugin: Option<PathBuf>,
    /// The providers directory (default: $XDG_DATA_HOME/host-harness/providers,
    /// or ~/.local/share/host-harness/providers).
    #[arg(long, global = true, help_heading = HEADING_PROVIDER, value_name = "DIR")]
    providers_dir: Option<PathBuf>,
    /// The lock file of pinned provider libraries (default: providers.lock
    /// beside the ledger).
    #[arg(long, global = true, help_heading = HEADING_PROVIDER, value_name = "FILE")]
    lock: Option<PathBuf>,
    /// Refuse, before opening it, a provider library whose SHA-256 the lock
    /// file does not pin.
    #[arg(long, global = true, help_heading = HEADING_PROVIDER)]
    locked: bool,
    /// A minisign public key (base64) trusted to sign provider libraries
    /// (`LIBRARY.minisig`); repeatable. `inspect` reports the verdict.
    #[arg(long = "trusted-key", global = true, help_heading = HEADING_PROVIDER, value_name = "KEY")]
    trusted_keys: Vec<String>,
    /// The lease ledger: a SQLite file (default:
    /// $XDG_STATE_HOME/host-harness/ledger.sqlite3, or
    /// ~/.local/state/host-harness/ledger.sqlite3), or a fleet's PostgreSQL
    /// database (postgres://USER@HOST/DB, or postgres:///DB?host=/socket/dir).
    #[arg(long, global = true, help_heading = HEADING_LEDGER, value_name = "PATH|URL")]
    ledger: Option<PathBuf>,
    /// With a PostgreSQL ledger: how long this host's heartbeat lasts
    /// unrenewed (renewed every third of it) before a surviving host takes
    /// over its leases, e.g. 30s.
    #[arg(long, global = true, help_heading = HEADING_LEDGER, value_name = "DURATION", default_value = "30s", value_parser = commands::duration_at_least(Duration::from_secs(1), "heartbeat expiry", "30s or 2m"))]
    heartbeat_expiry: Duration,
    /// Print machine-readable JSON instead of text.
    #[arg(long, global = true, help_heading = HEADING_OUTPUT)]
    json: bool,
    /// More logging (-v info, -vv debug), the provider's included; RUST_LOG overrides.
    #[arg(short, long, global = true, help_heading = HEADING_OUTPUT, action = clap::ArgAction::Count)]
    verbose: u8,
    /// Log format on stderr: text (coloured only on a terminal) or json, one object a line.
    #[arg(long, global = true, help_heading = HEADING_OUTPUT, value_enum, default_value_t = LogFormat::Text, value_name = "FORMAT")]
    log_format: LogFormat,
    #[command(flatten)]
    isolation: IsolationArgs,
}

/// `--log-format`.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object a line.
    Json,
}

/// `--isolate` and the worker's limits, on every command that loads a provider.
#[derive(Args)]
pub struct IsolationArgs {
    /// Run the provider in a worker process: a crash in it (segmentation
    /// fault, abort, stack overflow, runaway allocation) fails the calls in
    /// flight, not the harness, and the next call starts a new worker.
    /// Costs microseconds a call instead of nanoseconds.
    #[arg(long, global = true, help_heading = HEADING_ISOLATION)]
    isolate: bool,
    /// With --isolate: seconds a hook may run before its worker is killed
    /// and restarted [default: 900].
    #[arg(long, global = true, help_heading = HEADING_ISOLATION, value_name = "SECONDS")]
    hook_deadline: Option<u64>,
    /// With --isolate: the worker's address space in MiB, 0 for the
    /// harness's own limit [default: 16384].
    #[arg(long, global = true, help_heading = HEADING_ISOLATION, value_name = "MIB")]
    worker_memory: Option<u64>,
    /// With --isolate: the worker's CPU time in seconds, 0 for no limit
    /// [default: 3600].
    #[arg(long, global = true, help_heading = HEADING_ISOLATION, value_name = "SECONDS")]
    worker_cpu: Option<u64>,
    /// With --isolate: the worker's open files, 0 for the harness's own
    /// limit [default: 8192].
    #[arg(long, global = true, help_heading = HEADING_ISOLATION, value_name = "N")]
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
        let limits = &defaults.limits;
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

#[derive(Subcommand)]
enum Command {
    /// Print the provider's manifest: id, version, ABI version, hooks and config schema.
    #[command(
        after_help = "Examples:\n  host-harness inspect\n  host-harness --plugin ./libmy_provider.so inspect --json"
    )]
    Inspect,
    /// Call the provider's `health` hook (no remote request).
    #[command(after_help = "Examples:\n  host-harness health")]
    Health,
    /// Validate a provider configuration and print the normalised result.
    #[command(
        after_help = "Examples:\n  host-harness validate --config createos.json\n  echo '{\"shape\":\"s-1vcpu-1gb\"}' | host-harness validate --config -"
    )]
    Validate(ConfigArg),
    /// Run a whole lease lifecycle: validate, probe, acquire, realize, execute,
    /// release for reuse, resume, execute again, destroy. Without --config it
    /// runs against an embedded CreateOS simulator (offline, no account).
    /// Sweeps leases left behind by earlier runs first.
    #[command(
        after_help = "Examples:\n  host-harness lifecycle\n  host-harness -v lifecycle --config createos.json --json"
    )]
    Lifecycle {
        /// Harness configuration (JSON): {"companyId", "environmentId", "config": {...}}.
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
    },
    /// Run many lifecycles at once against the embedded simulator under a
    /// fault profile and check the invariants (exit 1 if one broke).
    #[command(
        after_help = "Examples:\n  host-harness soak --leases 200 --concurrency 25 --faults hostile --seed 11 --no-rate-limit"
    )]
    Soak(commands::runs::SoakArgs),
    /// Acquire a lease and print it as lease JSON.
    #[command(after_help = "Examples:\n  host-harness acquire --config createos.json > lease.json")]
    Acquire(ConfigArg),
    /// Resume a released lease; prints the lease (expired: acquire a new one).
    #[command(
        after_help = "Examples:\n  host-harness resume --config createos.json --lease lease.json > lease.json.new"
    )]
    Resume(LeaseArgs),
    /// Release a lease for reuse (or destroy it); prints the lease to keep.
    #[command(
        after_help = "Examples:\n  host-harness release --config createos.json --lease lease.json > lease.json.new"
    )]
    Release {
        #[command(flatten)]
        lease: LeaseArgs,
        /// Destroy the lease instead of keeping it for reuse.
        #[arg(long)]
        destroy: bool,
    },
    /// Destroy a lease.
    #[command(after_help = "Examples:\n  host-harness destroy --config createos.json --lease lease.json")]
    Destroy(LeaseArgs),
    /// Acquire a lease, run a real command in it and destroy it.
    #[command(after_help = "Examples:\n  host-harness probe --config createos.json")]
    Probe(ConfigArg),
    /// Run a command in a lease, streaming its output; exits with its exit code
    /// (124 on timeout, 125 when it ended without one).
    #[command(
        after_help = "Examples:\n  host-harness exec --config createos.json --lease lease.json -- uname -a\n  echo hello | host-harness exec --config c.json --lease lease.json -- cat\n  host-harness exec --config c.json --lease lease.json --env MODE=ci --cwd src --timeout 2m -- make test\n  host-harness exec --config c.json --lease lease.json --stdin data.bin -- sha256sum"
    )]
    Exec {
        #[command(flatten)]
        lease: LeaseArgs,
        #[command(flatten)]
        options: commands::hooks::ExecArgs,
        /// The command and its arguments.
        #[arg(last = true, required = true, value_name = "CMD")]
        command: Vec<String>,
    },
    /// Copy files into a lease (`--in LOCAL:REMOTE`, a local directory as a
    /// directory) and out of it (`--out REMOTE:LOCAL`, a `REMOTE` ending in
    /// `/` as a directory); prints what each operation moved. The first `:`
    /// separates the two paths.
    #[command(
        after_help = "Examples:\n  host-harness sync --config c.json --lease l.json --in ./src:/paperclip-workspace/src --then 'make test'\n  host-harness sync --config c.json --lease l.json --out /paperclip-workspace/report.txt:./report.txt"
    )]
    Sync {
        #[command(flatten)]
        lease: LeaseArgs,
        #[command(flatten)]
        transfer: commands::hooks::SyncArgs,
    },
    /// Destroy every lease a crashed or interrupted run left behind. Leases
    /// the hook commands left active or paused are held on purpose and are
    /// kept unless --include-held. Exits 1 when a destroy failed or a row
    /// names no sandbox (a creation was in flight when its run died).
    #[command(
        after_help = "Examples:\n  host-harness sweep\n  host-harness sweep --config createos.json --include-held"
    )]
    Sweep(commands::ledger::SweepArgs),
    /// List the lease ledger.
    #[command(
        after_help = "Examples:\n  host-harness leases\n  host-harness leases --json | jq -r .providerLeaseId"
    )]
    Leases,
    /// Check the provider against the lease contract: one line per check, a
    /// summary, exit 1 if a check failed. Without --config it runs against an
    /// embedded CreateOS simulator. Commands run in leases through `/bin/sh`.
    #[command(
        after_help = "Examples:\n  host-harness conform\n  host-harness --plugin target/debug/libhello_provider.so conform --json"
    )]
    Conform {
        /// Harness configuration (JSON): {"companyId", "environmentId", "config": {...}}.
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
    },
    /// Serve the CreateOS simulator until Ctrl-C, printing its URL and API key.
    #[command(after_help = "Examples:\n  host-harness sim --listen 127.0.0.1:8080")]
    Sim {
        /// Loopback address to listen on.
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: std::net::SocketAddr,
        /// Turn the simulator's rate limit (300 requests a minute per client) off.
        #[arg(long)]
        no_rate_limit: bool,
        /// Count the 300 requests a minute with a token bucket of this burst
        /// instead of a sliding window (the default).
        #[arg(long, value_name = "BURST", conflicts_with = "no_rate_limit")]
        token_bucket: Option<u32>,
    },
    /// Manage installed provider libraries (the providers directory).
    #[command(
        subcommand,
        after_help = "Examples:\n  host-harness providers install target/release/libcreateos_provider.so\n  host-harness providers list\n  host-harness providers use createos@0.1.0"
    )]
    Providers(commands::providers::ProvidersCommand),
    /// Pin provider libraries by SHA-256 in the lock file (see --locked).
    #[command(
        subcommand,
        after_help = "Examples:\n  host-harness lock add target/release/libcreateos_provider.so\n  host-harness --locked lifecycle"
    )]
    Lock(commands::lock::LockCommand),
    /// Print shell completions for SHELL (bash, zsh, fish, elvish, powershell).
    #[command(
        after_help = "Examples:\n  host-harness completions bash > ~/.local/share/bash-completion/completions/host-harness\n  host-harness completions zsh > ~/.zfunc/_host-harness"
    )]
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff) of the harness or of one subcommand, or
    /// write every page to a directory; generated from these definitions.
    #[command(
        after_help = "Examples:\n  host-harness man --out ~/.local/share/man/man1 && man host-harness-soak\n  host-harness man lock add | man -l -"
    )]
    Man {
        /// The subcommand whose page to print (e.g. `soak`, or `lock add`).
        subcommand: Vec<String>,
        /// Write every page (host-harness.1, host-harness-soak.1, ...) into
        /// DIR instead of printing one.
        #[arg(long, value_name = "DIR", conflicts_with = "subcommand")]
        out: Option<PathBuf>,
    },
}

/// Under `--isolate` each hook call in flight holds a thread of its own
/// while its worker runs it (a thousand at `--concurrency 1000`). glibc gives threads up to
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

/// Raises this process's soft limit of open files to its hard limit, as
/// servers do: a soak holds a connection per request in flight, and the
/// simulator one per request and three pipes per process (the usual soft
/// limit, 1,024, ends a soak of a thousand leases with "Too many open
/// files"). Failing to raise it changes nothing.
fn raise_open_files_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource::RLIMIT_NOFILE};
    if let Ok((_, hard)) = getrlimit(RLIMIT_NOFILE) {
        let _ = setrlimit(RLIMIT_NOFILE, hard, hard);
    }
}

fn main() -> ExitCode {
    // Before the worker check: a worker also holds a thread per call in
    // flight, and keeps the open-files limit its host gave it (soft and hard
    // alike, so raising the soft one changes nothing there).
    limit_malloc_arenas();
    raise_open_files_limit();
    // `--isolate` starts this binary again as each provider worker.
    run_worker_if_requested();
    let cli = Cli::from_arg_matches(&cli_command().get_matches()).unwrap_or_else(|error| error.exit());
    init_logging(cli.global.verbose, cli.global.log_format);
    let out = Printer { json: cli.global.json };
    match run(&cli, out) {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => failure.report(out),
    }
}

fn init_logging(verbose: u8, format: LogFormat) {
    use std::io::IsTerminal;
    let default = ["warn", "info", "debug"][usize::from(verbose.min(2))];
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let logs = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match format {
        LogFormat::Json => logs.json().init(),
        LogFormat::Text => logs.with_ansi(std::io::stderr().is_terminal()).init(),
    }
}

fn run(cli: &Cli, out: Printer) -> Result<(), Failure> {
    use commands::{generated, ledger};
    let global = &cli.global;
    let providers =
        ProvidersDir::new(global.providers_dir.clone().unwrap_or_else(ProvidersDir::default_root));
    let lock_path = global.lock.clone().unwrap_or_else(|| {
        LockFile::default_path(&match global.ledger() {
            LedgerLocation::Sqlite(path) => path,
            _ => provider_host::store::default_sqlite_path(),
        })
    });
    let lock = || LockFile::open(&lock_path).map_err(Failure::usage);
    // The commands that load no provider.
    match &cli.command {
        Command::Completions { shell } => generated::completions(*shell, &mut std::io::stdout()),
        Command::Man { subcommand, out: None } => generated::man_page(subcommand, &mut std::io::stdout()),
        Command::Man { out: Some(directory), .. } => generated::man_pages(directory),
        #[cfg(not(feature = "embedded-sim"))]
        Command::Sim { .. } => Err(Failure::Usage(host_harness::embedded::ABSENT.to_owned())),
        #[cfg(feature = "embedded-sim")]
        Command::Sim { listen, no_rate_limit, token_bucket } => {
            commands::sim::serve(*listen, *no_rate_limit, *token_bucket, out)
        }
        Command::Leases => ledger::leases(&global.ledger(), out),
        Command::Providers(command) => commands::providers::run(&providers, &mut lock()?, command, out),
        Command::Lock(command) => commands::lock::run(&mut lock()?, command, out),
        _ => run_provider(cli, out, &providers, &lock_path),
    }
}

/// Runs a command that loads the provider: with `providers` to search and
/// the lock file at `lock_path`.
fn run_provider(cli: &Cli, out: Printer, providers: &ProvidersDir, lock_path: &Path) -> Result<(), Failure> {
    use commands::info;
    let global = &cli.global;
    let lock = || LockFile::open(lock_path).map_err(Failure::usage);
    let plugin_path = find_plugin(global.plugin.as_deref(), providers).map_err(Failure::Usage)?;
    let lock_for_swaps = global.locked.then(lock).transpose()?;
    // With --locked, the private copy whose hash is pinned is what loads
    // (here and in workers); it lives as long as this run.
    let staging = global.locked.then(Staging::new).transpose().map_err(|error| {
        Failure::Usage(format!("cannot make a private copy of {}: {error}", plugin_path.display()))
    })?;
    let plugin = match (&lock_for_swaps, &staging) {
        (Some(lock), Some(staging)) => {
            let staged = staging.stage(&plugin_path).map_err(Failure::usage)?;
            lock.pin_of(&plugin_path, staged.sha256()).map_err(Failure::usage)?;
            Library::Staged(staged)
        }
        _ => Library::At(plugin_path.clone()),
    };
    let signature = check_signature(&plugin_path, &global.trusted_keys);
    if let Command::Conform { config } = &cli.command {
        // Calls the provider directly and destroys what it acquires: no ledger.
        return commands::conform::run(&plugin, config.as_deref(), out);
    }
    if both_from_stdin(&cli.command) {
        let both = "--config - and --lease - cannot both read stdin; give one of them as a file";
        return Err(Failure::Usage(both.into()));
    }
    let provider = load_hosted(&plugin, global.isolation.options().as_ref()).map_err(Failure::Usage)?;
    if let Command::Inspect | Command::Health | Command::Validate(_) = &cli.command {
        // No lease involved: no ledger opened.
        let result = match &cli.command {
            Command::Validate(args) => info::validate(&provider, out, &args.config),
            Command::Health => info::health(&provider, out),
            _ => info::inspect(&provider, out, &signature),
        };
        return commands::shut_down(&provider, result);
    }
    // The daemon-like commands swap the provider on SIGHUP: in process, a
    // provider set; a worker-process provider stays as it is.
    let swaps_on_hangup = matches!(cli.command, Command::Lifecycle { .. } | Command::Soak(_));
    let provider = if swaps_on_hangup { provider.swappable() } else { provider };
    let store = StoreOptions { heartbeat_expiry: global.heartbeat_expiry, ..StoreOptions::default() };
    let session = commands::Session::open(provider, &global.ledger(), &store, out)?;
    let work = || match swaps_on_hangup {
        // Each SIGHUP asks for a swap of the provider to the library at the plugin path.
        true => {
            let on_hangup = |_| swap_on_hangup(&session, &plugin_path, lock_path);
            interrupt::while_watching(&[libc::SIGHUP], on_hangup, || dispatch(cli, &session, &lock_for_swaps))
        }
        false => Ok(dispatch(cli, &session, &lock_for_swaps)),
    };
    let result = interrupt::watch(!swaps_on_hangup, || commands::stop(&session.provider), work)
        .and_then(|result| result)
        .map_err(|error| Failure::Usage(format!("cannot watch for signals: {error}")))?;
    let result = session.finish(result);
    match interrupt::requested() {
        Some(signal) => {
            interrupt::say(format_args!(
                "{}: stopped; leases in flight were cleaned up",
                interrupt::name(Some(signal))
            ));
            Err(Failure::Exit(interrupt::exit_code(signal)))
        }
        None => result,
    }
}

impl Global {
    /// `--ledger`, as a location, or the default one.
    fn ledger(&self) -> LedgerLocation {
        let parse = |path: &PathBuf| LedgerLocation::parse(path.as_os_str());
        let default = || LedgerLocation::Sqlite(provider_host::store::default_sqlite_path());
        self.ledger.as_ref().map_or_else(default, parse)
    }
}

/// Whether the `--config FILE --lease FILE` pair of a command that takes
/// one would read stdin twice.
fn both_from_stdin(command: &Command) -> bool {
    let lease = match command {
        Command::Resume(lease) | Command::Destroy(lease) => lease,
        Command::Release { lease, .. } | Command::Exec { lease, .. } => lease,
        _ => return false,
    };
    lease.config.config == Path::new("-") && lease.lease == Path::new("-")
}

/// SIGHUP: swaps the provider to the library at `library` (the plugin
/// path), pinned by the lock file at `lock_path` when one exists.
fn swap_on_hangup(session: &commands::Session, library: &Path, lock_path: &Path) {
    const CAUSE: &str = "SIGHUP";
    let Some(set) = session.provider.provider_set() else {
        return eprintln!("{CAUSE}: swap refused: the provider runs in a worker process (--isolate); the active version stays");
    };
    let lock = match lock_path.exists().then(|| LockFile::open(lock_path)).transpose() {
        Ok(lock) => lock,
        Err(error) => return eprintln!("{CAUSE}: swap refused: {error}; the active version stays"),
    };
    session.swapper.swap(CAUSE, set, library, lock.as_ref(), session.ledger.as_ref());
}

/// Runs a command that acts on leases (with the provider and the ledger);
/// `lock` pins the libraries `soak --swap-to` swaps to (with `--locked`).
fn dispatch(cli: &Cli, session: &commands::Session, lock: &Option<LockFile>) -> Result<(), Failure> {
    use commands::{hooks, ledger, runs};
    match &cli.command {
        Command::Lifecycle { config } => runs::lifecycle(session, config.as_deref()),
        Command::Soak(args) => runs::soak(session, args, lock.as_ref()),
        Command::Acquire(args) => hooks::acquire(session, &args.config),
        Command::Resume(args) => hooks::resume(session, args),
        Command::Release { lease, destroy } => hooks::release(session, lease, *destroy),
        Command::Destroy(args) => hooks::release(session, args, true),
        Command::Probe(args) => hooks::probe(session, &args.config),
        Command::Exec { lease, options, command } => hooks::exec(session, lease, options, command),
        Command::Sync { lease, transfer } => hooks::sync(session, lease, transfer),
        Command::Sweep(args) => ledger::sweep(session, args),
        _ => unreachable!("handled before opening the ledger"),
    }
}
