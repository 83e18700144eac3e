//! The harness's configuration file: a provider configuration, bare or
//! with who is asking around it (`companyId`, `environmentId`,
//! `driverKey`), read into the host's [`Environment`].

use provider_host::environment::Environment;
use serde_json::Value;
use std::{io::Read, os::unix::fs::FileTypeExt, path::Path};

/// A configuration file as read: the environment it describes and remarks
/// on the file around the provider's configuration (a key the harness does
/// not know), one line each.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigFile {
    /// The environment the file describes.
    pub environment: Environment,
    /// Remarks on the file, one line each.
    pub warnings: Vec<String>,
}

/// The keys of a harness configuration file around the provider's `config`.
pub const HARNESS_KEYS: [&str; 4] = ["companyId", "environmentId", "driverKey", "config"];

/// Company used when the configuration file names none.
pub const DEFAULT_COMPANY: &str = "harness-company";
/// Environment used when the configuration file names none.
pub const DEFAULT_ENVIRONMENT: &str = "harness-environment";

/// The environment of a provider configuration `config` with the harness's
/// default company and environment.
pub fn harness_environment(config: Value) -> Environment {
    Environment::new(DEFAULT_COMPANY, DEFAULT_ENVIRONMENT, config)
}

impl ConfigFile {
    /// Reads a configuration file (`-` for stdin) for the loaded provider,
    /// whose driver key is `driver_key`: a file whose `driverKey` names
    /// another provider is refused in one line naming both.
    ///
    /// Either `{"companyId", "environmentId", "driverKey"?, "config": {...}}`
    /// or a bare provider configuration object.
    pub fn read(path: &Path, driver_key: &str) -> Result<Self, String> {
        let file = Self::parse(&read_text(path)?).map_err(|error| format!("{}: {error}", path.display()))?;
        match &file.environment.driver_key {
            Some(meant) if meant != driver_key => Err(format!(
                "this configuration is for provider `{meant}` (its driverKey), but the loaded provider is `{driver_key}`: load {meant}'s library (--plugin, or `host-harness providers use`)"
            )),
            _ => Ok(file),
        }
    }

    /// Parses the text of a configuration file.
    pub fn parse(text: &str) -> Result<Self, String> {
        let value: Value = serde_json::from_str(text).map_err(|error| format!("not valid JSON ({error})"))?;
        let Value::Object(mut object) = value else {
            return Err("the configuration must be a JSON object".into());
        };
        let Some(config) = object.remove("config") else {
            return Ok(Self {
                environment: harness_environment(Value::Object(object)),
                warnings: Vec::new(),
            });
        };
        let text_field = |key: &str| match object.get(key) {
            None => Ok(None),
            Some(Value::String(text)) if !text.trim().is_empty() => Ok(Some(text.clone())),
            Some(_) => Err(format!("`{key}` must be a non-empty string")),
        };
        let warnings = object
            .keys()
            .filter(|key| !HARNESS_KEYS.contains(&key.as_str()))
            .map(|key| unknown_key_warning(key))
            .collect();
        let mut environment = Environment::new(
            text_field("companyId")?.unwrap_or_else(|| DEFAULT_COMPANY.into()),
            text_field("environmentId")?.unwrap_or_else(|| DEFAULT_ENVIRONMENT.into()),
            config,
        );
        environment.driver_key = text_field("driverKey")?;
        Ok(Self { environment, warnings })
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
    let kinds = [
        (kind.is_dir(), "a directory"),
        (kind.is_char_device(), "a character device"),
        (kind.is_block_device(), "a block device"),
        (kind.is_socket(), "a socket"),
    ];
    kinds.into_iter().find_map(|(is, what)| is.then_some(what)).unwrap_or("a special file")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_both_file_shapes_and_rejects_bad_ones() {
        let bare = ConfigFile::parse(r#"{"shape":"s-1vcpu-1gb"}"#).unwrap().environment;
        assert_eq!(bare.config, json!({"shape": "s-1vcpu-1gb"}));
        assert_eq!(bare.company_id, DEFAULT_COMPANY);
        let full = ConfigFile::parse(r#"{"companyId":"c","environmentId":"e","config":{"shape":"x"}}"#)
            .unwrap()
            .environment;
        assert_eq!((full.company_id.as_str(), full.environment_id.as_str()), ("c", "e"));
        for bad in ["[]", "nope", r#"{"companyId":5,"config":{}}"#] {
            let error = ConfigFile::parse(bad).unwrap_err();
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
