//! How the VM will be started ([`VmmFacts`]), gathered before the checks run; the live
//! host's probes are `model::host_facts`.

use pci_config::Bdf;
use vfio_p2p_model::vmm::QemuVersion;

/// Which VMM will run the VM.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Vmm {
    #[default]
    Qemu,
    CloudHypervisor,
}

/// The language of the VM definition that was checked: its fixes are written in it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ConfigSyntax {
    /// QEMU arguments (`--qemu-args`, or nothing given).
    #[default]
    Qemu,
    /// A libvirt domain XML, with the file's name for `libvirt patch`.
    Libvirt(String),
    /// A Proxmox VE VM config.
    Proxmox,
}

/// What the VM will be started with.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VmmFacts {
    pub vmm: Vmm,
    /// `--qemu PATH`: its `--version` line, parsed (`Err` carries what was wrong).
    pub qemu_version: Option<Result<QemuVersion, String>>,
    /// Where the hypervisor is hidden from the guest (`kvm=off`, `<hidden state='on'/>`).
    pub hidden_hypervisor: Vec<String>,
    /// What VM configuration was given (`--domain-xml FILE`, `--qemu-args`), if any: with
    /// one given and no 64-bit hole in it, QEMU's default window applies.
    pub vm_config: Option<String>,
    /// The 64-bit MMIO window configured, and where it was found (on an Arm `virt`
    /// machine: its `highmem-mmio-size`).
    pub hole64: Option<(u64, String)>,
    /// The VM is an Arm `virt` machine (a Grace guest): its GPUs' BARs go in the high PCIe
    /// window `highmem-mmio-size` sets, 512 GiB when it is not set (hw/arm/virt.c), not
    /// in q35's `pci-hole64-size`.
    pub arm_virt: bool,
    /// The language of the VM definition given, for the fixes.
    pub syntax: ConfigSyntax,
    /// `--iommu-backend`, if given.
    pub iommu_backend: Option<vfio_p2p_config::vm::IommuBackend>,
    /// The VM's RAM in bytes (`--memory-gib`), for the address-space check.
    pub ram: Option<u64>,
    /// The devices whoever starts the VM binds to vfio-pci itself.
    pub bound_at_start: StartBinding,
}

/// The devices the VM's starter binds to vfio-pci when the VM starts: libvirt's
/// `managed='yes'` hostdevs (virHostdevPreparePCIDevices detaches them), Proxmox's
/// `hostpciN` (qemu-server's prepare_pci_device binds them to vfio-pci), Incus's GPU and
/// PCI devices (bound to vfio-pci when the VM starts). On a fresh host they are still on
/// their drivers, which is no problem as long as every other group member is free.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StartBinding {
    /// Who binds them, as the operator knows it ("libvirt (managed='yes')").
    pub by: String,
    pub devices: Vec<Bdf>,
}

impl StartBinding {
    pub fn binds(&self, bdf: &Bdf) -> bool {
        self.devices.contains(bdf)
    }
}
