//! Model stage: the typed topology built from a [`HostRecord`].
//!
//! Host bridges → root ports → switch upstream/downstream ports → endpoints, with
//! each device's NUMA node, IOMMU group, driver, BARs, link and ACS state.

#![forbid(unsafe_code)]

pub mod cpu;
pub mod domain;
pub mod fabric;
pub mod fabric_state;
pub mod grace;
pub mod host_facts;
pub mod nic;
pub mod nvlink_map;
mod path;
pub mod qemu_argv;
pub mod record;
pub mod reset_policy;
pub mod vmm;

use std::collections::BTreeMap;

use pci_config::{AcsCapability, AtsCapability, Bdf, ConfigSpace, LinkSpeed, PciePortType};
use serde::Serialize;

pub use cpu::{CpuArch, CpuIdentity};
pub use nic::NicRef;
pub use nvlink_map::NvlinkMap;
pub use path::GpuPath;
pub use record::{DeviceRecord, HostBridgeId, HostRecord, NicNames, ReadWarning, Resource};
pub use reset_policy::ResetPolicy;

pub const VENDOR_NVIDIA: u16 = 0x10de;
/// Server BMC display controllers (ASPEED AST, Matrox G200): VGA for the console,
/// never a compute GPU, and nvidia-smi does not list them.
const BMC_VGA_VENDORS: [u16; 2] = [0x1a03, 0x102b];
/// NVIDIA's NVSwitch devices are class 0x0680 ("other bridge").
const CLASS_OTHER_BRIDGE: u32 = 0x0680;

/// What a PCI function is, for P2P planning.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum DeviceKind {
    /// Display (0x0300) or 3D (0x0302) controller, any vendor.
    Gpu {
        nvidia: bool,
    },
    /// An NVIDIA NVSwitch: its presence means a board-wide NVLink fabric.
    NvSwitch,
    /// Network controller (class 0x02): GPUDirect RDMA peers.
    Nic,
    /// A PCI-to-PCI bridge: root port or switch port.
    Bridge(BridgeRole),
    Other,
}

/// The role of a bridge in the PCIe tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BridgeRole {
    RootPort,
    /// A switch's upstream port: the switch itself, for path purposes.
    UpstreamPort,
    DownstreamPort,
    /// PCIe-to-PCI or other legacy bridge.
    PciBridge,
}

/// Negotiated and maximum link of a device (from sysfs, else from config space).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Link {
    pub current_speed: Option<LinkSpeed>,
    pub current_width: Option<u8>,
    pub max_speed: Option<LinkSpeed>,
    pub max_width: Option<u8>,
}

/// A BAR (resources 0..=5 of an endpoint).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Bar {
    pub index: u8,
    pub size: u64,
    pub is_64bit: bool,
    pub prefetchable: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct Device {
    pub bdf: Bdf,
    pub vendor: u16,
    pub device: u16,
    pub class: u32,
    pub kind: DeviceKind,
    /// PCIe device/port type, when config space beyond 64 bytes is readable.
    pub port_type: Option<PciePortType>,
    /// The bridge directly above, `None` for devices on a host bridge's root bus.
    pub parent: Option<Bdf>,
    pub host_bridge: HostBridgeId,
    pub numa_node: Option<u32>,
    pub local_cpulist: Option<String>,
    pub iommu_group: Option<u32>,
    pub driver: Option<String>,
    pub driver_override: Option<String>,
    pub bars: Vec<Bar>,
    pub link: Link,
    pub acs: Option<AcsCapability>,
    pub ats: Option<AtsCapability>,
    pub reset_methods: Option<Vec<String>>,
    /// Subsystem vendor and device (sysfs, else config space 0x2c of a type-0 header).
    #[serde(skip)]
    pub subsystem: Option<(u16, u16)>,
    /// Why a capability list ended badly (a loop, a pointer out of range): what was found
    /// before still counts, what was not is unknown, not absent.
    #[serde(skip)]
    pub capability_list_error: Option<String>,
    /// Config space bytes as read (length tells how much was visible).
    #[serde(skip)]
    pub config: Vec<u8>,
}

