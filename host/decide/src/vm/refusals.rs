//! The checks of a laid-out VM: its address space on the host's width, the IOMMU
//! backend, what its VMM refuses, and the warnings said last.

use super::spec::VmSpec;
use super::{cloud_hypervisor, Said, Say, VmInputs, VmTarget};
use crate::address_space::{self, GuestAddressSpace};
use crate::guest_layout::GuestLayout;
use crate::iommu_backend;
use vfio_p2p_config::vm::IommuBackend;
use vfio_p2p_model::Topology;

/// The guest's address space as each target needs it: the NCCL file describes GPUs, not a
/// VM's memory, and an aarch64 guest's window (a Grace host's or an Arm host's with PCIe
/// GPUs, `arm_virt`) follows neither q35's nor OVMF's rules (`grace_guest::window` sizes
/// it); every other VM is checked against the host's width.
pub(super) fn address_space(
    spec: &VmSpec,
    topo: &Topology,
    hole64: u64,
    arm_virt: bool,
    say: Say,
) -> anyhow::Result<GuestAddressSpace> {
    let other = address_space::GuestVendor::Other;
    let ram = spec.config.memory_mib << 20;
    Ok(match spec.flags.target {
        VmTarget::Nccl => address_space::for_vm(0, hole64, None, other)?,
        _ if arm_virt => address_space::for_vm(ram, hole64, None, other)?,
        _ => on_host_width(spec, topo, hole64, say)?,
    })
}

/// The guest's address space for vm.yaml's RAM and the GPUs' window on the host's width
/// (`address sizes`), or the refusal naming vm.yaml's `memory_mib` line and the fix. An
/// unknown width refuses nothing; it is warned of where the window ends above 1 TiB.
fn on_host_width(
    spec: &VmSpec,
    topo: &Topology,
    window: u64,
    say: Say,
) -> anyhow::Result<GuestAddressSpace> {
    let config = &spec.config;
    let bits = topo.cpu.as_ref().and_then(|c| c.phys_bits);
    let vendor = address_space::GuestVendor::of(topo.cpu.as_ref());
    let space =
        address_space::for_vm(config.memory_mib << 20, window, bits, vendor).map_err(|e| {
            let at = match (&spec.flags.config_path, config.memory_at) {
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
    if bits.is_none() && !space.fits_qemu_default {
        say(Said::Warning(format!(
            "{} does not say its physical address width (no `address sizes` in proc/cpuinfo): {} MiB of RAM and the {} GiB 64-bit window end above 1 TiB, and gen cannot check they fit; generate on the host or from its `vfio-p2p snapshot`",
            topo.source,
            config.memory_mib,
            window.div_ceil(1 << 30)
        )));
    }
    Ok(space)
}

/// `auto` resolved against what was probed (a note says which and why); an example or a
/// snapshot has no host, so it gets legacy.
pub(super) fn iommu_backend(
    inputs: &VmInputs,
    requested: IommuBackend,
    has_cliques: bool,
    say: Say,
) -> IommuBackend {
    let (Some(iommu), IommuBackend::Auto) = (inputs.iommu, requested) else {
        return requested;
    };
    let offered = iommu_backend::iommufd_offered(iommu);
    let bars = iommu_backend::bar_mapping(iommu, inputs.qemu_version);
    let (backend, why) = iommu_backend::resolve(requested, &offered, &bars, has_cliques);
    say(Said::Note(format!("iommu backend auto: {backend} ({why})")));
    backend
}

/// What Cloud Hypervisor or qemu-server cannot take, refused at vm.yaml's line.
pub(super) fn vmm(
    spec: &VmSpec,
    topo: &Topology,
    layout: &GuestLayout,
    backend: IommuBackend,
    say: Say,
) -> anyhow::Result<()> {
    match spec.flags.target {
        VmTarget::CloudHypervisor => cloud_hypervisor::check(spec, topo, layout, backend, say),
        VmTarget::Proxmox => {
            crate::proxmox::refusal(&spec.config, layout).map_err(|r| spec.refused(r))
        }
        _ => Ok(()),
    }
}

/// The warnings said once the VM is decided: an NCCL file for a CPU not known, iommufd
/// asked for outright with cliques (whether peer BARs map is the host's and QEMU's to say,
/// which `check` looks at).
pub(super) fn late_warnings(
    spec: &VmSpec,
    topo: &Topology,
    backend: IommuBackend,
    has_cliques: bool,
    say: Say,
) {
    if spec.flags.target == VmTarget::Nccl && topo.cpu.is_none() {
        // NCCL 2.28.9 needs the CPU's arch, vendor, familyid and modelid where its own
        // detection does not fill them
        say(Said::Warning(format!(
            "the CPU of {} is unknown (no proc/cpuinfo there): the NCCL file's <cpu> has no arch, \
             vendor, familyid, modelid, and NCCL 2.28.9 refuses such a file where its own detection \
             does not fill them (\"Attribute arch of node cpu not found\"); generate it from a sysfs \
             root that has proc/cpuinfo (a live root '/' or a `vfio-p2p snapshot` directory)",
            topo.source
        )));
    }
    let requested = spec.config.iommu_backend;
    if backend == IommuBackend::Iommufd && requested == IommuBackend::Iommufd && has_cliques {
        say(Said::Warning(format!(
            "iommufd with P2P cliques: peer writes fault unless peer BARs are mapped as dma-bufs (Linux >= {}, QEMU >= {}); `vfio-p2p check --iommu-backend iommufd --qemu PATH` tells for this host",
            vfio_p2p_model::vmm::KernelVersion::BAR_DMABUF,
            vfio_p2p_model::vmm::QemuVersion::BAR_DMABUF
        )));
    }
}
