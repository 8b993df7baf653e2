//! What the checks look at, gathered before they run: the live host's probes
//! ([`HostFacts`], by `host_probe`) and how the VM will be started ([`VmmFacts`]).

use std::collections::BTreeMap;

use pci_config::Bdf;

pub use crate::model::vmm::QemuVersion;

/// A probe that could not run, and why (a snapshot has no `/dev`, an example no host).
pub type NotProbed = String;

/// Where the vfio-pci driver is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModuleState {
    Loaded,
    BuiltIn,
    /// Not loaded, but its module file is listed in `modules.dep` (path given).
    Available(String),
    /// Looked in these places and found nothing.
    Missing(String),
    Unknown(NotProbed),
}

/// Result of opening a device node and asking it something.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeProbe<T> {
    Ok(T),
    /// The node does not exist (path given).
    Absent(String),
    /// It exists but the open or ioctl failed (path and error).
    Error(String),
    Unknown(NotProbed),
}

/// What the live host showed, gathered by `host_probe`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostFacts {
    pub vfio_pci: ModuleState,
    /// `/dev/vfio/vfio`: the VFIO API version.
    pub vfio_container: NodeProbe<i32>,
    /// `/dev/vfio/N` per IOMMU group of a selected GPU: viable?
    pub groups: BTreeMap<u32, NodeProbe<bool>>,
    /// KVM: its API version once a VM accepted a KVM-VFIO device; `Error` names the failing step.
    pub kvm: NodeProbe<i32>,
    /// `--deep`: per GPU, what opening it through VFIO showed (`Ok(resettable)`).
    pub deep: BTreeMap<Bdf, NodeProbe<bool>>,
    /// What the kernel offers for the iommufd backend.
    pub iommu: IommuFacts,
}

/// A kernel option as the running kernel's config (`/boot/config-<release>`, `/proc/config.gz`) sets it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelOption {
    BuiltIn,
    Module,
    /// `# CONFIG_… is not set`, or not in the file at all.
    Off,
}

/// The options of the running kernel's config that the iommufd backend depends on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelConfig {
    /// The file they were read from.
    pub path: String,
    pub iommufd: KernelOption,
    pub vfio_device_cdev: KernelOption,
    pub vfio_pci_dmabuf: KernelOption,
}

/// `/dev/iommu`, the VFIO device cdevs and the kernel behind them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IommuFacts {
    /// `/dev/iommu` (the iommufd character device).
    pub dev_iommu: NodeProbe<()>,
    /// `/dev/vfio/devices/vfio*`: one per device bound to a VFIO driver on a kernel with
    /// `CONFIG_VFIO_DEVICE_CDEV`.
    pub vfio_cdevs: NodeProbe<Vec<String>>,
    /// `proc/sys/kernel/osrelease`.
    pub kernel_release: Option<String>,
    /// `boot/config-<release>`, else `proc/config.gz`, when readable.
    pub kernel_config: Option<KernelConfig>,
}

impl IommuFacts {
    /// Nothing known (an embedded example, a snapshot file).
    pub fn not_probed(why: &str) -> Self {
        IommuFacts {
            dev_iommu: NodeProbe::Unknown(why.to_string()),
            vfio_cdevs: NodeProbe::Unknown(why.to_string()),
            kernel_release: None,
            kernel_config: None,
        }
    }
}

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
    /// The 64-bit MMIO window configured, and where it was found.
    pub hole64: Option<(u64, String)>,
    /// The language of the VM definition given, for the fixes.
    pub syntax: ConfigSyntax,
    /// `--iommu-backend`, if given.
    pub iommu_backend: Option<crate::config::vm::IommuBackend>,
}
