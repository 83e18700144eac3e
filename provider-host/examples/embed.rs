//! A tokio program embedding the host: load the CreateOS provider, and
//! through [`Host`] (the policy a platform should use: every lease in the
//! ledger before the call that needs it returns, the unconfirmed-lease
//! fallback, cancellation on drop) acquire a lease against the simulator (so
//! it runs offline), execute a command with its output printed live, and
//! release the lease. Pass a provider library path, or let it take the one
//! cargo built beside the example.
//! Run it with `cargo run -p provider-host --example embed [LIBRARY]`.

use provider_host::{
    loader::library_file_name, ByteSource, Environment, Host, Ledger, LoadedProvider, LogLevel, LogSink,
    OutputStream, Owner, Provider, RemoteCommand, SetupParams,
};
use std::{io::Write, path::PathBuf};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let simulator = createos_sim::Simulator::start(Default::default())?; // offline CreateOS
    let mut config = Environment::new("acme", "dev", simulator.provider_config(true));
    config.api_in_process = true; // the simulator's sandboxes live and die with this process
    let library = std::env::args_os().nth(1).map(PathBuf::from).unwrap_or_else(built_library);
    let provider = LoadedProvider::load(&library)?;
    let setup = SetupParams::new("embed", "0.1.0");
    provider.setup(&setup, LogSink::new(|_| {}), LogLevel::Warn)?; // the provider's log events: none here
    let state = tempfile::tempdir()?; // a platform keeps its ledger where it keeps its state
    let ledger = Ledger::open(&state.path().join("ledger.sqlite3"))?;
    let host = Host::new(&provider, &ledger, &config, Owner::Command, "embed");

    let lease = host.acquire().await?;
    println!("acquired {}", lease.id().unwrap_or("-"));

    let script = "for i in 1 2 3; do echo line $i; sleep 0.2; done; echo done >&2";
    let command = RemoteCommand::new("/bin/sh").args(["-c", script]);
    let mut print = |stream: OutputStream, chunk: &[u8]| {
        let _ = match stream {
            OutputStream::Stdout => std::io::stdout().write_all(chunk),
            OutputStream::Stderr => std::io::stderr().write_all(chunk),
        };
    };
    let result = host.execute(&lease, command, ByteSource::empty(), &mut print).await?;
    println!("exit code {:?}", result.exit_code);

    let released = host.release(&lease).await?;
    println!("released ({released:?})");
    Ok(())
}

/// The CreateOS provider cargo built for this profile (`target/<profile>/deps`).
fn built_library() -> PathBuf {
    let exe = std::env::current_exe().expect("the example's own path");
    let profile = exe.parent().and_then(|examples| examples.parent()).expect("target/<profile>/examples");
    profile.join("deps").join(library_file_name("createos_provider"))
}
