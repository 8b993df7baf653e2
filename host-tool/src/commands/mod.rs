//! The command line (`Cli`: the global options and one subcommand per job) and the glue
//! between it and the stages: each command reads, models, decides, emits.

pub mod bind;
pub mod check;
pub mod collect;
pub mod fabric;
pub mod gen;
pub mod hook;
pub mod kubevirt;
pub mod libvirt;
pub mod place;
pub mod plan;
pub mod qemu_wrap;
pub mod snapshot;
pub mod topo;
pub mod verdicts;

use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

use crate::cli::GlobalArgs;
use vfio_p2p_read::synth;

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

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Show the PCIe/NUMA/IOMMU topology and the P2P path between every pair of GPUs.
    Topo(topo::TopoArgs),
    /// Choose GPUs for many VMs (best P2P paths, one NUMA node, whole IOMMU groups) and plan their cliques.
    Place(place::PlaceArgs),
    /// Group a VM's GPUs into GPUDirect P2P cliques and explain every pair's path.
    Plan(plan::PlanArgs),
    /// Bind GPUs (and their other functions) to vfio-pci, transactionally; recorded for unbind.
    Bind(bind::BindArgs),
    /// Give devices back to the driver they had before bind (or the host's default).
    Unbind(bind::UnbindArgs),
    /// The libvirt qemu hook: `hook install`, and `hook run` which libvirt calls.
    Hook(hook::HookArgs),
    /// Fabric Manager's partitions on NVSwitch boards: list, activate, deactivate, resync.
    Fabric(fabric::FabricArgs),
    /// Write a VM definition (QEMU, libvirt, Cloud Hypervisor) or the guest's NCCL topology from the plan.
    Gen(gen::GenArgs),
    /// Edit libvirt domains.
    Libvirt(libvirt::LibvirtArgs),
    /// Preflight the host: everything that stops pass-through or P2P, with the fix (exit 0 pass, 1 warn, 2 fail).
    Check(check::CheckArgs),
    /// Copy the sysfs files vfio-p2p reads into a directory that `--sysfs-root DIR` reads back.
    Snapshot(snapshot::SnapshotArgs),
    /// Receive guest agents' reports over vsock, judge them against the plans, store the verdicts.
    Collect(collect::CollectArgs),
    /// The latest verdict of every domain (table, JSON, Prometheus text).
    Verdicts(verdicts::VerdictsArgs),
    /// Run QEMU with the planned cliques added to its vfio-pci devices (also as `qemu-system-*`).
    QemuWrap(qemu_wrap::QemuWrapArgs),
    /// KubeVirt hook sidecar: `kubevirt on-define-domain --vmi JSON --domain XML`.
    Kubevirt(kubevirt::KubevirtArgs),
}

pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    if cli.global.example.as_deref() == Some("list") {
        print!("{}", synth::example_list());
        return Ok(ExitCode::SUCCESS);
    }
    let Some(command) = cli.command else {
        anyhow::bail!("no command given; see vfio-p2p --help (start with: vfio-p2p topo)");
    };
    match command {
        Command::Topo(a) => topo::run(&cli.global, a),
        Command::Place(a) => place::run(&cli.global, a),
        Command::Plan(a) => plan::run(&cli.global, a),
        Command::Bind(a) => bind::run_bind(&cli.global, a),
        Command::Unbind(a) => bind::run_unbind(&cli.global, a),
        Command::Hook(a) => hook::run(&cli.global, a),
        Command::Fabric(a) => fabric::run(&cli.global, a),
        Command::Gen(a) => gen::run(&cli.global, a),
        Command::Libvirt(a) => libvirt::run(&cli.global, a),
        Command::Check(a) => check::run(&cli.global, a),
        Command::Snapshot(a) => snapshot::run(&cli.global, a),
        Command::Collect(a) => collect::run(&cli.global, a),
        Command::Verdicts(a) => verdicts::run(&cli.global, a),
        Command::QemuWrap(a) => qemu_wrap::run(&cli.global, a),
        Command::Kubevirt(a) => kubevirt::run(&cli.global, a),
    }
}
