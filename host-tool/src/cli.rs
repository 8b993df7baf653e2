//! Command-line interface: global options and one subcommand per job.

use std::path::PathBuf;

use clap::{Args, CommandFactory, Parser, Subcommand};

use crate::commands;

/// The command-line definition, for man pages and completions (`cargo xtask dist`).
pub fn command() -> clap::Command {
    Cli::command()
}

#[derive(Debug, Parser)]
#[command(
    name = "vfio-p2p",
    version,
    about = "PCIe P2P for GPUs passed through to VMs: host topology, GPUDirect cliques, preflight checks and VMM configs"
)]
pub struct Cli {
    #[command(flatten)]
    pub global: GlobalArgs,
    /// Optional so that `vfio-p2p --example list` works on its own.
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// Where the host facts come from; every data command takes these.
#[derive(Debug, Clone, Args)]
pub struct GlobalArgs {
    /// Read the host below this directory (`DIR/sys/...`): `/` for the live host,
    /// a `vfio-p2p snapshot` directory, or a flat sysfs JSON dump file.
    #[arg(long, global = true, value_name = "DIR", default_value = "/")]
    pub sysfs_root: PathBuf,
    /// Use a topology embedded in the binary instead of this host (`--example list`).
    #[arg(
        long,
        global = true,
        value_name = "NAME",
        conflicts_with = "sysfs_root"
    )]
    pub example: Option<String>,
    /// More log output (repeat for more).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Show the PCIe/NUMA/IOMMU topology and the P2P path between every pair of GPUs.
    Topo(commands::topo::TopoArgs),
    /// Choose GPUs for many VMs (best P2P paths, one NUMA node, whole IOMMU groups) and plan their cliques.
    Place(commands::place::PlaceArgs),
    /// Group a VM's GPUs into GPUDirect P2P cliques and explain every pair's path.
    Plan(commands::plan::PlanArgs),
    /// Bind GPUs (and their other functions) to vfio-pci, transactionally; recorded for unbind.
    Bind(commands::bind::BindArgs),
    /// Give devices back to the driver they had before bind (or the host's default).
    Unbind(commands::bind::UnbindArgs),
    /// The libvirt qemu hook: `hook install`, and `hook run` which libvirt calls.
    Hook(commands::hook::HookArgs),
    /// Fabric Manager's partitions on NVSwitch boards: list, activate, deactivate, resync.
    Fabric(commands::fabric::FabricArgs),
    /// Write a VM definition (QEMU, libvirt, Cloud Hypervisor) or the guest's NCCL topology from the plan.
    Gen(commands::gen::GenArgs),
    /// Edit libvirt domains.
    Libvirt(commands::libvirt::LibvirtArgs),
    /// Preflight the host: everything that stops pass-through or P2P, with the fix (exit 0 pass, 1 warn, 2 fail).
    Check(commands::check::CheckArgs),
    /// Copy the sysfs files vfio-p2p reads into a directory that `--sysfs-root DIR` reads back.
    Snapshot(commands::snapshot::SnapshotArgs),
    /// Receive guest agents' reports over vsock, judge them against the plans, store the verdicts.
    Collect(commands::collect::CollectArgs),
    /// The latest verdict of every domain (table, JSON, Prometheus text).
    Verdicts(commands::verdicts::VerdictsArgs),
    /// Run QEMU with the planned cliques added to its vfio-pci devices (also as `qemu-system-*`).
    QemuWrap(commands::qemu_wrap::QemuWrapArgs),
    /// KubeVirt hook sidecar: `kubevirt on-define-domain --vmi JSON --domain XML`.
    Kubevirt(commands::kubevirt::KubevirtArgs),
}
