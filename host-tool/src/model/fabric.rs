//! NVIDIA Fabric Manager's view of an NVSwitch board: its partitions.
//!
//! Produced by the FM readers (live API or a capture) and by the embedded examples'
//! partition tables; consumed by planning (`place`, `plan`, `check`), the hook's
//! activation and the expectation. FM names a GPU by its *physical id* (the baseboard
//! module id NVML reports as `nvmlDeviceGetModuleId`) and, when FM can see it, its PCI
//! address.

use pci_config::Bdf;
use serde::{Deserialize, Serialize};

/// One GPU of a partition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PartitionGpu {
    /// FM's physical id: the baseboard module id (1-based on HGX boards).
    pub module_id: u32,
    /// The GPU's PCI address on the host, when known (FM lists it; an embedded table
    /// maps module ids to the example's addresses).
    pub bdf: Option<Bdf>,
    /// NVLinks of this GPU that FM found trained / the most it can have.
    pub nvlinks_available: u32,
    pub nvlinks_max: u32,
}

/// One of FM's predefined partitions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FabricPartition {
    pub id: u32,
    pub gpus: Vec<PartitionGpu>,
    /// Activated (for some VM) right now.
    pub active: bool,
}

/// Everything FM says about the board, read once.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FabricState {
    /// FM's version, when the source tells it.
    #[serde(default)]
    pub fm_version: Option<String>,
    /// The partitions FM supports on this board as it is now.
    pub partitions: Vec<FabricPartition>,
    /// Partition ids FM lists as unsupported (a GPU or NVSwitch missing or degraded).
    #[serde(default)]
    pub unsupported: Vec<u32>,
    /// GPUs (by PCI address) with NVLinks FM could not train.
    #[serde(default)]
    pub nvlink_failed_gpus: Vec<Bdf>,
}

impl FabricPartition {
    /// The partition's GPUs by PCI address, sorted; `None` when FM did not tell one.
    pub fn bdfs(&self) -> Option<Vec<Bdf>> {
        let mut all: Vec<Bdf> = self.gpus.iter().map(|g| g.bdf).collect::<Option<_>>()?;
        all.sort_unstable();
        Some(all)
    }

    /// Module ids, sorted, as FM's tables write them (`1, 3`).
    pub fn module_list(&self) -> String {
        let mut ids: Vec<u32> = self.gpus.iter().map(|g| g.module_id).collect();
        ids.sort_unstable();
        ids.iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    }
}

impl FabricState {
    /// The partition whose GPUs are exactly `gpus` (any order).
    pub fn partition_of(&self, gpus: &[Bdf]) -> Option<&FabricPartition> {
        let mut want = gpus.to_vec();
        want.sort_unstable();
        want.dedup();
        self.partitions
            .iter()
            .find(|p| p.bdfs().is_some_and(|b| b == want))
    }

    /// A GPU's module id, from any partition that lists it.
    pub fn module_id(&self, bdf: &Bdf) -> Option<u32> {
        self.partitions
            .iter()
            .flat_map(|p| &p.gpus)
            .find(|g| g.bdf.as_ref() == Some(bdf))
            .map(|g| g.module_id)
    }
}

/// NVIDIA Fabric Manager's two virtualization models that vfio-p2p plans for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FabricModel {
    /// NVSwitches stay with FM on the host (or a service VM); a VM's GPUs are one of
    /// FM's partitions, activated before it starts.
    SharedNvswitch,
    /// The NVSwitches go into the VM with the whole baseboard; FM runs in the guest.
    FullPassthrough,
}

impl FabricModel {
    /// `shared-nvswitch` / `full-passthrough`: the host config's words.
    pub fn name(self) -> &'static str {
        match self {
            FabricModel::SharedNvswitch => "shared-nvswitch",
            FabricModel::FullPassthrough => "full-passthrough",
        }
    }
}

/// What this run knows of the board's fabric, settled once when the context is built.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Fabric {
    /// The model planning follows (`fabric:` with `auto` resolved); `None`: no fabric
    /// management (PCIe, direct NVLink, or FM not known).
    pub model: Option<FabricModel>,
    /// FM's partitions, when they were read (an embedded example's table, a capture).
    pub state: Option<FabricState>,
    /// Where `state` came from, or why FM was not read.
    pub source: String,
}

impl Fabric {
    /// FM's partitions when planning must follow them (shared NVSwitch, partitions known).
    pub fn partitions(&self) -> Option<&FabricState> {
        match self.model {
            Some(FabricModel::SharedNvswitch) => self.state.as_ref(),
            _ => None,
        }
    }
}

/// Fabric Manager's config file on the host, as the preflight sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FmConfigFile {
    /// Not looked at (an embedded example, a snapshot file): why.
    NotProbed(String),
    /// No `fabricmanager.cfg`: FM is not installed on this host.
    Absent,
    /// `FABRIC_MODE=` as written (`None`: missing, FM's default 0, bare metal).
    Present {
        path: String,
        fabric_mode: Option<u8>,
    },
}
