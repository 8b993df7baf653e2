//! `vfio-p2p gen qemu|libvirt|cloud-hypervisor|nccl|proxmox|incus`: a VM definition from the plan.

mod grace;
mod vars_copy;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context as _};
use clap::{Args, ValueEnum};
use vfio_p2p_contract::ReportChannel;

use crate::cli::GlobalArgs;
use crate::context::source::HostSource;
use crate::context::{Context, Needs, PlanningArgs};
use vfio_p2p_collector::store::Store;
use vfio_p2p_config::vm::GuestTopology;
use vfio_p2p_config::vm::{IommuBackend, VmConfig};
use vfio_p2p_contract::Expectation;
use vfio_p2p_decide::address_space::{self, GuestAddressSpace};
use vfio_p2p_decide::clique_offset;
use vfio_p2p_decide::cloud_hypervisor as ch_decide;
use vfio_p2p_decide::expectation;
use vfio_p2p_decide::fleet_verdict::DomainPlan;
use vfio_p2p_decide::guest_layout::{self, LayoutOptions};
use vfio_p2p_decide::guest_paths;
use vfio_p2p_decide::iommu_backend;
use vfio_p2p_decide::mmio;
use vfio_p2p_decide::proxmox as proxmox_decide;
use vfio_p2p_decide::vm_boot::{self, BootVmm};
use vfio_p2p_decide::vm_refusal::Refusal;
use vfio_p2p_emit::data::write_output;
use vfio_p2p_emit::incus::{self, CliqueForm, IncusOutput};
use vfio_p2p_emit::libvirt;
use vfio_p2p_emit::qemu::{self, ArgvFormat};
use vfio_p2p_emit::vm::{ExpectationSource, VmDefinition};
use vfio_p2p_emit::{cloud_hypervisor, nccl, proxmox};
use vfio_p2p_model::vmm::{LibvirtVersion, OVERRIDE_SINCE};
use vfio_p2p_model::NicRef;
use vfio_p2p_read::incus::{self as incus_read, IncusServer};

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
    /// Proxmox VE `hostpciN:` and `args:` lines for /etc/pve/qemu-server/VMID.conf.
    Proxmox,
    /// An Incus profile (GPU devices with `nvidia.clique`, NICs, NUMA nodes), or commands.
    Incus,
}

#[derive(Debug, Args)]
pub struct GenArgs {
    #[arg(value_enum)]
    pub target: GenTarget,
    /// VM description (name, GPUs, p2p level, guest topology, memory, firmware, disks, network,
    /// console); examples in
    /// /usr/share/doc/vfio-p2p/examples/ (configs/ in the source).
    #[arg(long, value_name = "vm.yaml")]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    pub planning: PlanningArgs,
    /// NICs or SR-IOV VFs to pass with the GPUs: BDFs, interface names (ens1f0np0) or RDMA
    /// device names (mlx5_0); replaces the config's `nics:`. Placed where they sit on the host.
    #[arg(long, value_delimiter = ',', value_name = "NIC,...")]
    pub nics: Vec<NicRef>,
    /// Guest PCIe tree: mirror the host (default) or one root port per GPU.
    #[arg(long, value_enum)]
    pub guest_topology: Option<GuestTopology>,
    /// IOMMU backend: legacy (VFIO groups), iommufd (/dev/iommu + VFIO cdevs) or auto
    /// (iommufd where this host offers it and P2P survives it); overrides `iommu_backend:`.
    #[arg(long, value_enum, value_name = "BACKEND")]
    pub iommu_backend: Option<IommuBackend>,
    /// QEMU binary that will run the VM (default: qemu-system-x86_64 on PATH); `auto` asks
    /// its version whether it maps peer BARs under iommufd.
    #[arg(long, value_name = "PATH")]
    pub qemu: Option<PathBuf>,
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
    /// incus only: a profile for `incus profile edit` or `incus config` commands.
    #[arg(long, value_enum, value_name = "FORM")]
    pub incus_output: Option<IncusOutput>,
    /// incus only: the server's `incus query /1.0` output, saved (default: ask `incus`);
    /// without API extension gpu_physical_clique the cliques go in `raw.qemu.conf`.
    #[arg(long, value_name = "FILE")]
    pub incus_server: Option<PathBuf>,
    /// Write to this file instead of stdout.
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// With `verify: vsock`: register the VM's CID and expectation here for `vfio-p2p collect`
    /// (its default state directory is /var/lib/vfio-p2p).
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
}

