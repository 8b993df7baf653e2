//! A Grace host's guest for qemu, libvirt and cloud-hypervisor: the GPUs laid out flat,
//! then given their NUMA nodes, vSMMUs and window by `grace_guest` in the forms the QEMU
//! that runs the VM takes (Cloud Hypervisor: no SMMU, its own root bus).

use std::collections::BTreeMap;

use anyhow::Context as _;
use pci_config::Bdf;

mod layout_keys;

use super::spec::VmSpec;
use super::{cloud_hypervisor, Said, Say, VmInputs, VmTarget};
use crate::grace_guest::{self, GraceGuest, QemuPieces, SmmuForm};
use crate::guest_layout::{self, GuestLayout, LayoutOptions};
use vfio_p2p_config::vm::GuestTopology;
use vfio_p2p_model::vmm::{OVERRIDE_SINCE, SMMU_PCI_BUS_SINCE};

/// The Grace guest's layout and pieces; `None` for a target that has none (`--as-is`,
/// nccl, proxmox, incus) or GPUs that are not a Grace host's.
pub(super) fn layout(
    inputs: &VmInputs,
    spec: &VmSpec,
    gpus: &[Bdf],
    nics: &[Bdf],
    cliques: &BTreeMap<Bdf, Option<u8>>,
    say: Say,
) -> anyhow::Result<Option<(GuestLayout, GraceGuest)>> {
    let target = spec.flags.target;
    let vmm_target = matches!(
        target,
        VmTarget::Qemu | VmTarget::Libvirt | VmTarget::CloudHypervisor
    );
    let topo = inputs.host.topo;
    if spec.flags.as_is || !vmm_target || !grace_guest::is_grace(topo, gpus) {
        return Ok(None);
    }
    let config = &spec.config;
    super::refuse_sata_on_virt(spec, "a Grace guest")?;
    let opts = LayoutOptions {
        topology: GuestTopology::Flat,
        guest_numa: false,
    };
    let flat = guest_layout::decide_with_nics(topo, gpus, nics, cliques, opts)
        .with_context(|| format!("laying out the guest PCIe tree for {}", config.name))?;
    let (pieces, warnings) = match target {
        VmTarget::CloudHypervisor => (
            QemuPieces {
                smmu_form: SmmuForm::MachineWide,
                highmem_mmio_size: false,
            },
            Vec::new(),
        ),
        _ => qemu_pieces(inputs, target, &flat, say)?,
    };
    let (layout, grace, more) = grace_guest::decide(topo, flat, config.memory_mib, pieces)
        .map_err(|e| {
            let at = match e {
                grace_guest::GraceError::HugepageFit { .. } => spec.at(config.memory_at),
                _ => String::new(),
            };
            anyhow::anyhow!("{at}{e} (host: {})", topo.source)
        })?;
    for w in warnings.into_iter().chain(more) {
        say(Said::Warning(w));
    }
    for w in layout_keys::x86_layout_keys(spec, &layout, &grace) {
        say(Said::Warning(w));
    }
    let layout = match target {
        VmTarget::CloudHypervisor => {
            let mut ch = cloud_hypervisor::layout(config, &layout)?;
            // CH's root bus as it numbers it, with the Grace guest's CPU nodes
            ch.numa_nodes = layout.numa_nodes;
            ch
        }
        _ => layout,
    };
    Ok(Some((layout, grace)))
}

/// The pieces the QEMU that runs the VM takes (its version, where it was asked), and
/// the SMMU form the libvirt targeted can write.
fn qemu_pieces(
    inputs: &VmInputs,
    target: VmTarget,
    flat: &GuestLayout,
    say: Say,
) -> anyhow::Result<(QemuPieces, Vec<String>)> {
    let version = inputs.known_qemu_version(say);
    let window = grace_guest::window(inputs.host.topo, flat);
    let (mut pieces, mut warnings) = grace_guest::qemu_pieces(version, window)?;
    let libvirt = inputs.libvirt_version.clone().unwrap_or(OVERRIDE_SINCE);
    if target == VmTarget::Libvirt
        && pieces.smmu_form == SmmuForm::PerPhysical
        && !libvirt.has_smmu_pci_bus()
    {
        warnings.push(format!("libvirt {libvirt}: one SMMUv3 for the machine (<iommu model='smmuv3'/>); an SMMUv3 per physical SMMU on its expander bus (<driver pciBus=…>) needs libvirt {SMMU_PCI_BUS_SINCE}"));
        pieces.smmu_form = SmmuForm::MachineWide;
    }
    Ok((pieces, warnings))
}