impl Device {
    pub fn config(&self) -> ConfigSpace<'_> {
        ConfigSpace::new(&self.config)
    }

    pub fn is_gpu(&self) -> bool {
        matches!(self.kind, DeviceKind::Gpu { .. })
    }

    pub fn is_nvidia_gpu(&self) -> bool {
        matches!(self.kind, DeviceKind::Gpu { nvidia: true })
    }

    pub fn bridge_role(&self) -> Option<BridgeRole> {
        match self.kind {
            DeviceKind::Bridge(r) => Some(r),
            _ => None,
        }
    }

    /// Sum of the 64-bit memory BARs: what must fit the guest's 64-bit MMIO window.
    pub fn bar64_total(&self) -> u64 {
        self.bars
            .iter()
            .filter(|b| b.is_64bit)
            .map(|b| b.size)
            .sum()
    }

    /// Whether the full config space (capabilities) was readable.
    pub fn config_complete(&self) -> bool {
        self.config.len() > pci_config::CONFIG_SPACE_UNPRIVILEGED
    }

    /// Why this device's ACS state cannot be known; `None` when `acs` is the truth
    /// (present, or absent).
    pub fn acs_unknown(&self) -> Option<AcsUnknown> {
        if !self.config_complete() {
            return Some(AcsUnknown::NotRoot);
        }
        match (&self.acs, &self.capability_list_error) {
            (None, Some(e)) => Some(AcsUnknown::CorruptCapabilityList(e.clone())),
            _ => None,
        }
    }
}

/// Why a device's ACS state is unknown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AcsUnknown {
    /// Config space beyond 64 bytes is readable only by root.
    NotRoot,
    /// The capability list ended badly (a loop, a bad pointer) before an ACS capability
    /// was found: "corrupt capability list: …" with the offset.
    CorruptCapabilityList(String),
}

/// A host bridge / root complex.
#[derive(Debug, Clone, Serialize)]
pub struct HostBridge {
    pub id: HostBridgeId,
    /// NUMA node of the devices below it (sysfs has none for the bridge itself).
    pub numa_node: Option<u32>,
}

/// An NVLink capture names a GPU this host does not have.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{source_name}: names GPU {bdf}, which is not a GPU on this host; was the file captured on another machine?")]
pub struct ForeignGpu {
    pub source_name: String,
    pub bdf: Bdf,
}

/// The typed topology of one host.
#[derive(Debug, Clone, Serialize)]
pub struct Topology {
    pub source: String,
    pub host_bridges: Vec<HostBridge>,
    pub devices: BTreeMap<Bdf, Device>,
    pub numa_nodes: BTreeMap<u32, String>,
    pub iommu_groups: BTreeMap<u32, Vec<Bdf>>,
    pub kernel_cmdline: Option<String>,
    pub cpu: Option<CpuIdentity>,
    /// NVLink count between GPU pairs (key ordered low, high), when known.
    pub nvlinks: BTreeMap<(Bdf, Bdf), u8>,
    pub warnings: Vec<ReadWarning>,
    /// Network functions' interface and RDMA device names on the host.
    pub nic_names: BTreeMap<Bdf, NicNames>,
    /// NUMA node → distances to every node, in node order (`nodeN/distance`).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub numa_distances: BTreeMap<u32, Vec<u32>>,
    /// The IOMMU unit each device sits behind (an Arm SMMUv3's name), where shown.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub iommu_units: BTreeMap<Bdf, String>,
    /// Huge page sizes the kernel offers, KiB.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub hugepage_sizes_kib: Vec<u64>,
    /// Each device's bridges from its root port down, computed once: pair paths of a
    /// host with n GPUs ask for them n² times.
    #[serde(skip)]
    chains: BTreeMap<Bdf, Vec<Bdf>>,
}

