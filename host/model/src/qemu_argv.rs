//! A QEMU command line's `vfio-pci` devices and the cliques already set on them, as
//! `read::qemu_argv` reads them; `qemu-wrap` decides on them and `emit::qemu_argv_patch` edits them.

use pci_config::Bdf;

/// How a `-device` argument is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceSyntax {
    /// `{"driver":"vfio-pci",…}` (QEMU ≥ 6.0; what libvirt ≥ 7.9 writes).
    Json,
    /// `vfio-pci,host=…,id=…` (QemuOpts; `,,` is a literal comma).
    KeyValue,
}

/// The device types that are QEMU's vfio-pci (`vfio-pci-nohotplug` is its subclass with
/// the same properties, `x-nv-gpudirect-clique` among them).
pub const VFIO_PCI_DRIVERS: [&str; 2] = ["vfio-pci", "vfio-pci-nohotplug"];

/// Where a device's clique comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CliqueSource {
    /// The device's own property.
    Device,
    /// `-set device.ID.x-nv-gpudirect-clique=K`.
    Set,
    /// `-global DRIVER.x-nv-gpudirect-clique=K` (the default of every such device).
    Global,
}

/// One `vfio-pci` device of the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VfioDevice {
    /// Index in the argv (program excluded) of the `-device` value.
    pub arg_index: usize,
    pub syntax: DeviceSyntax,
    /// `vfio-pci` or `vfio-pci-nohotplug`.
    pub driver: String,
    pub id: Option<String>,
    /// `host=` or the address ending `sysfsdev=`; `None` when neither names one.
    pub host: Option<Bdf>,
    /// The clique value already set, in the device, through `-set` or `-global`.
    pub clique: Option<String>,
    /// Where `clique` comes from.
    pub clique_source: Option<CliqueSource>,
}

/// What a QEMU command line says that vfio-p2p uses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QemuArgvFacts {
    pub vfio: Vec<VfioDevice>,
    /// `-device` values that are not readable (bad JSON): named in the log, left alone.
    pub unreadable: Vec<String>,
    /// Every `-set device.ID.x-nv-gpudirect-clique=K` as (ID, K), in order, whether or not
    /// ID is a `vfio-pci` device of this command line (libvirt and Proxmox name theirs).
    pub set_cliques: Vec<(String, String)>,
    /// `-cpu` values with `kvm=off`: the hypervisor hidden from the guest driver.
    pub hidden_cpu: Vec<String>,
    /// The first `pci-hole64-size=SIZE`, in bytes, and the index of its argument.
    pub hole64: Option<(usize, u64)>,
    /// The first `highmem-mmio-size=SIZE` (Arm `virt`'s high PCIe MMIO window), in bytes,
    /// and the index of its argument.
    pub highmem_mmio: Option<(usize, u64)>,
    /// The machine type `-machine`/`-M` names (`virt`, `q35`, `pc-q35-7.2`), if any.
    pub machine: Option<String>,
}

impl QemuArgvFacts {
    /// [`QemuArgvFacts::hidden_cpu`] as findings say it.
    pub fn hidden_hypervisor(&self) -> impl Iterator<Item = String> + '_ {
        self.hidden_cpu
            .iter()
            .map(|cpu| format!("QEMU argument -cpu {cpu}"))
    }

    /// `-machine` names QEMU's Arm `virt` machine ([`crate::vmm::is_arm_virt`]).
    pub fn is_arm_virt(&self) -> bool {
        (self.machine.as_deref()).is_some_and(|m| crate::vmm::is_arm_virt(None, m))
    }

    /// The size of the window the GPUs' 64-bit BARs go in, where the command line sets it:
    /// on an Arm `virt` machine (`arm_virt`, which another definition of the VM may say) its
    /// `highmem-mmio-size`, elsewhere `pci-hole64-size`.
    pub fn mmio_window(&self, arm_virt: bool) -> Option<u64> {
        let window = if arm_virt {
            self.highmem_mmio
        } else {
            self.hole64
        };
        window.map(|(_, bytes)| bytes)
    }
}
