//! `vfio-p2p check`: host preflight for GPU pass-through with P2P.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use pci_config::Bdf;

use crate::cli::GlobalArgs;
use crate::config::vm::IommuBackend;
use crate::context::{Context, PlanOptionArgs};
use crate::decide::check::{self, ConfigSyntax, Vmm, VmmFacts};
use crate::decide::plan::plan;
use crate::emit;
use crate::emit::data::DataFormat;
use crate::host_probe;
use crate::model::domain::DomainFacts;
use crate::model::fabric::FmConfigFile;
use crate::model::DeviceKind;
use crate::read::domain_xml::read_domain_xml_file;
use crate::read::incus::read_incus_config_file;
use crate::read::proxmox_conf::read_proxmox_conf_file;
use crate::read::vmm;

/// How the VM definition checked gets the planned cliques: a Proxmox VM's config the
/// lines of `gen proxmox` for its GPUs, a libvirt domain `libvirt patch`.
fn clique_fix(args: &CheckArgs, domain: &DomainFacts, gpus: &[Bdf]) -> String {
    let list = || {
        gpus.iter()
            .map(Bdf::to_string)
            .collect::<Vec<_>>()
            .join(",")
    };
    if args.proxmox_conf.is_some() {
        return format!(
            "write the hostpciN and args lines of `vfio-p2p gen proxmox --gpus {}` into the VM's config (qm stop, then qm start)",
            list()
        );
    }
    if args.incus_config.is_some() {
        return format!(
            "apply `vfio-p2p gen incus --gpus {}` to the instance (`incus profile edit` of a profile it uses, or its `incus config device add` lines), then incus restart",
            list()
        );
    }
    match &args.domain_xml {
        Some(file) => {
            let file = file.display();
            let define = match &domain.name {
                Some(_) => format!(" && virsh define {file}"),
                None => String::new(),
            };
            format!("run `vfio-p2p libvirt patch {file} -o {file}{define}`")
        }
        None => check::patch_fix(domain),
    }
}

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// The VM's GPUs (default: every GPU on the host).
    #[arg(long, value_delimiter = ',', value_name = "BDF,BDF,…")]
    pub gpus: Vec<Bdf>,
    #[command(flatten)]
    pub plan: PlanOptionArgs,
    /// libvirt domain XML of the VM (hidden hypervisor, 64-bit MMIO window).
    #[arg(long, value_name = "FILE")]
    pub domain_xml: Option<PathBuf>,
    /// Proxmox VE VM config (/etc/pve/qemu-server/VMID.conf): its hostpci GPUs, their
    /// cliques in `args:`, a hidden hypervisor, the 64-bit MMIO window.
    #[arg(long, value_name = "FILE", conflicts_with = "domain_xml")]
    pub proxmox_conf: Option<PathBuf>,
    /// Incus instance config (`incus config show --expanded INSTANCE`): its GPU and PCI
    /// devices, their `nvidia.clique`, a hidden hypervisor or 64-bit window in `raw.qemu`.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["domain_xml", "proxmox_conf"])]
    pub incus_config: Option<PathBuf>,
    /// QEMU binary that will run the VM; its `--version` decides clique placement.
    #[arg(long, value_name = "PATH")]
    pub qemu: Option<PathBuf>,
    /// The VM's QEMU command line, to inspect for `-cpu …,kvm=off` and `pci-hole64-size=`.
    #[arg(long, value_name = "STRING", allow_hyphen_values = true)]
    pub qemu_args: Option<String>,
    /// The IOMMU backend the VM will use: checks the host offers it and, with iommufd,
    /// that P2P cliques survive it (peer BARs mapped as dma-bufs).
    #[arg(long, value_enum, value_name = "BACKEND")]
    pub iommu_backend: Option<IommuBackend>,
    /// The VMM that will run the VM.
    #[arg(long, value_enum, default_value_t)]
    pub vmm: Vmm,
    /// Also open each GPU through VFIO. WARNING: opening a device resets it.
    #[arg(long)]
    pub deep: bool,
    #[arg(long, value_enum, default_value_t)]
    pub format: DataFormat,
}

/// How the VM will be started, from `--qemu`, `--domain-xml` and `--qemu-args`.
fn vmm_facts(args: &CheckArgs, domain: Option<&DomainFacts>) -> VmmFacts {
    let mut facts = VmmFacts {
        vmm: args.vmm,
        qemu_version: args.qemu.as_deref().map(vmm::qemu_version_of),
        iommu_backend: args.iommu_backend,
        ..VmmFacts::default()
    };
    if let Some(d) = domain {
        let file = &d.source_name;
        facts
            .hidden_hypervisor
            .extend(d.hidden_hypervisor.iter().map(|h| format!("{file}: {h}")));
        facts.hole64 = d
            .hole64
            .as_ref()
            .map(|h| (h.bytes, format!("{file} ({})", h.source)));
        facts.vm_config = Some(if args.proxmox_conf.is_some() {
            format!("the Proxmox config {file}")
        } else if args.incus_config.is_some() {
            format!("the Incus instance config {file}")
        } else {
            format!("the domain {file}")
        });
        facts.syntax = if args.proxmox_conf.is_some() {
            ConfigSyntax::Proxmox
        } else {
            ConfigSyntax::Libvirt(file.clone())
        };
    }
    if let Some(a) = &args.qemu_args {
        facts.hidden_hypervisor.extend(vmm::hidden_in_qemu_args(a));
        if let Some(h) = vmm::hole64_in_qemu_args(a) {
            facts.hole64 = Some((h, "--qemu-args".into()));
        }
        facts.vm_config.get_or_insert_with(|| "--qemu-args".into());
    }
    facts
}

