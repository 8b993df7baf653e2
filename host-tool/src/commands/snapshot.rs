//! `vfio-p2p snapshot -o DIR`: the host's sysfs facts as a directory that
//! `--sysfs-root DIR` reads back, to analyse a host elsewhere or attach to a bug report.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Args;

use crate::cli::GlobalArgs;
use crate::context::Context;
use vfio_p2p_read::snapshot::write_sysfs_tree;

#[derive(Debug, Args)]
pub struct SnapshotArgs {
    /// New or empty directory to write the snapshot into.
    #[arg(short, long, value_name = "DIR")]
    pub output: PathBuf,
}

pub fn run(global: &GlobalArgs, args: SnapshotArgs) -> anyhow::Result<ExitCode> {
    let host = Context::read_record(global)?;
    for w in &host.warnings {
        tracing::warn!("{w}");
    }
    write_sysfs_tree(&host, &args.output)
        .with_context(|| format!("writing the snapshot to {}", args.output.display()))?;
    eprintln!(
        "vfio-p2p: wrote {} PCI devices to {}; read it back with: vfio-p2p --sysfs-root {} topo",
        host.devices.len(),
        args.output.display(),
        args.output.display()
    );
    Ok(ExitCode::SUCCESS)
}
