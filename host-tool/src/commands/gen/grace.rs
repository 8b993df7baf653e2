//! `gen` on a Grace host: the aarch64 guest's layout decided by `grace_guest` in the forms
//! the VMM takes, and its QEMU and libvirt renderings.

use anyhow::{bail, Context as _};

use std::path::Path;

use crate::context::Context;
use vfio_p2p_config::vm::{GuestTopology, VmConfig};
use vfio_p2p_decide::cloud_hypervisor as ch_decide;
use vfio_p2p_decide::grace_guest::{self, GraceGuest, QemuPieces, SmmuForm};
use vfio_p2p_decide::guest_layout::{self, LayoutOptions};
use vfio_p2p_emit::qemu::{self, ArgvFormat};
use vfio_p2p_emit::vm::VmDefinition;
use vfio_p2p_emit::{libvirt_grace, qemu_grace};
use vfio_p2p_model::vmm::{OVERRIDE_SINCE, SMMU_PCI_BUS_SINCE};

/// The VMMs a Grace guest is written for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GraceVmm {
    Qemu,
    Libvirt,
    CloudHypervisor,
}

/// A Grace host's guest for qemu, libvirt and cloud-hypervisor: the GPUs laid out flat,
/// then given their NUMA nodes, vSMMUs and window by `grace_guest` in the forms the QEMU
/// that runs the VM takes (Cloud Hypervisor: no SMMU, its own root bus); `None` elsewhere.
pub fn layout(
    vmm: GraceVmm,
    config_path: Option<&Path>,
    config: &VmConfig,
    ctx: &Context,
    gpus: &[pci_config::Bdf],
    nics: &[pci_config::Bdf],
    cliques: &std::collections::BTreeMap<pci_config::Bdf, Option<u8>>,
) -> anyhow::Result<Option<(guest_layout::GuestLayout, GraceGuest)>> {
    let topo = &ctx.topo;
    if !grace_guest::is_grace(topo, gpus) {
        return Ok(None);
    }
    let at = |at: Option<(u64, u64)>| match (config_path, at) {
        (Some(p), Some((line, column))) => format!("{}:{line}:{column}: ", p.display()),
        _ => String::new(),
    };
    if let Some(d) = config
        .devices
        .disks
        .iter()
        .find(|d| d.bus == vfio_p2p_config::vm_devices::DiskBus::Sata)
    {
        let at = at(d.at.map(|a| (a.line(), a.column())));
        bail!("{at}disks: {} is a sata disk; the aarch64 virt machine of a Grace guest has no AHCI controller: use bus: virtio", d.path.display());
    }
    let opts = LayoutOptions {
        topology: GuestTopology::Flat,
        guest_numa: false,
    };
    let flat = guest_layout::decide_with_nics(topo, gpus, nics, cliques, opts)
        .with_context(|| format!("laying out the guest PCIe tree for {}", config.name))?;
    let (pieces, warnings) = match vmm {
        GraceVmm::CloudHypervisor => (
            QemuPieces {
                smmu_form: SmmuForm::MachineWide,
                highmem_mmio_size: false,
            },
            Vec::new(),
        ),
        _ => {
            let version = match &ctx.probes.qemu_version {
                Some(Ok(v)) => Some(*v),
                Some(Err(why)) => {
                    tracing::warn!("{why}");
                    None
                }
                None => None,
            };
            let (mut pieces, mut warnings) =
                grace_guest::qemu_pieces(version, grace_guest::window(topo, &flat))?;
            let libvirt = ctx.libvirt_version().unwrap_or(OVERRIDE_SINCE);
            if vmm == GraceVmm::Libvirt
                && pieces.smmu_form == SmmuForm::PerPhysical
                && !libvirt.has_smmu_pci_bus()
            {
                warnings.push(format!("libvirt {libvirt}: one SMMUv3 for the machine (<iommu model='smmuv3'/>); an SMMUv3 per physical SMMU on its expander bus (<driver pciBus=…>) needs libvirt {SMMU_PCI_BUS_SINCE}"));
                pieces.smmu_form = SmmuForm::MachineWide;
            }
            (pieces, warnings)
        }
    };
    let (layout, grace, more) = grace_guest::decide(topo, flat, config.memory_mib, pieces)
        .map_err(|e| {
            let at = match e {
                grace_guest::GraceError::HugepageFit { .. } => {
                    at(config.memory_at.map(|a| (a.line(), a.column())))
                }
                _ => String::new(),
            };
            anyhow::anyhow!("{at}{e} (host: {})", topo.source)
        })?;
    for w in warnings.into_iter().chain(more) {
        tracing::warn!("{w}");
    }
    let layout = match vmm {
        GraceVmm::CloudHypervisor => {
            let mut ch = ch_decide::guest_layout(config, &layout)
                .with_context(|| format!("laying out {} for Cloud Hypervisor", config.name))?;
            // CH's root bus as it numbers it, with the Grace guest's CPU nodes
            ch.numa_nodes = layout.numa_nodes;
            ch
        }
        _ => layout,
    };
    Ok(Some((layout, grace)))
}

/// `gen qemu` or `gen libvirt` of the Grace guest `g`, with libvirt's warning
/// for the form an older libvirt gets.
pub fn text(
    vmm: GraceVmm,
    ctx: &Context,
    vm: &VmDefinition,
    g: &GraceGuest,
    format: ArgvFormat,
) -> String {
    match vmm {
        GraceVmm::Libvirt => {
            let version = ctx.libvirt_version().unwrap_or_else(|why| {
                tracing::warn!(
                    "{why}: libvirt's version is unknown; the Grace domain is written for libvirt {OVERRIDE_SINCE}; pass --libvirt-version X.Y to write for the libvirt that will run it"
                );
                OVERRIDE_SINCE
            });
            if !version.has_acpi_nodeset() {
                tracing::warn!("{}", libvirt_grace::acpi_form_warning(version));
            }
            libvirt_grace::domain(vm, g, version)
        }
        _ => qemu::render(&qemu_grace::argv(vm, g), format),
    }
}
