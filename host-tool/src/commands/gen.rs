//! `vfio-p2p gen qemu|libvirt|cloud-hypervisor|nccl|proxmox|incus`: a VM definition from
//! the plan. The VM is decided by `decide::vm::plan` (vm.yaml merged with the flags, then
//! the whole plan); this command reads what the plan needs, prints what it says, and
//! writes the text `emit::vm_text` renders.

mod vars_copy;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context as _};
use clap::Args;

use crate::cli::GlobalArgs;
use crate::context::source::HostSource;
use crate::context::{Context, Needs, PlanningArgs};
use vfio_p2p_collector::store::Store;
use vfio_p2p_config::vm::{GuestTopology, IommuBackend, VmConfig};
use vfio_p2p_contract::Expectation;
use vfio_p2p_decide::fleet_verdict::DomainPlan;
use vfio_p2p_decide::vm::spec::{VmFlags, VmSpec};
use vfio_p2p_decide::vm::{self, Host, IncusApi, VmInputs, VmTarget};
use vfio_p2p_emit::data::write_output;
use vfio_p2p_emit::incus::IncusOutput;
use vfio_p2p_emit::qemu::{self, ArgvFormat};
use vfio_p2p_emit::vm::ExpectationSource;
use vfio_p2p_emit::vm_text::{self, TextOptions};
use vfio_p2p_model::vmm::LibvirtVersion;
use vfio_p2p_model::NicRef;
use vfio_p2p_read::incus as incus_read;

#[derive(Debug, Args)]
pub struct GenArgs {
    #[arg(value_enum)]
    pub target: VmTarget,
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

/// What `gen` asks the context build for: `auto` needs this host's iommufd support
/// (`/dev/iommu`, VFIO cdevs, kernel) and the version of the QEMU that will run the VM, a
/// libvirt domain the libvirt version to target.
fn needs(args: &GenArgs, config: &VmConfig) -> Needs {
    let auto = config.iommu_backend == IommuBackend::Auto;
    // a Grace guest's pieces depend on the QEMU that runs it: asked when --qemu names it
    let named = args.qemu.is_some() && matches!(args.target, VmTarget::Qemu | VmTarget::Libvirt);
    Needs {
        iommufd: auto,
        qemu_version: (auto || named).then(|| {
            args.qemu
                .clone()
                .unwrap_or_else(|| PathBuf::from(qemu::QEMU_BINARY))
        }),
        libvirt_version: (args.target == VmTarget::Libvirt).then_some(args.libvirt_version),
        ..Needs::nvlink(&args.planning.options.nvlink)
    }
}

/// vm.yaml (or the defaults) with the command line's flags applied once.
fn vm_spec(args: &GenArgs) -> anyhow::Result<VmSpec> {
    let config = match &args.config {
        Some(p) => VmConfig::load(p)?,
        None => VmConfig::default(),
    };
    let options = &args.planning.options;
    let flags = VmFlags {
        target: args.target,
        config_path: args.config.clone(),
        name: args.name.clone(),
        gpus: args.planning.gpus.clone(),
        nics: args.nics.clone(),
        guest_topology: args.guest_topology,
        iommu_backend: args.iommu_backend,
        p2p_level: options.p2p_level,
        allow_untranslated_p2p: options.allow_untranslated_p2p,
        format: args.format.is_some(),
        incus_flags: args.incus_output.is_some() || args.incus_server.is_some(),
        expect_out: args.expect_out.is_some(),
        as_is: args.as_is,
        state_dir: args.state_dir.is_some(),
    };
    VmSpec::apply(config, flags)
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

/// An Incus server's API extensions, asked once: the saved `incus query /1.0`, else
/// `incus query /1.0`; why none answered.
fn incus_server(saved: Option<&Path>) -> anyhow::Result<Result<IncusApi, String>> {
    let server = match saved {
        Some(p) => Ok(incus_read::read_incus_server_file(p)?),
        None => incus_read::incus_server_of(Path::new("incus")),
    };
    Ok(server.map(|s| IncusApi {
        server_version: s.server_version,
        api_extensions: s.api_extensions,
    }))
}

pub fn run(global: &GlobalArgs, args: GenArgs) -> anyhow::Result<ExitCode> {
    let spec = vm_spec(&args)?;
    let source = HostSource::of(global);
    // a missing disk image is this host's problem only when the run reads this host
    let here = source == HostSource::Root("/".into());
    let disks = &spec.config.devices.disks;
    let unusable: Vec<_> = disks
        .iter()
        .map(|d| vfio_p2p_read::disk_image::unusable(&d.path))
        .collect();
    spec.validate(&unusable, here, &mut crate::logging::say)?;
    let host_config = &args.planning.options.host;
    let ctx = Context::load_from(source, host_config, &needs(&args, &spec.config))?;
    // Incus's API extensions, asked before planning like every other probe.
    let incus = match args.target {
        VmTarget::Incus => Some(incus_server(args.incus_server.as_deref())?),
        _ => None,
    };
    let inputs = VmInputs {
        host: Host {
            topo: &ctx.topo,
            fabric: &ctx.fabric,
            config: &ctx.host,
        },
        iommu: ctx.probes.iommu.as_ref(),
        qemu_version: ctx.probes.qemu_version.as_ref(),
        libvirt_version: ctx.libvirt_version().map_err(str::to_string),
        incus,
    };
    let plan = vm::plan(&inputs, &spec, &mut crate::logging::say)?;
    let source = expectation_source(args.expect_out.as_deref(), &plan.expectation)?;
    let options = TextOptions {
        format: args.format.unwrap_or_default(),
        incus_output: args.incus_output.unwrap_or_default(),
    };
    let (text, warnings) = vm_text::render(&plan, source, options);
    for w in warnings {
        tracing::warn!("{w}");
    }
    if args.target == VmTarget::Qemu {
        vars_copy::make(&spec.config, here)?;
    }
    if let (Some(p), Some(dir)) = (&plan.domain_plan, &args.state_dir) {
        register(p, dir)?;
    }
    write_output(args.output.as_deref(), &text)?;
    Ok(ExitCode::SUCCESS)
}
