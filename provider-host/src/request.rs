//! The harness configuration file: provider config plus who is asking.

use crate::ledger::LeaseRecord;
use provider_abi::EnvironmentParams;
use serde_json::Value;
use std::{io::Read, os::unix::fs::FileTypeExt, path::Path};

/// The environment a harness command acts for.
#[derive(Debug, Clone, PartialEq)]
pub struct HarnessConfig {
    /// The provider's driver key; the manifest's when the file names none.
    pub driver_key: Option<String>,
    /// The company id sent with every hook.
    pub company_id: String,
    /// The environment id sent with every hook.
    pub environment_id: String,
    /// The provider configuration.
    pub config: Value,
    /// True when the API the provider talks to lives in this process (an
    /// API served in process, for tests or offline runs): its sandboxes are
    /// gone with the process, and the ledger says so for a later sweep.
    pub api_in_process: bool,
    /// Remarks on the file around the provider's configuration (a key the
    /// harness does not know), one line each.
    pub warnings: Vec<String>,
}

/// The keys of a harness configuration file around the provider's `config`.
pub const HARNESS_KEYS: [&str; 4] = ["companyId", "environmentId", "driverKey", "config"];

/// Company used when the configuration file names none.
pub const DEFAULT_COMPANY: &str = "harness-company";
/// Environment used when the configuration file names none.
pub const DEFAULT_ENVIRONMENT: &str = "harness-environment";

impl HarnessConfig {
    /// A configuration for `config` with the default company and environment.
    pub fn for_config(config: Value) -> Self {
        Self {
            driver_key: None,
            company_id: DEFAULT_COMPANY.into(),
            environment_id: DEFAULT_ENVIRONMENT.into(),
            config,
            api_in_process: false,
            warnings: Vec::new(),
        }
    }

    /// The configuration a lease the ledger recorded as `record` was
    /// acquired with, `config` being its provider configuration (the stored
    /// one with its secrets restored).
    pub fn of_record(record: &LeaseRecord, config: Value) -> Self {
        Self {
            driver_key: Some(record.env.driver_key.clone()),
            company_id: record.env.company_id.clone(),
            environment_id: record.env.environment_id.clone(),
            config,
            api_in_process: record.env.api_in_process,
            warnings: Vec::new(),
        }
    }

    /// Reads a configuration file (`-` for stdin).
    ///
    /// Either `{"companyId", "environmentId", "driverKey"?, "config": {...}}`
    /// or a bare provider configuration object.
    pub fn read(path: &Path) -> Result<Self, String> {
        let text = read_text(path)?;
        Self::parse(&text).map_err(|error| format!("{}: {error}", path.display()))
    }

    /// Parses the text of a configuration file.
    pub fn parse(text: &str) -> Result<Self, String> {
        let value: Value = serde_json::from_str(text).map_err(|error| format!("not valid JSON ({error})"))?;
        let Value::Object(mut object) = value else {
            return Err("the configuration must be a JSON object".into());
        };
        let Some(config) = object.remove("config") else {
            return Ok(Self::for_config(Value::Object(object)));
        };
        let text_field =
            |object: &serde_json::Map<String, Value>, key: &str| -> Result<Option<String>, String> {
                match object.get(key) {
                    None => Ok(None),
                    Some(Value::String(text)) if !text.trim().is_empty() => Ok(Some(text.clone())),
                    Some(_) => Err(format!("`{key}` must be a non-empty string")),
                }
            };
        let warnings = object
            .keys()
            .filter(|key| !HARNESS_KEYS.contains(&key.as_str()))
            .map(|key| unknown_key_warning(key))
            .collect();
        Ok(Self {
            driver_key: text_field(&object, "driverKey")?,
            company_id: text_field(&object, "companyId")?.unwrap_or_else(|| DEFAULT_COMPANY.into()),
            environment_id: text_field(&object, "environmentId")?
                .unwrap_or_else(|| DEFAULT_ENVIRONMENT.into()),
            config,
            api_in_process: false,
            warnings,
        })
    }

    /// Refuses, in one line naming both, a file whose `driverKey` names
    /// another provider than the loaded one (whose driver key is
    /// `loaded_driver_key`).
    pub fn check_driver(&self, loaded_driver_key: &str) -> Result<(), String> {
        match &self.driver_key {
            Some(meant) if meant != loaded_driver_key => Err(format!(
                "this configuration is for provider `{meant}` (its driverKey), but the loaded provider is `{loaded_driver_key}`: load {meant}'s library (--plugin, or `host-harness providers use`)"
            )),
            _ => Ok(()),
        }
    }

    /// The hook parameters for this environment.
    pub fn environment(&self, manifest_driver_key: &str) -> EnvironmentParams {
        EnvironmentParams {
            driver_key: self.driver_key.as_deref().unwrap_or(manifest_driver_key).into(),
            company_id: self.company_id.as_str().into(),
            environment_id: self.environment_id.as_str().into(),
            config_json: self.config.to_string().into(),
            extensions_json: Default::default(),
        }
    }
}