/// `verify: vsock`: the expectation names the report port; with `--state-dir`, the plan
/// that tells the collector which domain owns the CID and what it should see.
fn report_plan(
    config: &VmConfig,
    e: &mut Expectation,
    state_dir: Option<&Path>,
) -> anyhow::Result<Option<DomainPlan>> {
    let Some(r) = config.report else {
        if state_dir.is_some() {
            bail!("--state-dir registers VMs for `vfio-p2p collect`: set 'verify: vsock' and vsock_cid in the VM's config");
        }
        return Ok(None);
    };
    e.report = Some(ReportChannel { vsock_port: r.port });
    if state_dir.is_none() {
        tracing::warn!("verify: vsock without --state-dir: the collector drops {}'s reports until its plan is registered (gen ... --state-dir /var/lib/vfio-p2p)", config.name);
    }
    Ok(state_dir.map(|_| DomainPlan {
        domain: config.name.clone(),
        cid: r.cid,
        expectation: e.clone(),
    }))
}

/// What `gen` asks the context build for: `auto` needs this host's iommufd support
/// (`/dev/iommu`, VFIO cdevs, kernel) and the version of the QEMU that will run the VM, a
/// libvirt domain the libvirt version to target.
fn needs(args: &GenArgs, config: &VmConfig) -> Needs {
    let auto = config.iommu_backend == IommuBackend::Auto;
    // a Grace guest's pieces depend on the QEMU that runs it: asked when --qemu names it
    let named = args.qemu.is_some() && matches!(args.target, GenTarget::Qemu | GenTarget::Libvirt);
    Needs {
        iommufd: auto,
        qemu_version: (auto || named).then(|| {
            args.qemu
                .clone()
                .unwrap_or_else(|| PathBuf::from(qemu::QEMU_BINARY))
        }),
        libvirt_version: (args.target == GenTarget::Libvirt).then_some(args.libvirt_version),
        ..Needs::nvlink(&args.planning.options.nvlink)
    }
}

/// `auto` resolved against what the context build probed; an example or a snapshot has
/// no host, so it gets legacy.
fn iommu_backend(ctx: &Context, requested: IommuBackend, has_cliques: bool) -> IommuBackend {
    let (Some(iommu), IommuBackend::Auto) = (&ctx.probes.iommu, requested) else {
        return requested;
    };
    let version = ctx.probes.qemu_version.clone();
    let offered = iommu_backend::iommufd_offered(iommu);
    let bars = iommu_backend::bar_mapping(iommu, version.as_ref());
    let (backend, why) = iommu_backend::resolve(requested, &offered, &bars, has_cliques);
    eprintln!("vfio-p2p: iommu backend auto: {backend} ({why})");
    backend
}

/// iommufd asked for outright with cliques: whether peer BARs map is the host's and QEMU's
/// to say, which `check` looks at.
fn warn_iommufd_cliques(backend: IommuBackend, requested: IommuBackend, has_cliques: bool) {
    if backend == IommuBackend::Iommufd && requested == IommuBackend::Iommufd && has_cliques {
        tracing::warn!(
            "iommufd with P2P cliques: peer writes fault unless peer BARs are mapped as dma-bufs (Linux >= {}, QEMU >= {}); `vfio-p2p check --iommu-backend iommufd --qemu PATH` tells for this host",
            vfio_p2p_model::vmm::KernelVersion::BAR_DMABUF,
            vfio_p2p_model::vmm::QemuVersion::BAR_DMABUF
        );
    }
}

/// Stores `plan` for the collector, refusing a CID another domain holds.
fn register(plan: &DomainPlan, dir: &Path) -> anyhow::Result<()> {
    let store = Store::new(dir);
    if let Some(other) = store.plans_by_cid()?.0.remove(&plan.cid) {
        if other.domain != plan.domain {
            bail!(
                "vsock_cid {} is already {}'s in {}: give {} another CID",
                plan.cid,
                other.domain,
                dir.display(),
                plan.domain
            );
        }
    }
    let path = store.put_plan(plan)?;
    eprintln!(
        "vfio-p2p: registered {} (CID {}) for the collector in {}",
        plan.domain,
        plan.cid,
        path.display()
    );
    Ok(())
}

