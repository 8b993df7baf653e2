//! What this VM is: one entry, [`plan`], from the VM's spec (vm.yaml merged once with
//! the command line's flags, [`spec::VmSpec`]) and the host's inputs read before it
//! ([`VmInputs`]) to the whole plan ([`VmPlan`]): GPUs, cliques, guest layout (x86 and
//! Grace), devices, refusals and warnings, the guest agent's expectation. Every VM
//! emitter renders a [`VmPlan`]; `gen` and the commands that plan cliques for a VM
//! (qemu-wrap, the KubeVirt sidecar, `libvirt patch`) go through here.
//!
//! Like Cloud Hypervisor's `vmm/src/config.rs` (parse, then validate, then apply), the
//! spec is merged and validated once ([`spec::VmSpec::apply`], [`spec::VmSpec::validate`]),
//! before the host is read; [`plan`] then decides in the order the route has always had, so
//! what it says ([`Said`]) comes out in the same order as before.

mod arm_pcie;
pub mod cloud_hypervisor;
mod grace;
pub mod incus;
pub mod libvirt;
mod refusals;
pub mod spec;

use anyhow::Context as _;
use clap::ValueEnum;
use pci_config::Bdf;

use crate::address_space::GuestAddressSpace;
use crate::arm_pcie_guest::ArmPcieGuest;
use crate::clique_plan::{CliquePlan, PlanOptions};
use crate::expectation;
use crate::fleet_verdict::DomainPlan;
use crate::grace_guest::GraceGuest;
use crate::guest_layout::{self, GuestLayout, LayoutOptions};
use crate::guest_paths;
use crate::mmio;
use spec::VmSpec;
use vfio_p2p_config::host::HostConfig;
use vfio_p2p_config::vm::{GuestTopology, IommuBackend};
use vfio_p2p_contract::{Expectation, ReportChannel};
use vfio_p2p_model::fabric::Fabric;
use vfio_p2p_model::host_facts::IommuFacts;
use vfio_p2p_model::vmm::{LibvirtVersion, QemuVersion};
use vfio_p2p_model::Topology;

/// Which configuration a VM is planned for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum VmTarget {
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

/// What planning says besides its result, in the order it decides: the caller prints
/// warnings as `warning: …` lines and notes as `vfio-p2p: …`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Said {
    Warning(String),
    Note(String),
}

/// Where [`Said`] goes (a failure half-way still leaves what was said before it said).
pub type Say<'s> = &'s mut dyn FnMut(Said);

/// The host as planning sees it: the topology, Fabric Manager's partitions, host.yaml.
#[derive(Debug, Clone, Copy)]
pub struct Host<'a> {
    pub topo: &'a Topology,
    pub fabric: &'a Fabric,
    pub config: &'a HostConfig,
}

/// An Incus server's `GET /1.0`, as far as planning needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IncusApi {
    pub server_version: Option<String>,
    pub api_extensions: Vec<String>,
}

/// Everything [`plan`] decides from besides the spec, read once before it.
#[derive(Debug)]
pub struct VmInputs<'a> {
    pub host: Host<'a>,
    /// This host's iommufd support, where `iommu_backend: auto` asked for it.
    pub iommu: Option<&'a IommuFacts>,
    /// The version of the QEMU that runs the VM, where it was asked.
    pub qemu_version: Option<&'a Result<QemuVersion, String>>,
    /// The libvirt version to target, or why it is unknown.
    pub libvirt_version: Result<LibvirtVersion, String>,
    /// `gen incus`: what the Incus server answered, or why none did.
    pub incus: Option<Result<IncusApi, String>>,
}

impl VmInputs<'_> {
    /// The version of the QEMU that runs the VM where it is known; why it is not, said as a
    /// warning (an aarch64 guest's window rules then assume a QEMU that takes them).
    fn known_qemu_version(&self, say: Say) -> Option<QemuVersion> {
        match self.qemu_version {
            Some(Ok(v)) => Some(*v),
            Some(Err(why)) => {
                say(Said::Warning(why.clone()));
                None
            }
            None => None,
        }
    }
}

/// Refuses a SATA disk in `spec`, at its vm.yaml line: an aarch64 `virt` machine (`guest`
/// names which guest it is) has no AHCI controller.
fn refuse_sata_on_virt(spec: &VmSpec, guest: &str) -> anyhow::Result<()> {
    use vfio_p2p_config::vm_devices::DiskBus;
    if let Some(d) = spec
        .config
        .devices
        .disks
        .iter()
        .find(|d| d.bus == DiskBus::Sata)
    {
        let at = spec.at(d.at);
        anyhow::bail!(
            "{at}disks: {} is a sata disk; the aarch64 virt machine of {guest} has no AHCI controller: use bus: virtio",
            d.path.display()
        );
    }
    Ok(())
}

