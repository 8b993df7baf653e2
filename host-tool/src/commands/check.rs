//! `vfio-p2p check`: host preflight for GPU pass-through with P2P.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use pci_config::Bdf;

use crate::cli::GlobalArgs;
use crate::context::{Context, Needs, PlanOptionArgs};
use vfio_p2p_config::vm::IommuBackend;
use vfio_p2p_decide::check::{self, ConfigSyntax, StartBinding, Vmm, VmmFacts};
use vfio_p2p_decide::clique_plan::plan;
use vfio_p2p_emit::data::DataFormat;
use vfio_p2p_model::domain::DomainFacts;
use vfio_p2p_model::fabric_state::{FmConfigFile, NvlsmProbe};
use vfio_p2p_model::DeviceKind;
use vfio_p2p_read::domain_xml::read_domain_xml_file;
use vfio_p2p_read::incus::read_incus_config_file;
use vfio_p2p_read::proxmox_conf::read_proxmox_conf_file;
use vfio_p2p_read::qemu_argv::read_qemu_args_text;

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
    /// The VM's RAM in GiB: checks that it and the GPUs' 64-bit MMIO window fit the guest's
    /// physical address space (the host's width, as OVMF places the window).
    /// (At most 2^34-1 GiB: the bytes must fit 64 bits.)
    #[arg(long, value_name = "GIB", value_parser = clap::value_parser!(u64).range(1..=(u64::MAX >> 30)))]
    pub memory_gib: Option<u64>,
    /// The VMM that will run the VM.
    #[arg(long, value_enum, default_value_t)]
    pub vmm: Vmm,
    /// The VM reports over vsock (vm.yaml `verify: vsock`): checks the host's vhost_vsock.
    #[arg(long)]
    pub vsock: bool,
    /// Also open each GPU through VFIO. WARNING: opening a device resets it.
    #[arg(long)]
    pub deep: bool,
    #[arg(long, value_enum, default_value_t)]
    pub format: DataFormat,
}

/// How the VM will be started, from `--qemu` (its version probed in the context build),
/// `--domain-xml` and `--qemu-args`.
fn vmm_facts(ctx: &Context, args: &CheckArgs, domain: Option<&DomainFacts>) -> VmmFacts {
    let mut facts = VmmFacts {
        vmm: args.vmm,
        qemu_version: ctx.probes.qemu_version.clone(),
        iommu_backend: args.iommu_backend,
        ram: args.memory_gib.map(|g| g << 30),
        ..VmmFacts::default()
    };
    if let Some(d) = domain {
        let file = &d.source_name;
        facts
            .hidden_hypervisor
            .extend(d.hidden_hypervisor.iter().map(|h| format!("{file}: {h}")));
        facts.arm_virt = d.is_arm_virt();
        facts.hole64 = (d.mmio_window()).map(|h| (h.bytes, format!("{file} ({})", h.source)));
        facts.vm_config = Some(if args.proxmox_conf.is_some() {
            format!("the Proxmox config {file}")
        } else if args.incus_config.is_some() {
            format!("the Incus instance config {file}")
        } else {
            format!("the domain {file}")
        });
        facts.bound_at_start = start_binding(ctx, args, d);
        facts.syntax = if args.proxmox_conf.is_some() {
            ConfigSyntax::Proxmox
        } else {
            ConfigSyntax::Libvirt(file.clone())
        };
    }
    if let Some(a) = &args.qemu_args {
        let argv = read_qemu_args_text(a);
        facts.hidden_hypervisor.extend(argv.hidden_hypervisor());
        facts.arm_virt |= argv.is_arm_virt();
        if let Some(h) = argv.mmio_window(facts.arm_virt) {
            facts.hole64 = Some((h, "--qemu-args".into()));
        }
        facts.vm_config.get_or_insert_with(|| "--qemu-args".into());
    }
    facts
}