/// The VM's configuration: vm.yaml (or the defaults) with the command line's overrides, and
/// the flags that only some targets take refused elsewhere.
fn vm_config(args: &GenArgs) -> anyhow::Result<VmConfig> {
    let mut config = match &args.config {
        Some(p) => VmConfig::load(p)?,
        None => VmConfig::default(),
    };
    if let Some(n) = &args.name {
        // the same rule as vm.yaml's `name:`: it goes into every config line
        if let Some(e) = vfio_p2p_config::vm_name_error(n) {
            bail!("--name: {e}");
        }
        config.name = n.clone();
    }
    if !args.nics.is_empty() {
        config.nics = args.nics.clone();
    }
    if let Some(t) = args.guest_topology {
        config.guest_topology = t;
    }
    if args.target == GenTarget::Incus {
        config.guest_topology = GuestTopology::Flat;
    }
    if let Some(b) = args.iommu_backend {
        config.iommu_backend = b;
    }
    if args.format.is_some()
        && matches!(
            args.target,
            GenTarget::Libvirt | GenTarget::Nccl | GenTarget::Proxmox | GenTarget::Incus
        )
    {
        bail!("--format applies to qemu and cloud-hypervisor command lines; libvirt and nccl write XML, proxmox its config lines, incus a profile (--incus-output)");
    }
    if (args.incus_output.is_some() || args.incus_server.is_some())
        && args.target != GenTarget::Incus
    {
        bail!("--incus-output and --incus-server apply to `gen incus` only");
    }
    if args.target == GenTarget::Incus && (config.report.is_some() || args.expect_out.is_some()) {
        bail!("`gen incus` writes no expectation and no vsock device (Incus picks the guest addresses and the VM's vsock CID, volatile.vsock_id): leave out `verify: vsock` and --expect-out");
    }
    if args.target == GenTarget::Incus && args.guest_topology == Some(GuestTopology::Mirror) {
        bail!("Incus lays out the guest's PCIe tree itself (one root port per device): `gen incus` takes no --guest-topology mirror");
    }
    if args.as_is && args.target != GenTarget::Nccl {
        bail!("--as-is applies to `gen nccl` only");
    }
    Ok(config)
}

/// Where the guest finds its expectation: the file `--expect-out` names (written here), or
/// inline in the VM's configuration.
fn expectation_source(
    expect_out: Option<&Path>,
    expectation: &Expectation,
) -> anyhow::Result<ExpectationSource> {
    let Some(path) = expect_out else {
        return Ok(ExpectationSource::Inline);
    };
    std::fs::write(path, expectation.to_json() + "\n")
        .with_context(|| format!("writing the expectation to {}", path.display()))?;
    let abs = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    Ok(ExpectationSource::File(abs))
}

/// NCCL 2.28.9 needs the CPU's arch, vendor, familyid and modelid where its own detection
/// does not fill them: say so when the host's CPU is not known.
fn warn_unknown_cpu(topo: &vfio_p2p_model::Topology) {
    if topo.cpu.is_some() {
        return;
    }
    tracing::warn!(
        "the CPU of {} is unknown (no proc/cpuinfo there): the NCCL file's <cpu> has no arch, \
         vendor, familyid, modelid, and NCCL 2.28.9 refuses such a file where its own detection \
         does not fill them (\"Attribute arch of node cpu not found\"); generate it from a sysfs \
         root that has proc/cpuinfo (a live root '/' or a `vfio-p2p snapshot` directory)",
        topo.source
    );
}

/// How the cliques reach an Incus VM: the device key where the server has
/// gpu_physical_clique (asked once: the saved `incus query /1.0`, else `incus query /1.0`),
/// `raw.qemu.conf` where it has not; the key, with a warning, where no server answers.
fn incus_server(saved: Option<&Path>) -> anyhow::Result<Result<IncusServer, String>> {
    Ok(match saved {
        Some(p) => Ok(incus_read::read_incus_server_file(p)?),
        None => incus_read::incus_server_of(Path::new("incus")),
    })
}

