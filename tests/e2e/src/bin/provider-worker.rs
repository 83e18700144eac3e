//! `provider-worker LIBRARY`: loads the provider library at `LIBRARY` and
//! answers hooks as JSON lines on stdin/stdout (see `e2e::worker`), until
//! stdin closes.

use provider_host::loader::LoadedProvider;
use std::process::ExitCode;

fn main() -> ExitCode {
    let Some(library) = std::env::args_os().nth(1) else {
        eprintln!("usage: provider-worker LIBRARY");
        return ExitCode::from(2);
    };
    let provider = match LoadedProvider::load(&library) {
        Ok(provider) => provider,
        Err(error) => {
            eprintln!("provider-worker: {error}");
            return ExitCode::from(2);
        }
    };
    match e2e::worker::serve(&provider, std::io::stdin().lock(), std::io::stdout().lock()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("provider-worker: {error}");
            ExitCode::FAILURE
        }
    }
}
