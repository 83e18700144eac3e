//! Turning hook results into JSON (for `--json`) and human-readable lines.

use provider_abi::{Manifest, ProviderError, ValidationReport};
use serde_json::{json, Value};

/// Parses a JSON text field of a hook result, keeping it as a string if it is
/// not valid JSON (a provider bug the user should still see).
pub fn json_field(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_owned()))
}

/// The manifest as JSON.
pub fn manifest(manifest: &Manifest) -> Value {
    json!({
        "id": manifest.id.as_str(),
        "version": manifest.version.as_str(),
        "displayName": manifest.display_name.as_str(),
        "driverKey": manifest.driver_key.as_str(),
        "abiVersion": manifest.abi_version.to_string(),
        "hooks": manifest.hooks.iter().map(|hook| hook.as_str()).collect::<Vec<_>>(),
        "configSchema": json_field(&manifest.config_schema_json),
    })
}

/// A validation report as JSON.
pub fn validation(report: &ValidationReport) -> Value {
    json!({
        "ok": report.ok,
        "normalizedConfig": report.normalized_config_json.as_ref().map(|text| json_field(text)).into_option(),
        "errors": report.errors.iter().map(|error| error.as_str()).collect::<Vec<_>>(),
        "warnings": report.warnings.iter().map(|warning| warning.as_str()).collect::<Vec<_>>(),
    })
}

/// A hook error as JSON.
pub use provider_host::error_json as error;

/// A hook error as one human-readable line.
pub fn error_line(error: &ProviderError) -> String {
    match (error.status(), error.operation()) {
        (Some(status), Some(operation)) => {
            format!("{} [{}; HTTP {status}; {operation}]", error.message, error.kind)
        }
        _ => format!("{} [{}]", error.message, error.kind),
    }
}

/// A table cell: control characters escaped (`\n`, `\u{1b}`), never raw,
/// and text longer than `max` characters shortened in the middle with `…`.
pub fn cell(text: &str, max: usize) -> String {
    let escaped: String = text
        .chars()
        .map(|c| if c.is_control() { c.escape_default().to_string() } else { c.to_string() })
        .collect();
    let count = escaped.chars().count();
    if count <= max || max < 5 {
        return escaped;
    }
    let keep = max - 1;
    let head: String = escaped.chars().take(keep - keep / 2).collect();
    let tail: String = escaped.chars().skip(count - keep / 2).collect();
    format!("{head}…{tail}")
}

/// Rows (the first is the header) as lines whose columns are aligned to the
/// widest cell; the last column is not padded.
pub fn table(rows: &[Vec<String>]) -> Vec<String> {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|column| {
            rows.iter().filter_map(|row| row.get(column)).map(|c| c.chars().count()).max().unwrap_or(0)
        })
        .collect();
    rows.iter()
        .map(|row| {
            let mut line = String::new();
            for (column, text) in row.iter().enumerate() {
                line.push_str(text);
                if column + 1 < row.len() {
                    let pad = widths[column] - text.chars().count() + 2;
                    line.extend(std::iter::repeat_n(' ', pad));
                }
            }
            line
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_escape_control_characters_and_shorten_long_text() {
        assert_eq!(cell("sb-1", 10), "sb-1");
        assert_eq!(cell("a\nb\u{1b}[31m", 40), "a\\nb\\u{1b}[31m");
        assert_eq!(cell("abcdefghijklmnop", 9), "abcd…mnop");
        assert_eq!(cell("abcdefghijklmnop", 9).chars().count(), 9);
    }

    #[test]
    fn tables_align_columns_by_characters() {
        let rows = vec![
            vec!["row".to_owned(), "lease".to_owned(), "end".to_owned()],
            vec!["1".to_owned(), "é…z".to_owned(), "x".to_owned()],
            vec!["10".to_owned(), "longer-id".to_owned(), "y".to_owned()],
        ];
        assert_eq!(table(&rows), ["row  lease      end", "1    é…z        x", "10   longer-id  y"]);
    }
}