/// The GPUs to check: `--gpus`, else the domain's GPU hostdevs, else every GPU.
fn selected_gpus(ctx: &Context, args: &CheckArgs, domain: Option<&DomainFacts>) -> Vec<Bdf> {
    match domain {
        Some(d) if args.gpus.is_empty() => d
            .hostdevs
            .iter()
            .map(|h| h.bdf)
            .filter(|b| ctx.topo.device(b).is_some_and(|d| d.is_gpu()))
            .collect(),
        _ => ctx.gpus(&args.gpus),
    }
}

/// The domain's hostdevs that are NICs here: passed devices like the GPUs, never in a clique.
fn domain_nics(topo: &crate::model::Topology) -> impl Fn(&DomainFacts) -> Vec<Bdf> + '_ {
    move |d| {
        d.hostdevs
            .iter()
            .map(|h| h.bdf)
            .filter(|b| topo.device(b).is_some_and(|d| d.kind == DeviceKind::Nic))
            .collect()
    }
}

/// What /dev says about the IOMMU groups of `devices` (and KVM, VFIO): probed on a live
/// host, "not probed" for an example or a snapshot file.
fn probe_host(
    global: &GlobalArgs,
    topo: &crate::model::Topology,
    devices: &[Bdf],
    deep: bool,
) -> check::HostFacts {
    if global.example.is_some() {
        host_probe::not_probed("an embedded example has no live host", topo, devices)
    } else if global.sysfs_root.is_file() {
        host_probe::not_probed("a snapshot file has no /dev", topo, devices)
    } else {
        host_probe::gather(&global.sysfs_root, topo, devices, deep)
    }
}

/// Fabric Manager's config file, read under the sysfs root once (nothing to read on an
/// example or a snapshot file), only when the board has a fabric model.
fn probe_fm_config(global: &GlobalArgs, ctx: &Context) -> anyhow::Result<FmConfigFile> {
    Ok(if ctx.fabric.model.is_none() {
        FmConfigFile::NotProbed("no fabric model".into())
    } else if global.example.is_some() {
        FmConfigFile::NotProbed("an embedded example has no files".into())
    } else if global.sysfs_root.is_file() {
        FmConfigFile::NotProbed("a snapshot file has no FM config".into())
    } else {
        crate::read::fm_config::read(&global.sysfs_root)?
    })
}

pub fn run(global: &GlobalArgs, args: CheckArgs) -> anyhow::Result<ExitCode> {
    let ctx = Context::load(global, &args.plan.host, &args.plan.nvlink)?;
    ctx.require_gpus("check")?;
    let topo = &ctx.topo;
    let mut domain = args
        .domain_xml
        .as_deref()
        .map(read_domain_xml_file)
        .transpose()?;
    if let Some(path) = &args.proxmox_conf {
        let conf = read_proxmox_conf_file(path)?;
        for w in &conf.warnings {
            tracing::warn!("{w}");
        }
        domain = Some(conf.facts);
    }
    if let Some(path) = &args.incus_config {
        let conf = read_incus_config_file(path)?;
        for w in &conf.warnings {
            tracing::warn!("{path}: {w}", path = path.display());
        }
        domain = Some(conf.facts);
    }
    let gpus = selected_gpus(&ctx, &args, domain.as_ref());
    for g in &gpus {
        anyhow::ensure!(
            topo.device(g).is_some_and(|d| d.is_gpu()),
            "{g}: not a GPU on {}; `vfio-p2p topo` lists them",
            topo.source
        );
    }
    if args.deep {
        tracing::warn!("--deep opens every selected GPU through VFIO, which resets it");
    }
    let nics = domain.as_ref().map(domain_nics(topo)).unwrap_or_default();
    let mut host = probe_host(global, topo, &gpus, args.deep);
    if !nics.is_empty() {
        host.groups
            .extend(probe_host(global, topo, &nics, false).groups);
    }
    let vmm = vmm_facts(&args, domain.as_ref());
    let fm_config = probe_fm_config(global, &ctx)?;
    let p = plan(topo, &gpus, &ctx.plan_options(&args.plan, None));
    let mut report = check::run_checks(topo, &gpus, &host, &vmm, &p);
    report.extend(check::nic_checks(topo, &gpus, &nics, &host));
    let reserved = ctx.host.reserved.iter().copied().collect();
    report.extend(check::fabric_checks(
        topo,
        &gpus,
        &ctx.fabric,
        &fm_config,
        &reserved,
    ));
    if let Some(d) = &domain {
        // the cliques the definition sets against the plan, as the hook checks them
        let options = ctx.plan_options(&args.plan, None);
        let fix = clique_fix(&args, d, &gpus);
        report.extend(check::clique_checks(topo, d, &options, &fix));
    }
    match emit::data::to_text(&report, args.format)? {
        Some(t) => print!("{t}"),
        None => print!("{}", emit::check::table(&report)),
    }
    Ok(ExitCode::from(report.exit_code()))
}
