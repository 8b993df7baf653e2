//! An aarch64 host's guest when its GPUs are plain PCIe cards (no Grace superchip among
//! them): the layout decided for x86 (mirrored switches, cliques) on an aarch64 `virt`
//! machine, whose high window `arm_pcie_guest` sizes for the QEMU that runs it.

use super::spec::VmSpec;
use super::{Said, Say, VmInputs, VmTarget};
use crate::arm_pcie_guest::{self, ArmPcieGuest};
use crate::grace_guest;
use crate::guest_layout::GuestLayout;

/// Whether the VM is an aarch64 `virt` machine of PCIe GPUs: an aarch64 host, no Grace
/// guest, a VMM target (Cloud Hypervisor too: it has no machine type to choose, but its
/// guest's address space is not q35's). `--as-is` keeps the machine as the x86 path has it.
pub(super) fn applies(inputs: &VmInputs, spec: &VmSpec, grace: bool) -> bool {
    let vmm_target = matches!(
        spec.flags.target,
        VmTarget::Qemu | VmTarget::Libvirt | VmTarget::CloudHypervisor
    );
    vmm_target && !grace && !spec.flags.as_is && inputs.host.topo.is_arm64()
}

/// The Arm PCIe guest of `layout` for a QEMU or libvirt target (`None` for Cloud
/// Hypervisor, which writes no machine), refusing SATA disks, which `virt` has no
/// controller for.
pub(super) fn guest(
    inputs: &VmInputs,
    spec: &VmSpec,
    layout: &GuestLayout,
    say: Say,
) -> anyhow::Result<Option<ArmPcieGuest>> {
    super::refuse_sata_on_virt(spec, "an Arm host's guest")?;
    if spec.flags.target == VmTarget::CloudHypervisor {
        return Ok(None);
    }
    let version = inputs.known_qemu_version(say);
    let topo = inputs.host.topo;
    let window = grace_guest::window(topo, layout);
    let (guest, warnings) = arm_pcie_guest::decide(version, window)
        .map_err(|e| anyhow::anyhow!("{e} (host: {})", topo.source))?;
    for w in warnings {
        say(Said::Warning(w));
    }
    Ok(Some(guest))
}