/// The form the target is written in, decided with the plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TargetForm {
    Qemu,
    /// An aarch64 `virt` machine for a Grace host's GPUs.
    QemuGrace,
    /// An aarch64 `virt` machine for an Arm host's PCIe GPUs.
    QemuArmPcie,
    /// A domain for this libvirt version.
    Libvirt(LibvirtVersion),
    LibvirtGrace(LibvirtVersion),
    LibvirtArmPcie(LibvirtVersion),
    CloudHypervisor,
    Nccl,
    Proxmox,
    Incus(incus::CliqueForm),
}

/// The whole plan of one VM: what every VM emitter renders.
#[derive(Debug, Clone)]
pub struct VmPlan<'a> {
    pub spec: &'a VmSpec,
    pub topo: &'a Topology,
    pub gpus: Vec<Bdf>,
    pub cliques: CliquePlan,
    pub layout: GuestLayout,
    /// A Grace host's guest (NUMA nodes, vSMMUs, window); `None` elsewhere.
    pub grace: Option<GraceGuest>,
    /// An aarch64 host's guest of PCIe GPUs (its high window) for QEMU and libvirt;
    /// `None` elsewhere.
    pub arm_pcie: Option<ArmPcieGuest>,
    pub expectation: Expectation,
    /// `verify: vsock` with a state directory: what the collector is told.
    pub domain_plan: Option<DomainPlan>,
    /// Size of the guest's 64-bit PCI MMIO window, bytes.
    pub hole64: u64,
    pub address_space: GuestAddressSpace,
    /// legacy or iommufd (`auto` resolved).
    pub iommu_backend: IommuBackend,
    pub form: TargetForm,
}

/// The one entry: the whole plan of the VM `spec` describes, on the host of `inputs`.
pub fn plan<'a>(inputs: &VmInputs<'a>, spec: &'a VmSpec, say: Say) -> anyhow::Result<VmPlan<'a>> {
    let config = &spec.config;
    let host = inputs.host;
    let topo = host.topo;
    let gpus = spec.gpus(topo);
    let cliques = self::cliques(&host, "", &gpus, &spec.plan_options(host.config), say)?;
    let nics = spec.nics(topo)?;
    let nvswitches = passthrough_nvswitches(spec.flags.target, &host, &gpus, say);
    let nics: Vec<Bdf> = nics.into_iter().chain(nvswitches).collect();
    let options = LayoutOptions {
        topology: config.guest_topology,
        guest_numa: config.guest_numa,
    };
    let layout = guest_layout::decide_with_nics(topo, &gpus, &nics, &cliques.assignments, options)
        .with_context(|| format!("laying out the guest PCIe tree for {}", config.name))?;
    let grace = grace::layout(inputs, spec, &gpus, &nics, &cliques.assignments, say)?;
    let (layout, grace) = match grace {
        Some((layout, g)) => (layout, Some(g)),
        None => (target_layout(spec, topo, layout, say)?, None),
    };
    let arm_host = arm_pcie::applies(inputs, spec, grace.is_some());
    let arm_pcie = match arm_host {
        true => arm_pcie::guest(inputs, spec, &layout, say)?,
        false => None,
    };
    let arm_virt = grace.is_some() || arm_host;
    let mut expectation = expectation::for_layout(&config.name, topo, &layout);
    expectation::add_fabric(&mut expectation, topo, host.fabric);
    if let Some(g) = &grace {
        expectation::add_grace_numa(&mut expectation, g);
    }
    let domain_plan = report_plan(spec, &mut expectation, say)?;
    let devices: Vec<_> = layout
        .passed()
        .filter_map(|g| topo.device(&g.host))
        .collect();
    let hole64 = mmio::hole64_size(&devices);
    let address_space = refusals::address_space(spec, topo, hole64, arm_virt, say)?;
    let has_cliques = layout.gpus.iter().any(|g| g.clique.is_some());
    let backend = refusals::iommu_backend(inputs, config.iommu_backend, has_cliques, say);
    refusals::vmm(spec, topo, &layout, backend, say)?;
    refusals::late_warnings(spec, topo, backend, has_cliques, say);
    let form = target_form(
        inputs,
        spec,
        (backend, &address_space, hole64),
        (grace.is_some(), arm_pcie.is_some()),
        say,
    );
    Ok(VmPlan {
        spec,
        topo,
        gpus,
        cliques,
        layout,
        grace,
        arm_pcie,
        expectation,
        domain_plan,
        hole64,
        address_space,
        iommu_backend: backend,
        form,
    })
}