impl Topology {
    pub fn from_record(host: &HostRecord) -> Topology {
        let mut devices: BTreeMap<Bdf, Device> = host
            .devices
            .iter()
            .map(|r| (r.bdf, build_device(r)))
            .collect();
        infer_bridge_roles(&mut devices);
        let mut iommu_groups: BTreeMap<u32, Vec<Bdf>> = BTreeMap::new();
        for d in devices.values() {
            if let Some(g) = d.iommu_group {
                iommu_groups.entry(g).or_default().push(d.bdf);
            }
        }
        let mut host_bridges: BTreeMap<HostBridgeId, HostBridge> = BTreeMap::new();
        for d in devices.values() {
            let hb = host_bridges.entry(d.host_bridge).or_insert(HostBridge {
                id: d.host_bridge,
                numa_node: None,
            });
            if hb.numa_node.is_none() {
                hb.numa_node = d.numa_node;
            }
        }
        let mut topo = Topology {
            source: host.source.clone(),
            host_bridges: host_bridges.into_values().collect(),
            devices,
            numa_nodes: host.numa_nodes.clone(),
            iommu_groups,
            kernel_cmdline: host.kernel_cmdline.clone(),
            cpu: host.cpu.clone(),
            nvlinks: BTreeMap::new(),
            warnings: host.warnings.clone(),
            nic_names: host.nic_names.clone(),
            numa_distances: host.numa_distances.clone(),
            iommu_units: host.iommu_units.clone(),
            hugepage_sizes_kib: host.hugepage_sizes_kib.clone(),
            chains: BTreeMap::new(),
        };
        topo.warnings.extend(topo.devices.values().filter_map(|d| {
            let e = d.capability_list_error.as_ref()?;
            Some(ReadWarning {
                device: Some(d.bdf),
                file: None,
                message: format!("{e}; what it would list is unknown"),
            })
        }));
        topo.chains = topo
            .devices
            .keys()
            .map(|b| (*b, topo.ancestors(b).iter().map(|d| d.bdf).collect()))
            .collect();
        topo
    }

    /// The bridges above `bdf`, root port first (what [`Self::ancestors`] walks), cached.
    pub fn chain(&self, bdf: &Bdf) -> &[Bdf] {
        self.chains.get(bdf).map_or(&[], Vec::as_slice)
    }

    /// The NUMA node of host bridge `id` (`host_bridges` is sorted by id).
    pub fn host_bridge_numa(&self, id: HostBridgeId) -> Option<u32> {
        self.host_bridges
            .binary_search_by_key(&id, |h| h.id)
            .ok()
            .and_then(|i| self.host_bridges[i].numa_node)
    }

    /// The host's distance between NUMA nodes `a` and `b`, where `nodeN/distance` says it.
    pub fn numa_distance(&self, a: u32, b: u32) -> Option<u32> {
        let column = self.numa_nodes.keys().position(|n| *n == b)?;
        self.numa_distances.get(&a)?.get(column).copied()
    }

    pub fn device(&self, bdf: &Bdf) -> Option<&Device> {
        self.devices.get(bdf)
    }

    /// GPUs in BDF order (the order of `topo`'s matrix and JSON).
    /// Whether the host's CPU is aarch64 (its guests are `virt` machines, never q35).
    pub fn is_arm64(&self) -> bool {
        self.cpu.as_ref().map(|c| c.arch) == Some(CpuArch::Arm64)
    }

    pub fn gpus(&self) -> impl Iterator<Item = &Device> {
        self.devices.values().filter(|d| d.is_gpu())
    }

    pub fn nvswitches(&self) -> impl Iterator<Item = &Device> {
        self.devices
            .values()
            .filter(|d| d.kind == DeviceKind::NvSwitch)
    }

    /// Bridges from the host bridge down to `bdf`'s parent, top first.
    pub fn ancestors(&self, bdf: &Bdf) -> Vec<&Device> {
        let mut chain = Vec::new();
        let mut cur = self.devices.get(bdf).and_then(|d| d.parent);
        while let Some(p) = cur {
            let Some(dev) = self.devices.get(&p) else {
                break;
            };
            if chain.len() > 64 {
                break;
            }
            chain.push(dev);
            cur = dev.parent;
        }
        chain.reverse();
        chain
    }

