//! Output plumbing shared by every command: `--format table|json|yaml` and where text goes.

use std::path::Path;

use anyhow::Context;
use clap::ValueEnum;
use serde::Serialize;

/// Output formats shared by every command that prints data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum DataFormat {
    #[default]
    Table,
    Json,
    Yaml,
}

/// Serializes `value` as JSON (pretty) or YAML; `None` for `Table`, which each command renders itself.
pub fn to_text<T: Serialize>(value: &T, format: DataFormat) -> anyhow::Result<Option<String>> {
    Ok(match format {
        DataFormat::Table => None,
        DataFormat::Json => Some(serde_json::to_string_pretty(value)? + "\n"),
        DataFormat::Yaml => Some(serde_saphyr::to_string(value)?),
    })
}

/// Writes `text` to `path`, or stdout.
pub fn write_output(path: Option<&Path>, text: &str) -> anyhow::Result<()> {
    match path {
        Some(p) => std::fs::write(p, text).with_context(|| format!("writing {}", p.display())),
        None => {
            print!("{text}");
            Ok(())
        }
    }
}
