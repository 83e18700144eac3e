//! A tokio program embedding the host: load the CreateOS provider, acquire a
//! lease (against the simulator, so it runs offline), execute a command with
//! its output printed live, release the lease. Pass a provider library path,
//! or let it take the one cargo built beside the example.
//! Run it with `cargo run -p provider-host --example embed [LIBRARY]`.

use provider_abi::{
    AcquireParams, ExecuteParams, LeaseParams, LoadedProvider, OutputStream, Provider, SetupParams,
};
use provider_host::{async_host::AsyncProvider, request::HarnessConfig};
use std::{io::Write, path::PathBuf, sync::Arc};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let simulator = createos_sim::Simulator::start(Default::default())?; // offline CreateOS
    let env = HarnessConfig::for_config(simulator.provider_config(true)).environment("createos");
    let library = std::env::args_os().nth(1).map(PathBuf::from).unwrap_or_else(built_library);
    let loaded = LoadedProvider::load(&library)?;
    loaded.setup(&SetupParams { host_name: "embed".into(), host_version: "0.1.0".into() })?;
    let provider = AsyncProvider::new(Arc::new(loaded));

    let acquire = AcquireParams { env: env.clone(), run_id: "embed".into(), ..Default::default() };
    let lease = provider.acquire_lease(acquire).await?;
    println!("acquired {:?}", lease.provider_lease_id);
    let on_lease = LeaseParams {
        env,
        run_id: "embed".into(),
        provider_lease_id: lease.provider_lease_id.clone(),
        metadata_json: lease.metadata_json.clone(),
    };

    let script = "for i in 1 2 3; do echo line $i; sleep 0.2; done; echo done >&2";
    let args = vec!["-c".into(), script.into()].into();
    let command =
        ExecuteParams { lease: on_lease.clone(), command: "/bin/sh".into(), args, ..Default::default() };
    let mut running = provider.execute(command);
    while let Some((stream, chunk)) = running.output.recv().await {
        match stream {
            OutputStream::Stdout => std::io::stdout().write_all(&chunk)?,
            OutputStream::Stderr => std::io::stderr().write_all(&chunk)?,
        }
    }
    println!("exit code {:?}", running.result().await?.exit_code.into_option());

    provider.release_lease(on_lease).await?;
    println!("released");
    Ok(())
}

/// The CreateOS provider cargo built for this profile (`target/<profile>/deps`).
fn built_library() -> PathBuf {
    let exe = std::env::current_exe().expect("the example's own path");
    let profile = exe.parent().and_then(|examples| examples.parent()).expect("target/<profile>/examples");
    profile.join("deps").join(provider_abi::library_file_name("createos_provider"))
}
