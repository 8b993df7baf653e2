//! `vfio-p2p gen qemu|libvirt|cloud-hypervisor|nccl`: a VM definition from the plan.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context};
use clap::{Args, ValueEnum};
use pci_config::Bdf;

use crate::cli::GlobalArgs;
use crate::config::host::HostConfig;
use crate::config::vm::VmConfig;
use crate::decide::expectation;
use crate::decide::guest_layout::{self, GuestTopology, LayoutOptions};
use crate::decide::mmio;
use crate::decide::plan::{plan, Plan, PlanOptions};
use crate::emit::libvirt::{self, LibvirtVersion};
use crate::emit::qemu::{self, ArgvFormat};
use crate::emit::vm::{ExpectationSource, VmDefinition};
use crate::emit::{cloud_hypervisor, nccl};
use crate::model::{PathKind, Topology};

/// Which configuration to write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum GenTarget {
    /// A QEMU command line.
    Qemu,
    /// A complete libvirt domain XML.
    Libvirt,
    /// A Cloud Hypervisor command line.
    CloudHypervisor,
    /// The NCCL topology XML to install in the guest (`NCCL_TOPO_FILE`).
    Nccl,
}

/// Which GPUs and how far P2P may reach; shared by `gen` and `libvirt patch`.
#[derive(Debug, Clone, Args)]
pub struct PlanningArgs {
    /// The VM's GPUs (default: the config's `gpus`, else every GPU on the host).
    #[arg(long, value_delimiter = ',', value_name = "BDF,BDF,…")]
    pub gpus: Vec<Bdf>,
    #[command(flatten)]
    pub options: super::plan::PlanOptionArgs,
}

#[derive(Debug, Args)]
pub struct GenArgs {
    #[arg(value_enum)]
    pub target: GenTarget,
    /// VM description (name, GPUs, p2p level, guest topology, memory, firmware); see configs/.
    #[arg(long, value_name = "vm.yaml")]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    pub planning: PlanningArgs,
    /// Guest PCIe tree: mirror the host (default) or one root port per GPU.
    #[arg(long, value_enum)]
    pub guest_topology: Option<GuestTopology>,
    /// VM name (overrides the config's).
    #[arg(long)]
    pub name: Option<String>,
    /// Write the guest agent's expectation JSON here and point fw_cfg at it (default: inline).
    #[arg(long, value_name = "PATH")]
    pub expect_out: Option<PathBuf>,
    /// Command-line layout for qemu and cloud-hypervisor.
    #[arg(long, value_enum)]
    pub format: Option<ArgvFormat>,
    /// libvirt version to target (default: `virsh --version`); below 8.2 cliques use `-set`.
    #[arg(long, value_name = "X.Y")]
    pub libvirt_version: Option<LibvirtVersion>,
    /// nccl only: describe the GPUs at the addresses they have on the machine read
    /// (`--sysfs-root`/`--example`), for NCCL running there rather than in a new guest.
    #[arg(long)]
    pub as_is: bool,
    /// Write to this file instead of stdout.
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
}

/// Plans cliques for `gpus` with the CLI's options over the VM config's over the host's.
pub fn plan_for(
    topo: &Topology,
    gpus: &[Bdf],
    planning: &PlanningArgs,
    config_level: Option<PathKind>,
    host: &HostConfig,
) -> anyhow::Result<Plan> {
    let options = PlanOptions {
        p2p_level: planning
            .options
            .p2p_level
            .or(config_level)
            .unwrap_or(host.p2p_level),
        allow_untranslated_p2p: planning.options.allow_untranslated_p2p,
    };
    let p = plan(topo, gpus, &options)
        .with_context(|| format!("planning cliques on {}", topo.source))?;
    for w in &p.warnings {
        tracing::warn!("{w}");
    }
    Ok(p)
}

