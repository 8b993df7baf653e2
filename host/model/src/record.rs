//! The facts read from one host, before any interpretation.
//!
//! A [`HostRecord`] is what the sysfs reader produces, what `snapshot` writes back
//! as a sysfs tree, and what the embedded examples are made of, so live hosts,
//! snapshots and examples all go through the same model code.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use pci_config::Bdf;
use serde::{Deserialize, Serialize};

/// A host bridge (root complex): the `pciDDDD:BB` directory under `sys/devices`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HostBridgeId {
    pub domain: u16,
    pub bus: u8,
}

impl fmt::Display for HostBridgeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "pci{:04x}:{:02x}", self.domain, self.bus)
    }
}

impl FromStr for HostBridgeId {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || format!("'{s}' is not a host bridge directory name (pciDDDD:BB)");
        let rest = s.strip_prefix("pci").ok_or_else(bad)?;
        let (d, b) = rest.split_once(':').ok_or_else(bad)?;
        if d.len() != 4 || b.len() != 2 {
            return Err(bad());
        }
        Ok(HostBridgeId {
            domain: u16::from_str_radix(d, 16).map_err(|_| bad())?,
            bus: u8::from_str_radix(b, 16).map_err(|_| bad())?,
        })
    }
}

impl Serialize for HostBridgeId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for HostBridgeId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

/// One line of sysfs `resource`: a BAR or bridge window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resource {
    pub start: u64,
    pub end: u64,
    pub flags: u64,
}

impl Resource {
    const IORESOURCE_IO: u64 = 0x100;
    const IORESOURCE_MEM: u64 = 0x200;
    const IORESOURCE_PREFETCH: u64 = 0x2000;
    const IORESOURCE_MEM_64: u64 = 0x0010_0000;

    pub fn size(&self) -> u64 {
        if self.end > self.start {
            self.end - self.start + 1
        } else {
            0
        }
    }
    pub fn is_memory(&self) -> bool {
        self.flags & Self::IORESOURCE_MEM != 0
    }
    pub fn is_io(&self) -> bool {
        self.flags & Self::IORESOURCE_IO != 0
    }
    pub fn is_64bit(&self) -> bool {
        self.flags & Self::IORESOURCE_MEM_64 != 0
    }
    pub fn is_prefetchable(&self) -> bool {
        self.flags & Self::IORESOURCE_PREFETCH != 0
    }
    /// Flags for a 64-bit prefetchable memory BAR, as the kernel reports a GPU's VRAM BAR.
    pub const MEM64_PREFETCH: u64 =
        Self::IORESOURCE_MEM | Self::IORESOURCE_PREFETCH | Self::IORESOURCE_MEM_64 | 0x0c;
    /// Flags for a 32-bit non-prefetchable memory BAR.
    pub const MEM32: u64 = Self::IORESOURCE_MEM;
}

/// Everything read about one PCI function. Text attributes are kept parsed but
/// uninterpreted; `None` means the file was absent or unreadable (a warning says which).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceRecord {
    pub bdf: Bdf,
    pub host_bridge: HostBridgeId,
    /// Bridges between the host bridge and this function, top first.
    pub ancestors: Vec<Bdf>,
    pub vendor: u16,
    pub device: u16,
    pub class: u32,
    #[serde(default)]
    pub subsystem_vendor: Option<u16>,
    #[serde(default)]
    pub subsystem_device: Option<u16>,
    /// Config space as readable (64 bytes unprivileged, 256 or 4096 as root).
    #[serde(with = "hex_bytes", default)]
    pub config: Vec<u8>,
    #[serde(default)]
    pub numa_node: Option<u32>,
    #[serde(default)]
    pub local_cpulist: Option<String>,
    #[serde(default)]
    pub iommu_group: Option<u32>,
    #[serde(default)]
    pub driver: Option<String>,
    #[serde(default)]
    pub driver_override: Option<String>,
    #[serde(default)]
    pub resources: Vec<Resource>,
    #[serde(default)]
    pub current_link_speed: Option<String>,
    #[serde(default)]
    pub current_link_width: Option<u8>,
    #[serde(default)]
    pub max_link_speed: Option<String>,
    #[serde(default)]
    pub max_link_width: Option<u8>,
    #[serde(default)]
    pub reset_method: Option<Vec<String>>,
}

/// Something odd seen while reading, tied to the device and file it concerns.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadWarning {
    #[serde(default)]
    pub device: Option<Bdf>,
    #[serde(default)]
    pub file: Option<String>,
    pub message: String,
}

impl fmt::Display for ReadWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.device, &self.file) {
            (_, Some(file)) => write!(f, "{file}: {}", self.message),
            (Some(d), None) => write!(f, "{d}: {}", self.message),
            (None, None) => f.write_str(&self.message),
        }
    }
}

/// All facts read from one host.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostRecord {
    /// Where the facts came from (a sysfs root, a snapshot, an example name).
    pub source: String,
    /// Ordered by BDF.
    pub devices: Vec<DeviceRecord>,
    /// NUMA node → its CPU list (`sys/devices/system/node/nodeN/cpulist`).
    #[serde(default)]
    pub numa_nodes: BTreeMap<u32, String>,
    /// Kernel command line, when readable (`proc/cmdline`).
    #[serde(default)]
    pub kernel_cmdline: Option<String>,
    /// The CPU, when known (`proc/cpuinfo`, read by `read::cpuinfo`).
    #[serde(default)]
    pub cpu: Option<super::CpuIdentity>,
    #[serde(default)]
    pub warnings: Vec<ReadWarning>,
    /// The names host drivers give each network function (`net/`, `infiniband/` below
    /// the device); absent for NICs without a host driver (bound to vfio-pci).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub nic_names: BTreeMap<Bdf, NicNames>,
    /// NUMA node → its distances to every node in node order (`nodeN/distance`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub numa_distances: BTreeMap<u32, Vec<u32>>,
    /// The IOMMU each device sits behind: the name its `iommu` link points at
    /// (`smmu3.0x0000000016000000` for an Arm SMMUv3), where the kernel shows one.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub iommu_units: BTreeMap<Bdf, String>,
    /// Huge page sizes the kernel offers, KiB (`sys/kernel/mm/hugepages/hugepages-<N>kB`):
    /// 2048 and 1048576 on a 4 KiB-page kernel, 524288 on a 64 KiB-page arm64 kernel.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hugepage_sizes_kib: Vec<u64>,
}

impl HostRecord {
    /// What a non-root user sees: 64 bytes of config space per device.
    pub fn unprivileged_view(&self) -> HostRecord {
        let mut h = self.clone();
        for d in &mut h.devices {
            d.config.truncate(pci_config::CONFIG_SPACE_UNPRIVILEGED);
        }
        h
    }
}

/// A NIC's names on the host: its network interfaces and RDMA devices.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NicNames {
    /// Network interfaces (`net/NAME`), e.g. `ens1f0np0`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub net: Vec<String>,
    /// RDMA devices (`infiniband/NAME`), e.g. `mlx5_0`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rdma: Vec<String>,
}

mod hex_bytes {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(b: &[u8], s: S) -> Result<S::Ok, S::Error> {
        let mut out = String::with_capacity(b.len() * 2);
        for x in b {
            out.push_str(&format!("{x:02x}"));
        }
        s.serialize_str(&out)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let s = String::deserialize(d)?;
        pci_config::parse_hex_dump(&s).map_err(serde::de::Error::custom)
    }
}