    /// Other functions of the same slot (a GPU's audio or USB function).
    pub fn sibling_functions(&self, bdf: &Bdf) -> Vec<&Device> {
        self.devices
            .values()
            .filter(|d| d.bdf != *bdf && d.bdf.same_slot(bdf))
            .collect()
    }

    /// Members of `bdf`'s IOMMU group, itself included.
    pub fn group_members(&self, bdf: &Bdf) -> Vec<Bdf> {
        self.devices
            .get(bdf)
            .and_then(|d| d.iommu_group)
            .and_then(|g| self.iommu_groups.get(&g).cloned())
            .unwrap_or_default()
    }

    /// Records NVLink between two GPUs (symmetric).
    pub fn set_nvlink(&mut self, a: Bdf, b: Bdf, links: u8) {
        let key = if a <= b { (a, b) } else { (b, a) };
        self.nvlinks.insert(key, links);
    }

    /// Records the NVLinks of a capture, checking that every GPU it names is on this host.
    pub fn add_nvlinks(&mut self, map: &NvlinkMap) -> Result<(), ForeignGpu> {
        for &(a, b, _) in &map.links {
            if let Some(bdf) = [a, b]
                .into_iter()
                .find(|g| !self.device(g).is_some_and(|d| d.is_gpu()))
            {
                return Err(ForeignGpu {
                    source_name: map.source_name.clone(),
                    bdf,
                });
            }
        }
        for &(a, b, n) in &map.links {
            self.set_nvlink(a, b, n);
        }
        Ok(())
    }

    pub fn nvlink(&self, a: &Bdf, b: &Bdf) -> Option<u8> {
        let key = if a <= b { (*a, *b) } else { (*b, *a) };
        self.nvlinks.get(&key).copied()
    }
}

fn classify(r: &DeviceRecord, port_type: Option<PciePortType>, parent: Option<Bdf>) -> DeviceKind {
    let base = r.class >> 16;
    let sub = (r.class >> 8) & 0xff;
    match (base, sub) {
        (0x03, 0x00) if BMC_VGA_VENDORS.contains(&r.vendor) => DeviceKind::Other,
        // VGA (0x0300), 3D (0x0302) and other display controllers (0x0380), any vendor.
        (0x03, _) => DeviceKind::Gpu {
            nvidia: r.vendor == VENDOR_NVIDIA,
        },
        (0x02, _) => DeviceKind::Nic,
        (0x06, 0x04) | (0x06, 0x09) => DeviceKind::Bridge(match port_type {
            Some(PciePortType::RootPort) => BridgeRole::RootPort,
            Some(PciePortType::UpstreamPort) => BridgeRole::UpstreamPort,
            Some(PciePortType::DownstreamPort) => BridgeRole::DownstreamPort,
            Some(_) => BridgeRole::PciBridge,
            // Unknown without config space: fixed up by infer_bridge_roles().
            None if parent.is_none() => BridgeRole::RootPort,
            None => BridgeRole::PciBridge,
        }),
        _ if r.vendor == VENDOR_NVIDIA
            && (r.class >> 8 == CLASS_OTHER_BRIDGE
                || vfio_p2p_contract::nvidia_parts::nvswitch_gen(r.device).is_some()) =>
        {
            DeviceKind::NvSwitch
        }
        _ => DeviceKind::Other,
    }
}