/// The clique form for what [`incus_server`] found, with its warnings.
fn incus_clique_form(server: Result<IncusServer, String>) -> CliqueForm {
    let info = match server {
        Ok(i) => i,
        Err(why) => {
            tracing::warn!(
                    "{why}; writing `{}`, which needs Incus API extension {} (Incus 7.0.2 has it): on an older server use --incus-server with its `incus query /1.0`",
                    incus::CLIQUE_KEY,
                    incus::CLIQUE_EXTENSION
                );
            return CliqueForm::DeviceKey;
        }
    };
    if info.has(incus::CLIQUE_EXTENSION) {
        return CliqueForm::DeviceKey;
    }
    tracing::warn!(
        "Incus {} lacks API extension {} (no `{}` device key): the cliques go in raw.qemu.conf as {} properties of its QEMU devices; upgrade Incus (7.0.2 has it) to have them checked by Incus itself",
        info.server_version.as_deref().unwrap_or("(version unknown)"),
        incus::CLIQUE_EXTENSION,
        incus::CLIQUE_KEY,
        vfio_p2p_contract::CLIQUE_PROPERTY
    );
    CliqueForm::RawQemuConf
}

/// A VMM's refusal as gen prints it: `vm.yaml:LINE:COL: why` where a line is known.
fn refused<W: std::fmt::Display>(args: &GenArgs, r: Refusal<W>) -> anyhow::Error {
    let at = vm_yaml_at(args, r.at.map(|a| (a.line(), a.column())));
    anyhow::anyhow!("{at}{}", r.why)
}

/// `vm.yaml:LINE:COL: ` for a refusal about that place of the config file, else nothing.
fn vm_yaml_at(args: &GenArgs, at: Option<(u64, u64)>) -> String {
    match (&args.config, at) {
        (Some(p), Some((line, column))) => format!("{}:{line}:{column}: ", p.display()),
        _ => String::new(),
    }
}

/// vm.yaml's disks, looked for: on this host a missing image is an error naming it, its
/// line and the fix; generated from an example or a snapshot (for another machine) it is
/// a warning. A complete VM (qemu, libvirt, cloud-hypervisor) without disks is warned of.
fn check_disks(global: &GlobalArgs, args: &GenArgs, config: &VmConfig) -> anyhow::Result<()> {
    let whole_vm = matches!(
        args.target,
        GenTarget::Qemu | GenTarget::Libvirt | GenTarget::CloudHypervisor
    );
    if whole_vm && config.devices.disks.is_empty() {
        tracing::warn!(
            "{} has no disks: the VM has nothing to boot from; add `disks: [{{path: /var/lib/images/{}.qcow2}}]` to its vm.yaml (docs/gen.md)",
            config.name,
            config.name
        );
    }
    // a missing image is this host's problem only when the run reads this host
    let here = HostSource::of(global) == HostSource::Root("/".into());
    for d in &config.devices.disks {
        let Some(why) = vfio_p2p_read::disk_image::unusable(&d.path) else {
            continue;
        };
        let at = vm_yaml_at(args, d.at.map(|a| (a.line(), a.column())));
        let path = d.path.display();
        let text = format!(
            "{at}disks: {path} {why}: create it (`qemu-img create -f {} {path} 64G`) or copy the guest's image there",
            d.format.as_str()
        );
        if here {
            bail!("{text}");
        }
        tracing::warn!("{text} (generating from an example or snapshot: it must exist on the machine that runs the VM)");
    }
    Ok(())
}

/// vm.yaml's boot keys against the target (`decide::vm_boot`): refused at their line when
/// the VMM cannot honour them (Cloud Hypervisor given neither kernel nor firmware, too). QEMU's copy of
/// the OVMF vars template is made where vm.yaml says (on this host, once: it then holds the
/// VM's variables) or, generating for another machine, the command that makes it is said.
fn check_boot(args: &GenArgs, config: &VmConfig) -> anyhow::Result<()> {
    let vmm = match args.target {
        GenTarget::Qemu => BootVmm::Qemu,
        GenTarget::Libvirt => BootVmm::Libvirt,
        GenTarget::CloudHypervisor => BootVmm::CloudHypervisor,
        GenTarget::Proxmox => BootVmm::Other("Proxmox VE"),
        GenTarget::Incus => BootVmm::Other("Incus"),
        GenTarget::Nccl => return Ok(()),
    };
    vm_boot::refusal(config, vmm).map_err(|r| refused(args, r))?;
    Ok(())
}

