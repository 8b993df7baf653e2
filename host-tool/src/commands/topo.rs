//! `vfio-p2p topo`: the host's PCIe/NUMA/IOMMU layout and the P2P path between GPUs.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, ValueEnum};

use crate::cli::GlobalArgs;
use crate::context::{Context, HostConfigArgs, Needs};
use vfio_p2p_emit::data::DataFormat;
use vfio_p2p_emit::topo_dot;
use vfio_p2p_emit::topo_report::{self, HostTopoReport};

/// `topo` prints data (json/yaml) and a Graphviz drawing of the tree (dot).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum TopoFormat {
    #[default]
    Table,
    Json,
    Yaml,
    Dot,
}

#[derive(Debug, Args)]
pub struct TopoArgs {
    #[arg(long, value_enum, default_value_t)]
    pub format: TopoFormat,
    /// `nvidia-smi topo -m` output captured on this host (with its GPU index → PCI address
    /// map, see `vfio-p2p plan --help`): shows `NV#` for GPUs already bound to vfio-pci.
    #[arg(long, value_name = "FILE")]
    pub nvlink: Vec<PathBuf>,
    #[command(flatten)]
    pub host: HostConfigArgs,
}

pub fn run(global: &GlobalArgs, args: TopoArgs) -> anyhow::Result<ExitCode> {
    let Context {
        topo,
        fabric,
        source,
        ..
    } = Context::load(global, &args.host, &Needs::nvlink(&args.nvlink))?;
    let mut report = HostTopoReport::new(&topo);
    report.fabric = fabric.state.is_some().then_some(fabric);
    let hint = "to see what topo shows on a GPU server, try an embedded example: \
                `vfio-p2p --example hgx-h100 topo` (all examples: `vfio-p2p --example list`)";
    let no_gpus = report.gpus.is_empty() && source.example().is_none();
    // The table says it has no GPUs itself; with data on stdout, stderr says it once.
    if no_gpus && !matches!(args.format, TopoFormat::Table) {
        tracing::warn!("no GPUs in {}; {hint}", report.source);
    }
    let text = match args.format {
        TopoFormat::Table if no_gpus => format!(
            "{}{}",
            topo_report::render_table(&topo, &report),
            vfio_p2p_style::wrap(
                &format!("{}{}", &hint[..1].to_uppercase(), &hint[1..]),
                vfio_p2p_style::output_width()
            )
        ),
        TopoFormat::Table => topo_report::render_table(&topo, &report),
        TopoFormat::Dot => topo_dot::render_dot(&topo, &report),
        TopoFormat::Json => {
            vfio_p2p_emit::data::to_text(&report, DataFormat::Json)?.unwrap_or_default()
        }
        TopoFormat::Yaml => {
            vfio_p2p_emit::data::to_text(&report, DataFormat::Yaml)?.unwrap_or_default()
        }
    };
    print!("{text}");
    Ok(ExitCode::SUCCESS)
}
