//! What every VMM emitter gets: the VM description, the decided guest layout and the
//! expectation for the guest agent.

use std::path::PathBuf;

use vfio_p2p_config::vm::{IommuBackend, VmConfig};
use vfio_p2p_config::vm_devices::{Disk, DiskBus};
use vfio_p2p_contract::{Expectation, FW_CFG_NAME};
use vfio_p2p_decide::address_space::GuestAddressSpace;
use vfio_p2p_decide::arm_pcie_guest::ArmPcieGuest;
use vfio_p2p_decide::grace_guest::GraceGuest;
use vfio_p2p_decide::guest_layout::GuestLayout;
use vfio_p2p_decide::vm::VmPlan;

/// How the expectation reaches QEMU's fw_cfg.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExpectationSource {
    /// A file written next to the configuration (`--expect-out`).
    File(PathBuf),
    /// The JSON inline on the command line.
    Inline,
}

#[derive(Debug, Clone)]
pub struct VmDefinition<'a> {
    pub config: &'a VmConfig,
    pub layout: &'a GuestLayout,
    pub expectation: &'a Expectation,
    pub expectation_source: ExpectationSource,
    /// Size of the guest's 64-bit PCI MMIO window, bytes.
    pub hole64: u64,
    /// The guest's physical address width as decided for RAM and window.
    pub address_space: GuestAddressSpace,
    /// The backend decided for this VM: legacy or iommufd (`auto` is resolved before).
    pub iommu_backend: IommuBackend,
    /// A Grace host's guest: an aarch64 `virt` machine with the GPUs' NUMA nodes and
    /// vSMMUs; `None` for every other host, whose output is the x86 q35 one.
    pub grace: Option<&'a GraceGuest>,
    /// An aarch64 host's guest of PCIe GPUs (QEMU and libvirt): a `virt` machine with the
    /// x86 guest's PCIe tree; `None` elsewhere.
    pub arm_pcie: Option<&'a ArmPcieGuest>,
}

/// The arm64 UEFI firmware (Debian's qemu-efi-aarch64: AAVMF) a Grace guest boots with
/// where vm.yaml names no `ovmf_code` of its own.
pub const AAVMF_CODE: &str = "/usr/share/AAVMF/AAVMF_CODE.fd";
/// Its variable store template.
pub const AAVMF_VARS: &str = "/usr/share/AAVMF/AAVMF_VARS.fd";

/// The pcie.0 slot of the VM's NIC (`network:`); the guest layout uses 0x08 and up.
pub const NIC_SLOT: u8 = 0x02;
/// The pcie.0 slot of the first virtio disk; the next ones follow (up to
/// [`crate::config::vm_devices::MAX_VIRTIO_DISKS`]).
pub const FIRST_DISK_SLOT: u8 = 0x03;

/// The id of the `-object iommufd` every `vfio-pci` names under the iommufd backend.
pub const IOMMUFD_OBJECT_ID: &str = "iommufd0";

impl<'a> VmDefinition<'a> {
    /// What the emitters get of `plan`, the expectation reaching fw_cfg from `source`.
    pub fn of(plan: &'a VmPlan, source: ExpectationSource) -> VmDefinition<'a> {
        VmDefinition {
            config: &plan.spec.config,
            layout: &plan.layout,
            expectation: &plan.expectation,
            expectation_source: source,
            hole64: plan.hole64,
            address_space: plan.address_space.clone(),
            iommu_backend: plan.iommu_backend,
            grace: plan.grace.as_ref(),
            arm_pcie: plan.arm_pcie.as_ref(),
        }
    }

    /// vCPUs and memory (MiB) of guest NUMA node `index`: split evenly, the remainder on the first nodes.
    pub fn numa_share(&self, index: usize) -> (std::ops::Range<u32>, u64) {
        let n = self.layout.numa_nodes.len().max(1) as u32;
        let i = index as u32;
        let (per, extra) = (self.config.vcpus / n, self.config.vcpus % n);
        let start = i * per + i.min(extra);
        let count = per + u32::from(i < extra);
        let mem_per = self.config.memory_mib / u64::from(n);
        let mem = if i == 0 {
            self.config.memory_mib - mem_per * u64::from(n - 1)
        } else {
            mem_per
        };
        (start..start + count, mem)
    }

    /// The `-fw_cfg` option value carrying the expectation (QemuOpts syntax: commas doubled).
    pub fn fw_cfg_expectation(&self) -> String {
        let name = FW_CFG_NAME;
        match &self.expectation_source {
            ExpectationSource::File(p) => {
                format!(
                    "name={name},file={}",
                    p.display().to_string().replace(',', ",,")
                )
            }
            ExpectationSource::Inline => format!(
                "name={name},string={}",
                self.expectation.to_json().replace(',', ",,")
            ),
        }
    }

    /// The aarch64 firmware: vm.yaml's `ovmf_code` where it names one, else AAVMF's.
    pub fn aarch64_firmware(&self) -> String {
        let code = &self.config.ovmf_code;
        if code.as_path() == std::path::Path::new(vfio_p2p_config::vm::DEFAULT_OVMF_CODE) {
            AAVMF_CODE.to_string()
        } else {
            code.display().to_string()
        }
    }

    /// Size in GiB, rounded up (the unit the emitters print).
    pub fn hole64_gib(&self) -> u64 {
        self.hole64.div_ceil(1 << 30)
    }
}

/// The pcie.0 slot (virtio) or AHCI port (sata) of each disk, in order, and whether it boots.
pub fn disk_places(disks: &[Disk]) -> Vec<(&Disk, u8, bool)> {
    let (mut slot, mut port) = (FIRST_DISK_SLOT, 0u8);
    disks
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let at = match d.bus {
                DiskBus::Virtio => &mut slot,
                DiskBus::Sata => &mut port,
            };
            *at += 1;
            (d, *at - 1, i == 0)
        })
        .collect()
}

/// A vCPU range in QEMU/libvirt cpulist syntax.
pub fn cpulist(range: &std::ops::Range<u32>) -> String {
    match range.len() {
        0 => String::new(),
        1 => range.start.to_string(),
        _ => format!("{}-{}", range.start, range.end - 1),
    }
}
