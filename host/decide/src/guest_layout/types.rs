//! What a decided guest PCIe tree is: its bridges, devices and NUMA nodes, and the slots
//! and bus ranges of the root bus they are placed on.

use pci_config::Bdf;
use serde::Serialize;

use vfio_p2p_config::vm::GuestTopology;
use vfio_p2p_model::HostBridgeId;

/// First `pcie.0` slot for expander buses: above QEMU's default VGA (1) and NIC (2).
pub const EXPANDER_FIRST_SLOT: u8 = 0x08;
/// First `pcie.0` slot for root ports; slots up to 0x1e are usable (0x1f is the LPC/SATA/SMBus slot).
pub const ROOT_PORT_FIRST_SLOT: u8 = 0x10;
pub(super) const ROOT_BUS_LAST_SLOT: u8 = 0x1e;
/// Bus numbers between consecutive expander buses: room for the ports and switches below each.
pub const EXPANDER_BUS_STRIDE: u8 = 0x20;
/// The guest's root bus, as QEMU and libvirt name it.
pub const ROOT_BUS: &str = "pcie.0";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayoutOptions {
    pub topology: GuestTopology,
    /// Give the guest one NUMA node per host NUMA node holding a chosen GPU (mirror only).
    pub guest_numa: bool,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LayoutError {
    #[error("{0} is not a GPU on this host; list them with `vfio-p2p topo`")]
    NotAGpu(Bdf),
    #[error("no GPU chosen; pass --gpus BDF,... or list them under `gpus:` in the VM config")]
    NoGpus,
    #[error("{count} root ports do not fit on the guest's root bus (at most {max}); use --guest-topology mirror or fewer GPUs")]
    RootBusFull { count: usize, max: usize },
    #[error("{count} host NUMA nodes need more PCIe expander buses than fit (at most {max})")]
    TooManyExpanders { count: usize, max: usize },
    #[error("the guest tree below {bridge} needs {needed} bus numbers but only {available} are free before the next range; choose fewer GPUs or --guest-topology flat")]
    BusRangeFull {
        bridge: String,
        needed: usize,
        available: usize,
    },
    #[error("{0} is not a network device on this host (PCI class 02); list the NICs with `vfio-p2p topo`")]
    NotANic(Bdf),
    #[error("{0} shares a slot with the GPU {1}, which takes its functions along; drop it from the NICs")]
    NicInGpuSlot(Bdf, Bdf),
    #[error("more than 32 guest ports below {0}")]
    BusFull(String),
}

/// A guest NUMA node and the host node it stands for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GuestNumaNode {
    pub id: u32,
    pub host_node: u32,
    /// The host node's CPUs (cpulist), where the guest node's vCPUs are pinned; `None`
    /// when the host did not say.
    pub host_cpus: Option<String>,
}

/// An emulated bridge in the guest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "model")]
pub enum GuestBridgeKind {
    /// `pxb-pcie`: an extra root bus numbered from `bus_nr`, for one host root complex.
    Expander {
        /// The host root complex it stands for.
        host_bridge: HostBridgeId,
        /// That complex's NUMA node on the host.
        host_node: Option<u32>,
        /// Guest NUMA node, when the guest has NUMA nodes.
        numa_node: Option<u32>,
    },
    /// `pcie-root-port`.
    RootPort { chassis: u8, port: u8 },
    /// `x3130-upstream`.
    SwitchUpstream,
    /// `xio3130-downstream`.
    SwitchDownstream { chassis: u8, port: u8 },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GuestBridge {
    /// QEMU device id (also the bus name of what it provides).
    pub id: String,
    pub kind: GuestBridgeKind,
    /// Bus it plugs into: [`ROOT_BUS`] or another bridge's id.
    pub parent: String,
    /// Device number on the parent bus.
    pub slot: u8,
    /// Guest bus number it provides: the expander's root bus, or the port's secondary bus.
    pub bus: u8,
    /// The host bridge it mirrors (`None` for expanders and ports made up for flat layouts).
    pub host: Option<Bdf>,
}

/// One function of a passed-through device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GuestFunction {
    pub host: Bdf,
    pub guest: Bdf,
    /// QEMU device id.
    pub id: String,
}

/// A passed-through device (a GPU, or a NIC passed with the GPUs) with its other
/// functions (a GPU's audio, a NIC's other named ports), kept in one guest slot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GuestDevice {
    pub host: Bdf,
    pub guest: Bdf,
    /// QEMU device id of the first function (`gpuN`, `nicN`).
    pub id: String,
    /// Bridge whose bus it plugs into.
    pub parent: String,
    /// The GPUDirect clique (GPUs only; a NIC never carries one).
    pub clique: Option<u8>,
    pub vendor: u16,
    pub device: u16,
    pub class: u32,
    /// Guest NUMA node of its expander bus, if any.
    pub numa_node: Option<u32>,
    /// Host NUMA node.
    pub host_numa_node: Option<u32>,
    /// The other functions of the slot (function 0 first if the GPU is not it).
    pub other_functions: Vec<GuestFunction>,
}

/// A passed-through GPU.
pub type GuestGpu = GuestDevice;
/// A NIC (or SR-IOV VF) passed with the GPUs: placed like them, never in a clique.
pub type GuestNic = GuestDevice;

impl GuestDevice {
    /// Whether the guest slot holds several functions (`multifunction=on` on function 0).
    pub fn multifunction(&self) -> bool {
        !self.other_functions.is_empty()
    }
}

/// The decided guest PCIe tree.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GuestLayout {
    pub topology: GuestTopology,
    pub numa_nodes: Vec<GuestNumaNode>,
    /// Parents before children.
    pub bridges: Vec<GuestBridge>,
    /// In host BDF order.
    pub gpus: Vec<GuestGpu>,
    /// NICs passed with the GPUs, in host BDF order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub nics: Vec<GuestNic>,
    /// The machine as it is (`as_is`): guest addresses and paths are the host's.
    #[serde(skip)]
    pub as_is: bool,
}

impl GuestLayout {
    pub fn bridge(&self, id: &str) -> Option<&GuestBridge> {
        self.bridges.iter().find(|b| b.id == id)
    }

    /// The GPUs at their host addresses with no emulated bridges: the machine as it is,
    /// for describing it to software running on it (NCCL on the host or in an existing VM).
    pub fn as_is(&mut self) {
        self.bridges.clear();
        self.numa_nodes.clear();
        self.as_is = true;
        for g in self.gpus.iter_mut().chain(&mut self.nics) {
            g.guest = g.host;
            g.parent = ROOT_BUS.to_string();
            g.numa_node = g.host_numa_node;
            for f in &mut g.other_functions {
                f.guest = f.host;
            }
        }
    }

    /// Every passed device: the GPUs, then the NICs.
    pub fn passed(&self) -> impl Iterator<Item = &GuestDevice> {
        self.gpus.iter().chain(&self.nics)
    }

    /// Ancestor bridges of a passed device, top first.
    pub fn ancestors(&self, gpu: &GuestDevice) -> Vec<&GuestBridge> {
        let mut chain = Vec::new();
        let mut cur = self.bridge(&gpu.parent);
        while let Some(b) = cur {
            chain.push(b);
            cur = self.bridge(&b.parent);
        }
        chain.reverse();
        chain
    }
}
