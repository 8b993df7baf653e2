//! `vfio-p2p libvirt patch`: adds aliases and clique overrides to an existing domain.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Args, Subcommand};
use pci_config::Bdf;

use crate::cli::GlobalArgs;
use crate::context::{libvirt_version, Context, PlanningArgs};
use crate::emit::data::write_output;
use crate::emit::libvirt::LibvirtVersion;
use crate::emit::libvirt_patch;

#[derive(Debug, Args)]
pub struct LibvirtArgs {
    #[command(subcommand)]
    pub command: LibvirtCommand,
}

#[derive(Debug, Subcommand)]
pub enum LibvirtCommand {
    /// Add hostdev aliases and the cliques' <qemu:override> to a domain XML (`virsh dumpxml --inactive`).
    Patch(PatchArgs),
}

#[derive(Debug, Args)]
pub struct PatchArgs {
    /// Domain XML file; `-` or nothing reads stdin.
    #[arg(value_name = "DOMAIN.xml")]
    pub domain: Option<PathBuf>,
    #[command(flatten)]
    pub planning: PlanningArgs,
    /// libvirt version to target (default: `virsh --version`); below 8.2 cliques use `-set`.
    #[arg(long, value_name = "X.Y")]
    pub libvirt_version: Option<LibvirtVersion>,
    /// Write to this file instead of stdout (may be the input file).
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
}

pub fn run(global: &GlobalArgs, args: LibvirtArgs) -> anyhow::Result<ExitCode> {
    match args.command {
        LibvirtCommand::Patch(a) => patch(global, a),
    }
}

fn patch(global: &GlobalArgs, args: PatchArgs) -> anyhow::Result<ExitCode> {
    let (xml, source_name) = match args.domain.as_deref() {
        Some(p) if p.as_os_str() != "-" => (
            std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?,
            p.display().to_string(),
        ),
        _ => {
            let mut s = String::new();
            std::io::stdin()
                .read_to_string(&mut s)
                .context("reading the domain XML from stdin")?;
            (s, "<stdin>".to_string())
        }
    };
    let scan = libvirt_patch::scan(&xml, &source_name)?;
    let ctx = Context::load(
        global,
        &args.planning.options.host,
        &args.planning.options.nvlink,
    )?;
    let topo = &ctx.topo;
    // The VM's GPUs are its PCI hostdevs that are GPUs on this host (or the --gpus subset).
    let mut gpus: Vec<Bdf> = Vec::new();
    for h in &scan.hostdevs {
        match topo.device(&h.host) {
            Some(d) if d.is_gpu() => {
                if args.planning.gpus.is_empty() || args.planning.gpus.contains(&h.host) {
                    gpus.push(h.host)
                }
            }
            Some(_) => {}
            None => tracing::warn!(
                "{source_name}: hostdev {} is not a PCI device of {}; left alone",
                h.host,
                topo.source
            ),
        }
    }
    for g in &args.planning.gpus {
        if !gpus.contains(g) {
            anyhow::bail!(
                "{source_name}: --gpus names {g}, which is not a GPU <hostdev> of the domain; add it with `virsh attach-device` or drop it"
            );
        }
    }
    let cliques: BTreeMap<Bdf, Option<u8>> = if gpus.is_empty() {
        tracing::warn!("{source_name}: no GPU hostdev of this host in the domain; nothing to do");
        BTreeMap::new()
    } else {
        ctx.plan(&gpus, &ctx.plan_options(&args.planning.options, None))?
            .assignments
    };
    let version = libvirt_version(args.libvirt_version);
    let patched = libvirt_patch::apply(&xml, &scan, &cliques, version);
    for w in &patched.warnings {
        tracing::warn!("{source_name}: {w}");
    }
    write_output(args.output.as_deref(), &patched.xml)?;
    Ok(ExitCode::SUCCESS)
}