/// The devices whoever starts the VM binds to vfio-pci: the managed hostdevs of a libvirt
/// domain, every PCI device of a Proxmox or Incus VM (their readers mark them managed);
/// Incus also takes the other functions of a GPU's slot in its IOMMU group (the audio
/// function: emit/incus.rs names only the GPU for that reason).
fn start_binding(ctx: &Context, args: &CheckArgs, domain: &DomainFacts) -> StartBinding {
    let by = if args.proxmox_conf.is_some() {
        "Proxmox (qm start)"
    } else if args.incus_config.is_some() {
        "Incus (incus start)"
    } else {
        "libvirt (managed='yes')"
    };
    let mut devices: Vec<Bdf> = domain
        .hostdevs
        .iter()
        .filter(|h| h.managed)
        .map(|h| h.bdf)
        .collect();
    if args.incus_config.is_some() {
        let slot_mates = devices.iter().flat_map(|d| {
            let group = ctx.topo.group_members(d);
            ctx.topo
                .sibling_functions(d)
                .into_iter()
                .map(|s| s.bdf)
                .filter(move |s| group.contains(s))
        });
        devices = devices.iter().copied().chain(slot_mates).collect();
    }
    StartBinding {
        by: by.into(),
        devices,
    }
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
fn domain_nics(topo: &vfio_p2p_model::Topology) -> impl Fn(&DomainFacts) -> Vec<Bdf> + '_ {
    move |d| {
        d.hostdevs
            .iter()
            .map(|h| h.bdf)
            .filter(|b| topo.device(b).is_some_and(|d| d.kind == DeviceKind::Nic))
            .collect()
    }
}

fn not_asked() -> NvlsmProbe {
    NvlsmProbe::NotProbed("not asked".into())
}

pub fn run(global: &GlobalArgs, args: CheckArgs) -> anyhow::Result<ExitCode> {
    let needs = Needs {
        qemu_version: args.qemu.clone(),
        fm_config: true,
        // the Grace rows say what the installed libvirt writes
        libvirt_version: Some(None),
        ..Needs::nvlink(&args.plan.nvlink)
    };
    let ctx = Context::load(global, &args.plan.host, &needs)?;
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
    let mut host = ctx.probe_host(&gpus, args.deep);
    if !nics.is_empty() {
        host.groups.extend(ctx.probe_host(&nics, false).groups);
    }
    let vsock_module = args.vsock.then(|| ctx.probe_vsock_module());
    let vmm = vmm_facts(&ctx, &args, domain.as_ref());
    let fm_config = ctx
        .probes
        .fm_config
        .clone()
        .unwrap_or_else(|| FmConfigFile::NotProbed("not asked".into()));
    let p = plan(topo, &gpus, &ctx.plan_options(&args.plan, None));
    let mut report = check::run_checks(topo, &gpus, &host, &vmm, &p);
    report.extend(Vec::from_iter(
        vsock_module.as_ref().map(check::check_vsock_module),
    ));
    report.extend(check::nic_checks(
        topo,
        &gpus,
        &nics,
        &host,
        &vmm.bound_at_start,
    ));
    report.extend(check::grace_checks(
        topo,
        &gpus,
        &host,
        &vmm,
        ctx.probes.libvirt_version.as_ref(),
    ));
    report.extend(check::reset_checks(topo, &gpus, &nics, ctx.host.reset));
    let reserved = ctx.host.reserved.iter().copied().collect();
    report.extend(check::fabric_checks(
        topo,
        &gpus,
        &ctx.fabric,
        &fm_config,
        &reserved,
    ));
    let nvlsm = ctx.probes.nvlsm.clone().unwrap_or_else(not_asked);
    report.extend(Vec::from_iter(check::nvlsm_checks(
        topo,
        &gpus,
        ctx.fabric.model,
        &nvlsm,
    )));
    if let Some(d) = &domain {
        // the cliques the definition sets against the plan, as the hook checks them
        let options = ctx.plan_options(&args.plan, None);
        let fix = clique_fix(&args, d, &gpus);
        report.extend(check::clique_checks(topo, d, &options, &fix));
    }
    match vfio_p2p_emit::data::to_text(&report, args.format)? {
        Some(t) => print!("{t}"),
        None => print!("{}", vfio_p2p_emit::check::table(&report)),
    }
    Ok(ExitCode::from(report.exit_code()))
}
