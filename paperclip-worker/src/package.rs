//! The Paperclip plugin package: what an operator installs
//! (`paperclipai plugin install DIR`).
//!
//! ```text
//! DIR/package.json        name, version, "paperclipPlugin": {manifest, worker}
//! DIR/dist/manifest.js    the manifest, from the provider's own manifest and schema
//! DIR/dist/worker.js      starts bin/paperclip-worker with the server's stdio
//! DIR/bin/paperclip-worker
//! DIR/lib/<provider library>
//! DIR/state/ledger.sqlite3  (made by the worker: the lease ledger)
//! ```

use provider_abi::{Hook, Manifest};
use provider_host::secrets::SecretFields;
use serde_json::{json, Value};
use std::{
    fs,
    path::{Path, PathBuf},
};

/// The ledger's place inside the package directory.
pub const LEDGER: &str = "state/ledger.sqlite3";

/// The package's worker entry point: the only JavaScript. It starts the
/// Rust worker on the stdio the server gave it (so the worker talks to the
/// server directly), passes SIGTERM and SIGINT on, and exits as the worker
/// did.
const WORKER_JS: &str = r#"// Starts the Rust worker on this process's stdio: the server talks to it directly.
import { spawn } from "node:child_process";
import { fileURLToPath } from "node:url";

const root = fileURLToPath(new URL("..", import.meta.url));
const args = ["serve", "--plugin", root + "lib/LIBRARY", "--ledger", root + "LEDGER"];
const worker = spawn(root + "bin/paperclip-worker", args, { stdio: "inherit" });
for (const signal of ["SIGTERM", "SIGINT"]) process.on(signal, () => worker.kill(signal));
worker.on("error", (error) => { console.error(`cannot start the worker: ${error.message}`); process.exit(1); });
worker.on("exit", (code, signal) => process.exit(code ?? (signal === "SIGKILL" ? 137 : 143)));
"#;

/// The plugin id for a provider whose manifest id is `id`.
pub fn plugin_id(manifest: &Manifest) -> String {
    format!("provider-host.{}", manifest.id)
}

/// Paperclip's manifest (`PaperclipPluginManifestV1`) for `manifest`: one
/// environment driver of kind `sandbox_provider`, its configuration schema
/// the provider's with each secret property (`writeOnly`) marked
/// `format: "secret-ref"`, reusable leases when the provider can resume one.
pub fn paperclip_manifest(manifest: &Manifest) -> Value {
    let has = |hook: Hook| manifest.hooks.iter().any(|name| name.as_str() == hook.name());
    let display_name = format!("{} (provider-host)", manifest.display_name);
    json!({
        "id": plugin_id(manifest),
        "apiVersion": 1,
        "version": manifest.version.as_str(),
        "displayName": display_name,
        "description": format!(
            "The {} sandbox provider run by provider-host: a lease ledger with write-ahead records, sweep, request pacing and the unconfirmed-cleanup fallback.",
            manifest.display_name
        ),
        "author": "provider-host",
        "categories": ["workspace"],
        "capabilities": ["environment.drivers.register"],
        "entrypoints": {"worker": "./dist/worker.js"},
        "environmentDrivers": [{
            "driverKey": manifest.driver_key.as_str(),
            "kind": "sandbox_provider",
            "displayName": manifest.display_name.as_str(),
            "description": format!("{} sandboxes through provider-host.", manifest.display_name),
            "supportsReusableLeases": has(Hook::ResumeLease),
            "sandboxCapabilities": {
                "reusableLeases": has(Hook::ResumeLease),
                "nativeSyncIn": has(Hook::SyncFiles),
                "nativeSyncOut": has(Hook::SyncFiles),
            },
            "configSchema": config_schema(manifest),
        }],
    })
}

/// The provider's configuration schema with its secrets marked as
/// Paperclip expects (`format: "secret-ref"`).
fn config_schema(manifest: &Manifest) -> Value {
    let mut schema: Value = serde_json::from_str(&manifest.config_schema_json).unwrap_or_else(|_| json!({}));
    let secrets = SecretFields::of(manifest);
    if let Some(Value::Object(properties)) = schema.get_mut("properties") {
        for (name, property) in properties.iter_mut() {
            let probe = json!({ name.as_str(): "x" });
            let secret = secrets.strip(&probe).get(name.as_str()).is_none();
            if let (true, Value::Object(property)) = (secret, property) {
                property.insert("format".into(), json!("secret-ref"));
            }
        }
    }
    schema
}

/// Writes the package for `manifest` (the provider at `library`, served by
/// the worker binary `worker`) into `out`, created if missing. Returns the
/// package's files.
pub fn write(manifest: &Manifest, library: &Path, worker: &Path, out: &Path) -> Result<Vec<PathBuf>, String> {
    let library_name = library
        .file_name()
        .and_then(|name| name.to_str())
        .filter(|name| !name.contains(['"', '\\', '\n']))
        .ok_or_else(|| format!("{}: not a plain library file name", library.display()))?;
    let files = [
        (PathBuf::from("package.json"), package_json(manifest)),
        (
            PathBuf::from("dist/manifest.js"),
            format!(
                "// Generated by `paperclip-worker package` from the provider's manifest.\nexport default {};\n",
                serde_json::to_string_pretty(&paperclip_manifest(manifest)).expect("a JSON value")
            ),
        ),
        (PathBuf::from("dist/worker.js"), WORKER_JS.replace("LIBRARY", library_name).replace("LEDGER", LEDGER)),
    ];
    let mut written = Vec::new();
    let fail = |path: &Path, error: std::io::Error| format!("{}: {error}", path.display());
    for (relative, text) in files {
        let path = out.join(relative);
        create_parent(&path)?;
        fs::write(&path, text).map_err(|error| fail(&path, error))?;
        written.push(path);
    }
    for (from, relative) in
        [(worker, PathBuf::from("bin/paperclip-worker")), (library, Path::new("lib").join(library_name))]
    {
        let path = out.join(relative);
        create_parent(&path)?;
        // Through a temporary name: a running worker's binary is replaced, not rewritten.
        let staged = path.with_extension("new");
        fs::copy(from, &staged).map_err(|error| fail(from, error))?;
        fs::rename(&staged, &path).map_err(|error| fail(&path, error))?;
        written.push(path);
    }
    Ok(written)
}

fn create_parent(path: &Path) -> Result<(), String> {
    let parent = path.parent().expect("a file inside the package");
    fs::create_dir_all(parent).map_err(|error| format!("{}: {error}", parent.display()))
}

/// `package.json`: an ES module package named by Paperclip's convention.
fn package_json(manifest: &Manifest) -> String {
    let package = json!({
        "name": format!("paperclip-plugin-{}", plugin_id(manifest).replace('.', "-")),
        "version": manifest.version.as_str(),
        "description": format!("{} for Paperclip, run by provider-host", manifest.display_name),
        "type": "module",
        "private": true,
        "paperclipPlugin": {"manifest": "./dist/manifest.js", "worker": "./dist/worker.js"},
    });
    serde_json::to_string_pretty(&package).expect("a JSON value") + "\n"
}