fn build_device(r: &DeviceRecord) -> Device {
    let cfg = ConfigSpace::new(&r.config);
    let pcie = cfg.pcie();
    let parent = r.ancestors.last().copied();
    let port_type = pcie.map(|p| p.port_type);
    let sysfs_speed = |s: &Option<String>| s.as_deref().and_then(LinkSpeed::from_sysfs);
    let link = Link {
        current_speed: sysfs_speed(&r.current_link_speed).or(pcie.and_then(|p| p.current_speed)),
        current_width: r.current_link_width.or(pcie.and_then(|p| p.current_width)),
        max_speed: sysfs_speed(&r.max_link_speed).or(pcie.and_then(|p| p.max_speed)),
        max_width: r.max_link_width.or(pcie.and_then(|p| p.max_width)),
    };
    let bars = if r.class >> 8 == 0x0604 {
        &r.resources[..r.resources.len().min(2)]
    } else {
        &r.resources[..r.resources.len().min(6)]
    };
    let bars = bars
        .iter()
        .enumerate()
        .filter(|(_, res): &(usize, &Resource)| res.is_memory() && res.size() > 0)
        .map(|(i, res)| Bar {
            index: i as u8,
            size: res.size(),
            is_64bit: res.is_64bit(),
            prefetchable: res.is_prefetchable(),
        })
        .collect();
    Device {
        bdf: r.bdf,
        vendor: r.vendor,
        device: r.device,
        class: r.class,
        kind: classify(r, port_type, parent),
        port_type,
        parent,
        host_bridge: r.host_bridge,
        numa_node: r.numa_node,
        local_cpulist: r.local_cpulist.clone(),
        iommu_group: r.iommu_group,
        driver: r.driver.clone(),
        driver_override: r.driver_override.clone(),
        bars,
        link,
        acs: cfg.acs(),
        ats: cfg.ats(),
        reset_methods: r.reset_method.clone(),
        subsystem: subsystem(r),
        capability_list_error: capability_list_error(&cfg),
        config: r.config.clone(),
    }
}

fn subsystem(r: &DeviceRecord) -> Option<(u16, u16)> {
    if let (Some(v), Some(d)) = (r.subsystem_vendor, r.subsystem_device) {
        return Some((v, d));
    }
    let c = &r.config;
    let word = |at: usize| u16::from_le_bytes([c[at], c[at + 1]]);
    (c.len() >= 0x30 && c[0x0e] & 0x7f == 0).then(|| (word(0x2c), word(0x2e)))
}

/// "corrupt capability list: …" with the offset, when either list ends badly.
fn capability_list_error(cfg: &ConfigSpace) -> Option<String> {
    let (_, standard) = cfg.capabilities().collect_checked();
    let (_, extended) = cfg.extended_capabilities().collect_checked();
    let (list, e) = match (standard, extended) {
        (_, Some(e)) => ("extended", e),
        (Some(e), None) => ("standard", e),
        (None, None) => return None,
    };
    Some(format!("corrupt capability list: the {list} {e}"))
}

/// Without config space (non-root), bridge roles follow from the tree shape:
/// below a root or downstream port sits an upstream port, below that downstream ports.
fn infer_bridge_roles(devices: &mut BTreeMap<Bdf, Device>) {
    let bdfs: Vec<Bdf> = devices.keys().copied().collect();
    // Parents sort before children in sysfs BDF order only per bus, so walk top-down by depth.
    let depth = |d: &Device, all: &BTreeMap<Bdf, Device>| {
        let mut n = 0;
        let mut cur = d.parent;
        while let Some(p) = cur {
            n += 1;
            cur = all.get(&p).and_then(|x| x.parent);
            if n > 64 {
                break;
            }
        }
        n
    };
    let mut order: Vec<(usize, Bdf)> = bdfs
        .iter()
        .map(|b| (depth(&devices[b], devices), *b))
        .collect();
    order.sort();
    for (_, bdf) in order {
        let d = &devices[&bdf];
        if d.port_type.is_some() || !matches!(d.kind, DeviceKind::Bridge(_)) {
            continue;
        }
        let role = match d
            .parent
            .and_then(|p| devices.get(&p))
            .and_then(|p| p.bridge_role())
        {
            None if d.parent.is_none() => BridgeRole::RootPort,
            Some(BridgeRole::RootPort) | Some(BridgeRole::DownstreamPort) => {
                BridgeRole::UpstreamPort
            }
            Some(BridgeRole::UpstreamPort) => BridgeRole::DownstreamPort,
            _ => BridgeRole::PciBridge,
        };
        if let Some(d) = devices.get_mut(&bdf) {
            d.kind = DeviceKind::Bridge(role);
        }
    }
}