/// "unknown key K in the configuration file is ignored", naming the harness
/// key K most likely meant (case aside, Jaro-Winkler similarity of at least
/// 0.85) or else the known ones. A name that is not plain is not shown.
fn unknown_key_warning(key: &str) -> String {
    let plain = key.len() <= 64 && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if !plain {
        return "an unknown key in the configuration file is ignored (its name is not shown: it is not a plain name)."
            .into();
    }
    let lower = key.to_ascii_lowercase();
    let nearest = HARNESS_KEYS
        .iter()
        .map(|known| (strsim::jaro_winkler(&lower, &known.to_ascii_lowercase()), *known))
        .filter(|(similarity, _)| *similarity >= 0.85)
        .max_by(|a, b| a.0.total_cmp(&b.0));
    match nearest {
        Some((_, known)) => {
            format!("unknown key {key} in the configuration file is ignored; did you mean {known}?")
        }
        None => format!(
            "unknown key {key} in the configuration file is ignored (known: {}).",
            HARNESS_KEYS.join(", ")
        ),
    }
}

/// The most a configuration or lease file may weigh: 1 MiB. Both are a few
/// hundred bytes; the cap keeps `--config /dev/zero` (or a runaway pipe) from
/// growing the harness without bound.
pub const MAX_INPUT_BYTES: u64 = 1 << 20;

/// Reads a whole configuration or lease file, or stdin for `-`, of at most
/// [`MAX_INPUT_BYTES`].
///
/// Only a regular file or a pipe is opened (a FIFO given by name, or
/// `<(command)`, is legitimate input); a directory, device or socket is
/// refused before it is opened. Every error is one line naming the file.
pub fn read_text(path: &Path) -> Result<String, String> {
    if path == Path::new("-") {
        return read_bounded(std::io::stdin().lock(), "stdin");
    }
    let shown = path.display().to_string();
    let fail = |error: std::io::Error| format!("cannot read {shown}: {error}");
    let kind = std::fs::metadata(path).map_err(fail)?.file_type();
    if !(kind.is_file() || kind.is_fifo()) {
        return Err(format!("cannot read {shown}: not a regular file or a pipe but {}", describe(kind)));
    }
    read_bounded(std::fs::File::open(path).map_err(fail)?, &shown)
}

/// Reads `source` to its end, refusing more than [`MAX_INPUT_BYTES`] or text
/// that is not UTF-8.
fn read_bounded(source: impl Read, shown: &str) -> Result<String, String> {
    let mut bytes = Vec::new();
    source
        .take(MAX_INPUT_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|error| format!("cannot read {shown}: {error}"))?;
    if bytes.len() as u64 > MAX_INPUT_BYTES {
        return Err(format!(
            "cannot read {shown}: larger than {} KiB, the most a configuration or lease file may weigh",
            MAX_INPUT_BYTES / 1024
        ));
    }
    String::from_utf8(bytes).map_err(|_| format!("cannot read {shown}: not UTF-8 text"))
}

/// What a file that is neither a regular file nor a pipe is, in a few words.
fn describe(kind: std::fs::FileType) -> &'static str {
    if kind.is_dir() {
        "a directory"
    } else if kind.is_char_device() {
        "a character device"
    } else if kind.is_block_device() {
        "a block device"
    } else if kind.is_socket() {
        "a socket"
    } else {
        "a special file"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_both_file_shapes_and_rejects_bad_ones() {
        let bare = HarnessConfig::parse(r#"{"shape":"s-1vcpu-1gb"}"#).unwrap();
        assert_eq!(bare.config, json!({"shape": "s-1vcpu-1gb"}));
        assert_eq!(bare.company_id, DEFAULT_COMPANY);
        let full =
            HarnessConfig::parse(r#"{"companyId":"c","environmentId":"e","config":{"shape":"x"}}"#).unwrap();
        assert_eq!((full.company_id.as_str(), full.environment_id.as_str()), ("c", "e"));
        for bad in ["[]", "nope", r#"{"companyId":5,"config":{}}"#] {
            let error = HarnessConfig::parse(bad).unwrap_err();
            assert!(!error.contains('\n'), "{error}");
        }
    }

    #[test]
    fn input_is_capped_at_one_mebibyte() {
        let at_limit = vec![b' '; MAX_INPUT_BYTES as usize];
        assert_eq!(read_bounded(at_limit.as_slice(), "f").unwrap().len(), at_limit.len());
        let error = read_bounded(std::io::repeat(0).take(MAX_INPUT_BYTES * 4), "big.json").unwrap_err();
        assert!(error.contains("big.json") && error.contains("1024 KiB"), "{error}");
        assert!(read_bounded(&b"\xff"[..], "f").unwrap_err().contains("UTF-8"));
    }

    #[test]
    fn only_regular_files_and_pipes_are_read() {
        let dir = tempfile::tempdir().unwrap();
        for (path, what) in [("/dev/zero", "a character device"), ("/", "a directory")] {
            let error = read_text(Path::new(path)).unwrap_err();
            assert!(error.contains(path) && error.contains(what) && !error.contains('\n'), "{error}");
        }
        let file = dir.path().join("config.json");
        std::fs::write(&file, "{}").unwrap();
        assert_eq!(read_text(&file).unwrap(), "{}");
    }
}