/// The cliques of `gpus`: a warning where they are not a Fabric Manager partition a VM
/// could be given, then the clique plan and its warnings, each after `who` (`qemu-wrap: `:
/// for a log other programs write too). The first stage of [`plan`]; qemu-wrap, the
/// KubeVirt sidecar and `libvirt patch`, which patch a VM defined elsewhere, stop here.
pub fn cliques(
    host: &Host,
    who: &str,
    gpus: &[Bdf],
    options: &PlanOptions,
    say: Say,
) -> anyhow::Result<CliquePlan> {
    if let Some(state) = host.fabric.partitions() {
        let reserved = host.config.reserved.iter().copied().collect();
        if let Some(w) = crate::fabric::gpu_set_warning(state, gpus, &reserved) {
            say(Said::Warning(format!("{who}{w}")));
        }
    }
    let p = crate::clique_plan::plan(host.topo, gpus, options)
        .with_context(|| format!("planning cliques on {}", host.topo.source))?;
    for w in &p.warnings {
        say(Said::Warning(format!("{who}{w}")));
    }
    Ok(p)
}

/// The NVSwitches a whole-baseboard VM (fabric: full-passthrough) gets beside its GPUs, with
/// the warning that Fabric Manager moves into the guest. The NCCL file describes the guest's
/// GPUs and NICs only; the NVSwitches go into VM definitions.
fn passthrough_nvswitches(target: VmTarget, host: &Host, gpus: &[Bdf], say: Say) -> Vec<Bdf> {
    if target == VmTarget::Nccl {
        return Vec::new();
    }
    let nvswitches = crate::fabric::passthrough_nvswitches(host.topo, host.fabric.model, gpus);
    if !nvswitches.is_empty() {
        say(Said::Warning(format!(
            "fabric: full-passthrough: the VM has the whole baseboard, so its {} NVSwitches go in too; Fabric Manager must run in the guest (the guest driver's version, FABRIC_MODE=0), not on the host",
            nvswitches.len()
        )));
    }
    nvswitches
}

/// The layout the target gets: the machine as it is (`--as-is`), Cloud Hypervisor's root
/// bus numbered as CH creates devices, or the tree decided (a warning for each pair whose
/// label a mirror changes).
fn target_layout(
    spec: &VmSpec,
    topo: &Topology,
    mut layout: GuestLayout,
    say: Say,
) -> anyhow::Result<GuestLayout> {
    if spec.flags.as_is {
        layout.as_is();
    } else if spec.flags.target == VmTarget::CloudHypervisor {
        layout = cloud_hypervisor::layout(&spec.config, &layout)?;
    } else if layout.topology == GuestTopology::Mirror {
        for d in guest_paths::label_differences(topo, &layout) {
            say(Said::Warning(d.to_string()));
        }
    }
    Ok(layout)
}

/// `verify: vsock`: the expectation names the report port; with a state directory, the
/// plan that tells the collector which domain owns the CID and what it should see.
fn report_plan(spec: &VmSpec, e: &mut Expectation, say: Say) -> anyhow::Result<Option<DomainPlan>> {
    let config = &spec.config;
    let register = spec.flags.state_dir;
    let Some(r) = config.report else {
        if register {
            anyhow::bail!("--state-dir registers VMs for `vfio-p2p collect`: set 'verify: vsock' and vsock_cid in the VM's config");
        }
        return Ok(None);
    };
    e.report = Some(ReportChannel { vsock_port: r.port });
    if !register {
        say(Said::Warning(format!("verify: vsock without --state-dir: the collector drops {}'s reports until its plan is registered (gen ... --state-dir /var/lib/vfio-p2p)", config.name)));
    }
    Ok(register.then(|| DomainPlan {
        domain: config.name.clone(),
        cid: r.cid,
        expectation: e.clone(),
    }))
}

/// The form each target is written in, with the warnings for the forms an older
/// libvirt or Incus gets.
fn target_form(
    inputs: &VmInputs,
    spec: &VmSpec,
    (backend, space, hole64): (IommuBackend, &GuestAddressSpace, u64),
    (grace, arm_pcie): (bool, bool),
    say: Say,
) -> TargetForm {
    match spec.flags.target {
        VmTarget::Qemu if grace => TargetForm::QemuGrace,
        VmTarget::Qemu if arm_pcie => TargetForm::QemuArmPcie,
        VmTarget::Qemu => TargetForm::Qemu,
        VmTarget::Libvirt if grace => {
            TargetForm::LibvirtGrace(libvirt::grace_version(&inputs.libvirt_version, say))
        }
        VmTarget::Libvirt if arm_pcie => {
            TargetForm::LibvirtArmPcie(libvirt::arm_version(&inputs.libvirt_version, backend, say))
        }
        VmTarget::Libvirt => {
            TargetForm::Libvirt(libvirt::version(&inputs.libvirt_version, backend, say))
        }
        VmTarget::CloudHypervisor => TargetForm::CloudHypervisor,
        VmTarget::Nccl => TargetForm::Nccl,
        VmTarget::Proxmox => TargetForm::Proxmox,
        VmTarget::Incus => {
            incus::warnings(&spec.config, space, hole64, say);
            TargetForm::Incus(incus::clique_form(inputs.incus.as_ref(), say))
        }
    }
}

#[cfg(test)]
mod tests;