/// The NVSwitches a whole-baseboard VM (fabric: full-passthrough) gets beside its GPUs, with
/// the warning that Fabric Manager moves into the guest. The NCCL file describes the guest's
/// GPUs and NICs only; the NVSwitches go into VM definitions.
fn passthrough_nvswitches(
    target: GenTarget,
    ctx: &Context,
    gpus: &[pci_config::Bdf],
) -> Vec<pci_config::Bdf> {
    if target == GenTarget::Nccl {
        return Vec::new();
    }
    let nvswitches =
        vfio_p2p_decide::fabric::passthrough_nvswitches(&ctx.topo, ctx.fabric.model, gpus);
    if !nvswitches.is_empty() {
        tracing::warn!(
            "fabric: full-passthrough: the VM has the whole baseboard, so its {} NVSwitches go in too; Fabric Manager must run in the guest (the guest driver's version, FABRIC_MODE=0), not on the host",
            nvswitches.len()
        );
    }
    nvswitches
}

/// The guest's address space for vm.yaml's RAM and the GPUs' window on the host's width
/// (`address sizes`), or the refusal naming vm.yaml's `memory_mib` line and the fix. An
/// unknown width refuses nothing; it is warned of where the window ends above 1 TiB.
fn guest_address_space(
    args: &GenArgs,
    config: &VmConfig,
    topo: &vfio_p2p_model::Topology,
    window: u64,
) -> anyhow::Result<GuestAddressSpace> {
    let bits = topo.cpu.as_ref().and_then(|c| c.phys_bits);
    let space = address_space::for_vm(
        config.memory_mib << 20,
        window,
        bits,
        address_space::GuestVendor::of(topo.cpu.as_ref()),
    )
    .map_err(|e| {
        let at = match (&args.config, config.memory_at) {
            (Some(p), Some(at)) => {
                format!("{}:{}:{}: memory_mib", p.display(), at.line(), at.column())
            }
            (Some(p), None) => format!(
                "{}: memory_mib (the default, {})",
                p.display(),
                config.memory_mib
            ),
            (None, _) => format!(
                "memory_mib (the default, {}; --config vm.yaml sets it)",
                config.memory_mib
            ),
        };
        anyhow::anyhow!("{at}: {e} (host: {})", topo.source)
    })?;
    if bits.is_none() && !space.fits_qemu_default && args.target != GenTarget::Nccl {
        tracing::warn!(
            "{} does not say its physical address width (no `address sizes` in proc/cpuinfo): {} MiB of RAM and the {} GiB 64-bit window end above 1 TiB, and gen cannot check they fit; generate on the host or from its `vfio-p2p snapshot`",
            topo.source,
            config.memory_mib,
            window.div_ceil(1 << 30)
        );
    }
    Ok(space)
}

/// The libvirt domain for the libvirt version targeted, with a warning for each form an
/// older libvirt gets instead of its element.
fn libvirt_domain(ctx: &Context, vm: &VmDefinition) -> String {
    let version = match ctx.libvirt_version() {
        Ok(v) => v,
        Err(why) => {
            let v = OVERRIDE_SINCE;
            tracing::warn!(
                "{}",
                libvirt::unknown_version_warning(why, v, vm.iommu_backend)
            );
            return libvirt::domain(vm, v);
        }
    };
    if !version.has_override() {
        tracing::warn!("{}", libvirt::set_form_warning(version));
    }
    if !version.has_maxphysaddr() {
        tracing::warn!("{}", libvirt::maxphysaddr_form_warning(version));
    }
    if vm.iommu_backend == IommuBackend::Iommufd && !version.has_iommufd() {
        tracing::warn!("{}", libvirt::iommufd_form_warning(version));
    }
    libvirt::domain(vm, version)
}

