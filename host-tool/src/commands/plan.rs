//! `vfio-p2p plan`: which of a VM's GPUs share a GPUDirect clique, and why.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use pci_config::Bdf;

use crate::cli::{DataFormat, GlobalArgs};
use crate::config::host::{HostConfig, NvlinkSource};
use crate::decide::nvlink;
use crate::decide::plan::{plan, PlanOptions};
use crate::emit;
use crate::model::{PathKind, Topology};

#[derive(Debug, Args)]
pub struct PlanArgs {
    /// The VM's GPUs (default: every GPU on the host).
    #[arg(long, value_delimiter = ',', value_name = "BDF,BDF,…")]
    pub gpus: Vec<Bdf>,
    #[command(flatten)]
    pub plan: PlanOptionArgs,
    #[arg(long, value_enum, default_value_t)]
    pub format: DataFormat,
}

/// `--host-config`: the host policy that `place`, `plan`, `check`, `gen` and `libvirt patch` read.
#[derive(Debug, Clone, Args)]
pub struct HostConfigArgs {
    /// Host policy (p2p level, reserved devices, NVLink source); see configs/README.md.
    #[arg(long, value_name = "FILE")]
    pub host_config: Option<PathBuf>,
}

impl HostConfigArgs {
    /// The file given, else the defaults.
    pub fn load(&self) -> anyhow::Result<HostConfig> {
        Ok(match &self.host_config {
            Some(path) => HostConfig::load(path)?,
            None => HostConfig::default(),
        })
    }
}

/// The planning options `plan`, `check`, `gen` and `libvirt patch` share.
#[derive(Debug, Clone, Args)]
pub struct PlanOptionArgs {
    /// Worst host path allowed inside a clique: pix, pxb (NCCL's default), phb, node, sys
    /// (default: the VM config's where `gen` has one, else the host config's `p2p_level`, else pxb).
    #[arg(long, value_name = "LEVEL")]
    pub p2p_level: Option<PathKind>,
    /// `nvidia-smi topo -m` output captured on this host, with the GPU index → PCI address
    /// map (`nvidia-smi --query-gpu=index,pci.bus_id --format=csv` or plain `nvidia-smi`)
    /// in the same or another file; repeat for several files.
    #[arg(long, value_name = "FILE")]
    pub nvlink: Vec<PathBuf>,
    /// Put GPUs whose switch routes P2P untranslated (ACS RR/CR cleared) into cliques anyway.
    #[arg(long)]
    pub allow_untranslated_p2p: bool,
    #[command(flatten)]
    pub host: HostConfigArgs,
}

impl PlanOptionArgs {
    /// The flags over the host config's policy.
    pub fn options(&self, host: &HostConfig) -> PlanOptions {
        PlanOptions {
            p2p_level: self.p2p_level.unwrap_or(host.p2p_level),
            allow_untranslated_p2p: self.allow_untranslated_p2p,
        }
    }
}

/// Records NVLink from `--nvlink` files when there are any, else from the host config's
/// source. `topo` is `load_topology`'s (or `model_host`'s), which already applied an
/// NVSwitch fabric: the default source.
pub fn apply_nvlink(
    topo: &mut Topology,
    host: &HostConfig,
    files: &[PathBuf],
) -> anyhow::Result<()> {
    if !files.is_empty() {
        return load_nvlink(topo, files);
    }
    match &host.nvlink {
        NvlinkSource::Nvswitch => Ok(()),
        NvlinkSource::None => {
            topo.nvlinks.clear();
            Ok(())
        }
        NvlinkSource::NvidiaSmi(file) => {
            topo.nvlinks.clear();
            load_nvlink(topo, std::slice::from_ref(file))
                .context("loading the host config's nvlink.file")
        }
    }
}

/// Records NVLink from `--nvlink` files (read together) into `topo`.
pub fn load_nvlink(topo: &mut Topology, files: &[PathBuf]) -> anyhow::Result<()> {
    if files.is_empty() {
        return Ok(());
    }
    let mut text = String::new();
    for f in files {
        text += &std::fs::read_to_string(f)
            .with_context(|| format!("reading --nvlink file {}", f.display()))?;
        text.push('\n');
    }
    let names = files
        .iter()
        .map(|f| f.display().to_string())
        .collect::<Vec<_>>()
        .join(" + ");
    let map = nvlink::parse_nvidia_smi(&text, &names)?;
    nvlink::apply(topo, &map, &names)?;
    Ok(())
}

/// The selected GPUs, or every GPU of the host.
pub fn selected_gpus(topo: &Topology, gpus: &[Bdf]) -> Vec<Bdf> {
    if gpus.is_empty() {
        topo.gpus().map(|d| d.bdf).collect()
    } else {
        gpus.to_vec()
    }
}

pub fn run(global: &GlobalArgs, args: PlanArgs) -> anyhow::Result<ExitCode> {
    let host = args.plan.host.load()?;
    let mut topo = super::load_topology(global)?;
    apply_nvlink(&mut topo, &host, &args.plan.nvlink)?;
    let gpus = selected_gpus(&topo, &args.gpus);
    let p = plan(&topo, &gpus, &args.plan.options(&host))
        .with_context(|| format!("planning cliques on {}", topo.source))?;
    match emit::data::to_text(&p, args.format)? {
        Some(t) => print!("{t}"),
        None => print!("{}", emit::plan::table(&p)),
    }
    Ok(ExitCode::SUCCESS)
}
