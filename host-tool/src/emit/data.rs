//! JSON and YAML printing for every command's `--format json|yaml`.

use serde::Serialize;

use crate::cli::DataFormat;

/// Serializes `value` as JSON (pretty) or YAML; `None` for `Table`, which each command renders itself.
pub fn to_text<T: Serialize>(value: &T, format: DataFormat) -> anyhow::Result<Option<String>> {
    Ok(match format {
        DataFormat::Table => None,
        DataFormat::Json => Some(serde_json::to_string_pretty(value)? + "\n"),
        DataFormat::Yaml => Some(serde_saphyr::to_string(value)?),
    })
}