/// The layout the target gets: the machine as it is (`--as-is`), Cloud Hypervisor's root
/// bus numbered as CH creates devices, or the tree decided (a warning for each pair whose
/// label a mirror changes).
fn target_layout(
    args: &GenArgs,
    config: &VmConfig,
    topo: &vfio_p2p_model::Topology,
    mut layout: guest_layout::GuestLayout,
) -> anyhow::Result<guest_layout::GuestLayout> {
    if args.as_is {
        layout.as_is();
    } else if args.target == GenTarget::CloudHypervisor {
        layout = ch_decide::guest_layout(config, &layout)
            .with_context(|| format!("laying out {} for Cloud Hypervisor", config.name))?;
    } else if layout.topology == GuestTopology::Mirror {
        for d in guest_paths::label_differences(topo, &layout) {
            tracing::warn!("{d}");
        }
    }
    Ok(layout)
}

/// What Cloud Hypervisor or qemu-server cannot take, refused at vm.yaml's line.
fn vmm_refusal(
    args: &GenArgs,
    config: &VmConfig,
    layout: &guest_layout::GuestLayout,
    backend: IommuBackend,
) -> anyhow::Result<()> {
    match args.target {
        GenTarget::CloudHypervisor => {
            ch_decide::refusal(config, layout, backend).map_err(|r| refused(args, r))
        }
        GenTarget::Proxmox => proxmox_decide::refusal(config, layout).map_err(|r| refused(args, r)),
        _ => Ok(()),
    }
}

/// The guest's address space as each target needs it: the NCCL file describes GPUs, not a
/// VM's memory, and a Grace guest's window follows neither q35's nor OVMF's rules
/// (`grace_guest` sizes it); every other VM is checked against the host's width.
fn vm_address_space(
    args: &GenArgs,
    config: &VmConfig,
    topo: &vfio_p2p_model::Topology,
    hole64: u64,
    grace: bool,
) -> anyhow::Result<GuestAddressSpace> {
    let other = address_space::GuestVendor::Other;
    Ok(match args.target {
        GenTarget::Nccl => address_space::for_vm(0, hole64, None, other)?,
        _ if grace => address_space::for_vm(config.memory_mib << 20, hole64, None, other)?,
        _ => guest_address_space(args, config, topo, hole64)?,
    })
}

/// The text of the target: the VM definition, the NCCL file or the Incus profile, with the
/// warnings each renderer has.
fn render(
    args: &GenArgs,
    ctx: &Context,
    vm: &VmDefinition,
    grace_vmm: Option<grace::GraceVmm>,
    incus: Option<Result<IncusServer, String>>,
) -> anyhow::Result<String> {
    let format = args.format.unwrap_or_default();
    let topo = &ctx.topo;
    use grace::GraceVmm::{Libvirt as GraceLibvirt, Qemu as GraceQemu};
    if let (Some(vmm @ (GraceQemu | GraceLibvirt)), Some(g)) = (grace_vmm, vm.grace) {
        return Ok(grace::text(vmm, ctx, vm, g, format));
    }
    Ok(match args.target {
        GenTarget::Qemu => qemu::render(&qemu::argv(vm), format),
        GenTarget::Libvirt => libvirt_domain(ctx, vm),
        GenTarget::CloudHypervisor => {
            for w in clique_offset::cloud_hypervisor(topo, vm.layout)? {
                tracing::warn!("{w}");
            }
            let (argv, warnings) = cloud_hypervisor::argv(vm);
            for w in warnings {
                tracing::warn!("{w}");
            }
            qemu::render(&argv, format)
        }
        GenTarget::Nccl => nccl::topology_xml(vm, topo),
        GenTarget::Proxmox => proxmox::config(vm),
        GenTarget::Incus => {
            for w in incus::guest_io_warnings(vm)
                .into_iter()
                .chain(incus::address_space_warning(vm))
            {
                tracing::warn!("{w}");
            }
            let form = incus_clique_form(incus.unwrap_or_else(|| Err("not asked".into())));
            match args.incus_output.unwrap_or_default() {
                IncusOutput::Profile => incus::profile(vm, form),
                IncusOutput::Commands => incus::commands(vm, form),
            }
        }
    })
}

