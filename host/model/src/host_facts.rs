//! What the live host showed, probed by `host_probe` before any check runs: the vfio-pci
//! module, the VFIO and KVM device nodes, the IOMMU groups and the iommufd backend.

use std::collections::BTreeMap;

use pci_config::Bdf;

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
    /// What a Grace host's GPUs need beyond vfio-pci.
    pub grace: GraceFacts,
}

/// A Grace host's driver and GPU memory state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GraceFacts {
    /// `nvgrace_gpu_vfio_pci` (module `nvgrace-gpu-vfio-pci`, drivers/vfio/pci/nvgrace-gpu),
    /// the VFIO driver of a Grace superchip's GPU.
    pub nvgrace_module: ModuleState,
    /// `/proc/iomem`'s "System RAM (NVIDIA)" ranges (start, end): GPU memory the `nvidia`
    /// driver onlined, which must be offline before the GPU leaves it.
    pub nvidia_system_ram: NodeProbe<Vec<(u64, u64)>>,
}

impl GraceFacts {
    /// Nothing known (an embedded example, a snapshot file).
    pub fn not_probed(why: &str) -> Self {
        GraceFacts {
            nvgrace_module: ModuleState::Unknown(why.to_string()),
            nvidia_system_ram: NodeProbe::Unknown(why.to_string()),
        }
    }
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
    /// `CONFIG_PCI_P2PDMA`, which `VFIO_PCI_DMABUF` depends on.
    pub pci_p2pdma: KernelOption,
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
