//! A tokio program embedding the host: load the CreateOS provider, acquire a
//! lease (against the simulator, so it runs offline), execute a command with
//! its output printed live, release the lease. The provider library is found
//! as the harness finds it (`HOST_HARNESS_PLUGIN`, the providers directory...).
//! Run it with `cargo run -p host-harness --example embed`.

use host_harness::{async_host::AsyncProvider, embedded, plugin, providers::ProvidersDir};
use provider_abi::{AcquireParams, ExecuteParams, LeaseParams, OutputStream};
use std::{io::Write, sync::Arc};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (_simulator, config) = embedded::start()?; // offline: a CreateOS simulator
    let (library, _) = plugin::find_plugin(None, &ProvidersDir::new(ProvidersDir::default_root()))?;
    let provider = AsyncProvider::new(Arc::new(plugin::load_provider(Some(&library))?));
    let env = config.environment("createos");

    let lease = provider
        .acquire_lease(AcquireParams { env: env.clone(), run_id: "embed".into(), ..Default::default() })
        .await?;
    println!("acquired {:?}", lease.provider_lease_id);
    let on_lease = LeaseParams {
        env,
        run_id: "embed".into(),
        provider_lease_id: lease.provider_lease_id.clone(),
        metadata_json: lease.metadata_json.clone(),
    };

    let script = "for i in 1 2 3; do echo line $i; sleep 0.2; done; echo done >&2";
    let command = ExecuteParams {
        lease: on_lease.clone(),
        command: "/bin/sh".into(),
        args: vec!["-c".into(), script.into()].into(),
        ..Default::default()
    };
    let mut running = provider.execute(command);
    while let Some((stream, chunk)) = running.output.recv().await {
        match stream {
            OutputStream::Stdout => std::io::stdout().write_all(chunk.as_bytes())?,
            OutputStream::Stderr => std::io::stderr().write_all(chunk.as_bytes())?,
        }
    }
    println!("exit code {:?}", running.result().await?.exit_code.into_option());

    provider.release_lease(on_lease).await?;
    println!("released");
    Ok(())
}