pub fn run(global: &GlobalArgs, args: GenArgs) -> anyhow::Result<ExitCode> {
    let config = vm_config(&args)?;
    check_disks(global, &args, &config)?;
    check_boot(&args, &config)?;
    let ctx = Context::load(global, &args.planning.options.host, &needs(&args, &config))?;
    // Incus's API extensions, asked before planning like every other probe.
    let incus = match args.target {
        GenTarget::Incus => Some(incus_server(args.incus_server.as_deref())?),
        _ => None,
    };
    let topo = &ctx.topo;
    let requested = if args.planning.gpus.is_empty() {
        config.gpus.clone()
    } else {
        args.planning.gpus.clone()
    };
    let gpus = ctx.gpus(&requested);
    let p = ctx.plan(
        &gpus,
        &ctx.plan_options(&args.planning.options, config.p2p_level),
    )?;
    let nics = topo.resolve_nics(&config.nics).map_err(|e| {
        let from = args.config.as_ref().filter(|_| args.nics.is_empty());
        match from {
            Some(path) => anyhow::anyhow!("{}: nics: {e}", path.display()),
            None => anyhow::anyhow!("--nics: {e}"),
        }
    })?;
    let nvswitches = passthrough_nvswitches(args.target, &ctx, &gpus);
    let nics: Vec<pci_config::Bdf> = nics.into_iter().chain(nvswitches).collect();
    let layout = guest_layout::decide_with_nics(
        topo,
        &gpus,
        &nics,
        &p.assignments,
        LayoutOptions {
            topology: config.guest_topology,
            guest_numa: config.guest_numa,
        },
    )
    .with_context(|| format!("laying out the guest PCIe tree for {}", config.name))?;
    let grace_vmm = match args.target {
        _ if args.as_is => None,
        GenTarget::Qemu => Some(grace::GraceVmm::Qemu),
        GenTarget::Libvirt => Some(grace::GraceVmm::Libvirt),
        GenTarget::CloudHypervisor => Some(grace::GraceVmm::CloudHypervisor),
        _ => None,
    };
    let grace = match grace_vmm {
        Some(vmm) => {
            let path = args.config.as_deref();
            grace::layout(vmm, path, &config, &ctx, &gpus, &nics, &p.assignments)?
        }
        None => None,
    };
    let layout = match &grace {
        Some((grace_layout, _)) => grace_layout.clone(),
        None => target_layout(&args, &config, topo, layout)?,
    };
    let grace = grace.map(|(_, g)| g);
    let mut expectation = expectation::for_layout(&config.name, topo, &layout);
    expectation::add_fabric(&mut expectation, topo, &ctx.fabric);
    if let Some(g) = &grace {
        expectation::add_grace_numa(&mut expectation, g);
    }
    let report_plan = report_plan(&config, &mut expectation, args.state_dir.as_deref())?;
    let devices: Vec<_> = layout
        .passed()
        .filter_map(|g| topo.device(&g.host))
        .collect();
    let hole64 = mmio::hole64_size(&devices);
    let address_space = vm_address_space(&args, &config, topo, hole64, grace.is_some())?;
    let has_cliques = layout.gpus.iter().any(|g| g.clique.is_some());
    let backend = iommu_backend(&ctx, config.iommu_backend, has_cliques);
    vmm_refusal(&args, &config, &layout, backend)?;
    let expectation_source = expectation_source(args.expect_out.as_deref(), &expectation)?;
    let vm = VmDefinition {
        config: &config,
        layout: &layout,
        expectation: &expectation,
        expectation_source,
        hole64,
        address_space,
        iommu_backend: backend,
        grace: grace.as_ref(),
    };
    if args.target == GenTarget::Nccl {
        warn_unknown_cpu(topo);
    }
    warn_iommufd_cliques(vm.iommu_backend, config.iommu_backend, has_cliques);
    let text = render(&args, &ctx, &vm, grace_vmm, incus)?;
    if args.target == GenTarget::Qemu {
        vars_copy::make(
            &config,
            HostSource::of(global) == HostSource::Root("/".into()),
        )?;
    }
    if let (Some(plan), Some(dir)) = (&report_plan, &args.state_dir) {
        register(plan, dir)?;
    }
    write_output(args.output.as_deref(), &text)?;
    Ok(ExitCode::SUCCESS)
}
