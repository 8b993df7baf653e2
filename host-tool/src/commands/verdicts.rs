//! `vfio-p2p verdicts`: the latest judged report of every domain, from the state directory.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Args, ValueEnum};

use crate::cli::GlobalArgs;
use vfio_p2p_collector::store::{Store, DEFAULT_STATE_DIR};
use vfio_p2p_emit::verdicts;
use vfio_p2p_files::write_atomic;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum VerdictsFormat {
    #[default]
    Table,
    Json,
    /// Text exposition format, for node_exporter's textfile collector.
    Prometheus,
}

#[derive(Debug, Args)]
pub struct VerdictsArgs {
    #[arg(long, value_name = "DIR", default_value = DEFAULT_STATE_DIR)]
    pub state_dir: PathBuf,
    /// Every stored boot of this domain instead of the latest of each.
    #[arg(long, value_name = "DOMAIN")]
    pub history: Option<String>,
    #[arg(long, value_enum, default_value_t)]
    pub format: VerdictsFormat,
    /// Write to FILE atomically (temporary file and rename) instead of standard output.
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
}

pub fn run(_global: &GlobalArgs, a: VerdictsArgs) -> anyhow::Result<ExitCode> {
    let store = Store::new(&a.state_dir);
    let records = match &a.history {
        Some(d) => store.history(d)?,
        None => store.latest_records()?,
    };
    let text = match a.format {
        VerdictsFormat::Table if records.is_empty() && a.history.is_some() => format!(
            "no report from {} yet: registered, its guest agent has not sent one (`vfio-p2p-agent report --send`)\n",
            a.history.as_deref().unwrap_or_default()
        ),
        VerdictsFormat::Table => verdicts::table(&records),
        VerdictsFormat::Json => serde_json::to_string_pretty(&records)? + "\n",
        VerdictsFormat::Prometheus => verdicts::prometheus(&records),
    };
    match &a.output {
        Some(path) => write_atomic(path, text.as_bytes())
            .with_context(|| format!("writing {}", path.display()))?,
        None => print!("{text}"),
    }
    Ok(ExitCode::SUCCESS)
}
