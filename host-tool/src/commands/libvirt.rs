//! `vfio-p2p libvirt patch`: adds aliases and clique overrides to an existing domain.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Subcommand};
use pci_config::Bdf;

use crate::cli::GlobalArgs;
use crate::context::{Context, Needs, PlanningArgs};
use vfio_p2p_decide::vm::libvirt::patch_window;
use vfio_p2p_emit::data::write_output;
use vfio_p2p_emit::libvirt_patch;
use vfio_p2p_files::{read_input_file, read_input_stream};
use vfio_p2p_model::domain::DomainFacts;
use vfio_p2p_model::vmm::LibvirtVersion;
use vfio_p2p_read::domain_xml::{parse_domain_xml_bytes, MAX_DOMAIN_XML_BYTES};

#[derive(Debug, Args)]
pub struct LibvirtArgs {
    #[command(subcommand)]
    pub command: LibvirtCommand,
}

#[derive(Debug, Subcommand)]
pub enum LibvirtCommand {
    /// Add hostdev aliases, the cliques' <qemu:override> and the GPUs' 64-bit MMIO window (<pcihole64>; on an Arm virt machine -machine highmem-mmio-size=) to a domain XML (`virsh dumpxml --inactive`).
    // the shared planning options, as they read for a domain (there is no vm.yaml here)
    #[command(
        mut_arg("gpus", |a| a.help("The domain's GPUs to give cliques (default: every GPU hostdev of the domain)")),
        mut_arg("p2p_level", |a| a.help("Worst host path allowed inside a clique: pix, pxb (NCCL's default), phb, node, sys (default: the host config's `p2p_level`, else pxb)"))
    )]
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

/// The domain XML from FILE or stdin (`-` or none): its text and what it says.
fn read_domain(path: Option<&Path>) -> anyhow::Result<(String, DomainFacts)> {
    let bytes = match path {
        Some(p) if p.as_os_str() != "-" => read_input_file(p, MAX_DOMAIN_XML_BYTES, "domain XML")?,
        _ => read_input_stream(
            std::io::stdin().lock(),
            MAX_DOMAIN_XML_BYTES,
            "domain XML",
            "<stdin>",
        )?,
    };
    let name = match path {
        Some(p) if p.as_os_str() != "-" => p.display().to_string(),
        _ => "<stdin>".to_string(),
    };
    let facts = parse_domain_xml_bytes(&bytes, &name)?;
    // parse_domain_xml_bytes checked that it is UTF-8.
    Ok((String::from_utf8(bytes).unwrap_or_default(), facts))
}

fn patch(global: &GlobalArgs, args: PatchArgs) -> anyhow::Result<ExitCode> {
    let (xml, scan) = read_domain(args.domain.as_deref())?;
    let source_name = scan.source_name.clone();
    let needs = Needs {
        libvirt_version: Some(args.libvirt_version),
        ..Needs::nvlink(&args.planning.options.nvlink)
    };
    let ctx = Context::load(global, &args.planning.options.host, &needs)?;
    let topo = &ctx.topo;
    // The VM's GPUs are its PCI hostdevs that are GPUs on this host (or the --gpus subset).
    let mut gpus: Vec<Bdf> = Vec::new();
    for h in &scan.hostdevs {
        match topo.device(&h.bdf) {
            Some(d) if d.is_gpu() => {
                if args.planning.gpus.is_empty() || args.planning.gpus.contains(&h.bdf) {
                    gpus.push(h.bdf)
                }
            }
            Some(_) => {}
            None => tracing::warn!(
                "{source_name}: hostdev {} is not a PCI device of {}; left alone",
                h.bdf,
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
    // The window holds every GPU hostdev's BARs (not only the --gpus ones), in the form the
    // domain's machine takes; QEMU's default is left alone where it fits.
    let passed: Vec<&vfio_p2p_model::Device> = scan
        .hostdevs
        .iter()
        .filter_map(|h| topo.device(&h.bdf).filter(|d| d.is_gpu()))
        .collect();
    let window = patch_window(&scan, &passed);
    let version = ctx.libvirt_version().unwrap_or_else(|why| {
        let v = vfio_p2p_model::vmm::OVERRIDE_SINCE;
        tracing::warn!("{why}: libvirt's version is unknown; patching for libvirt {v} (<qemu:override>); pass --libvirt-version X.Y for yours");
        v
    });
    let patched = libvirt_patch::apply(&xml, &scan, &cliques, window, version)?;
    for w in &patched.warnings {
        tracing::warn!("{source_name}: {w}");
    }
    write_output(args.output.as_deref(), &patched.xml)?;
    Ok(ExitCode::SUCCESS)
}