/// The libvirt version to target: the flag, else what `virsh --version` says.
pub fn libvirt_version(flag: Option<LibvirtVersion>) -> LibvirtVersion {
    if let Some(v) = flag {
        return v;
    }
    for tool in ["virsh", "libvirtd"] {
        let out = std::process::Command::new(tool).arg("--version").output();
        if let Ok(out) = out {
            let text = String::from_utf8_lossy(&out.stdout);
            if let Some(v) = text
                .split_whitespace()
                .rev()
                .find_map(|w| w.parse::<LibvirtVersion>().ok())
            {
                return v;
            }
        }
    }
    tracing::warn!(
        "could not run `virsh --version`; assuming libvirt >= {} (pass --libvirt-version)",
        libvirt::OVERRIDE_SINCE
    );
    libvirt::OVERRIDE_SINCE
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

pub fn run(global: &GlobalArgs, args: GenArgs) -> anyhow::Result<ExitCode> {
    let mut config = match &args.config {
        Some(p) => VmConfig::load(p)?,
        None => VmConfig::default(),
    };
    if let Some(n) = &args.name {
        config.name = n.clone();
    }
    if let Some(t) = args.guest_topology {
        config.guest_topology = t;
    }
    if args.format.is_some() && matches!(args.target, GenTarget::Libvirt | GenTarget::Nccl) {
        bail!("--format applies to qemu and cloud-hypervisor command lines; libvirt and nccl write XML");
    }
    if args.as_is && args.target != GenTarget::Nccl {
        bail!("--as-is applies to `gen nccl` only");
    }
    let host = args.planning.options.host.load()?;
    let mut topo = super::load_topology(global)?;
    super::plan::apply_nvlink(&mut topo, &host, &args.planning.options.nvlink)?;
    let requested = if args.planning.gpus.is_empty() {
        config.gpus.clone()
    } else {
        args.planning.gpus.clone()
    };
    let gpus = super::plan::selected_gpus(&topo, &requested);
    let p = plan_for(&topo, &gpus, &args.planning, config.p2p_level, &host)?;
    let mut layout = guest_layout::decide(
        &topo,
        &gpus,
        &p.assignments,
        LayoutOptions {
            topology: config.guest_topology,
            guest_numa: config.guest_numa,
        },
    )
    .with_context(|| format!("laying out the guest PCIe tree for {}", config.name))?;
    if args.as_is {
        layout.as_is();
    }
    let expectation = expectation::for_layout(&config.name, &topo, &layout);
    let devices: Vec<_> = layout
        .gpus
        .iter()
        .filter_map(|g| topo.device(&g.host))
        .collect();
    let hole64 = mmio::hole64_size(&devices);
    let expectation_source = match &args.expect_out {
        Some(path) => {
            std::fs::write(path, expectation.to_json() + "\n")
                .with_context(|| format!("writing the expectation to {}", path.display()))?;
            let abs = std::path::absolute(path).unwrap_or_else(|_| path.clone());
            ExpectationSource::File(abs)
        }
        None => ExpectationSource::Inline,
    };
    let vm = VmDefinition {
        config: &config,
        layout: &layout,
        expectation: &expectation,
        expectation_source,
        hole64,
    };
    let format = args.format.unwrap_or_default();
    let text = match args.target {
        GenTarget::Qemu => qemu::render(&qemu::argv(&vm), format),
        GenTarget::Libvirt => {
            let version = libvirt_version(args.libvirt_version);
            if !version.has_override() {
                tracing::warn!("{}", libvirt::set_form_warning(version));
            }
            libvirt::domain(&vm, version)
        }
        GenTarget::CloudHypervisor => {
            let (argv, warnings) = cloud_hypervisor::argv(&vm, &topo)?;
            for w in warnings {
                tracing::warn!("{w}");
            }
            qemu::render(&argv, format)
        }
        GenTarget::Nccl => nccl::topology_xml(&vm, &topo),
    };
    write_output(args.output.as_deref(), &text)?;
    Ok(ExitCode::SUCCESS)
}
