//! NVIDIA Fabric Manager's view of an NVSwitch board, as the readers make it: its
//! partitions (`read::fm_capture`, FM's live API, the embedded examples' tables) and
//! its config file (`read::fm_config`), and on NVLink-5 boards the NVLink Subnet Manager
//! beside it (`read::host_probe::nvlsm`).
//!
//! FM names a GPU by its *physical id* (the baseboard module id NVML reports as
//! `nvmlDeviceGetModuleId`) and, when FM can see it, its PCI address.

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
    #[serde(default)]
    pub bdf: Option<Bdf>,
    /// NVLinks of this GPU that FM found trained / the most it can have.
    #[serde(default)]
    pub nvlinks_available: u32,
    #[serde(default)]
    pub nvlinks_max: u32,
}

/// One of FM's predefined partitions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FabricPartition {
    pub id: u32,
    pub gpus: Vec<PartitionGpu>,
    /// Activated (for some VM) right now.
    #[serde(default)]
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

    /// Gives every GPU FM listed without a PCI address (H100 and later boards) the one
    /// host.yaml's `fabric_manager: modules:` maps its module id to.
    pub fn apply_module_addresses(&mut self, modules: &std::collections::BTreeMap<u32, Bdf>) {
        for g in self.partitions.iter_mut().flat_map(|p| &mut p.gpus) {
            if g.bdf.is_none() {
                g.bdf = modules.get(&g.module_id).copied();
            }
        }
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

/// The NVLink Subnet Manager (NVLSM) beside Fabric Manager on an NVLink-5 board
/// (`read::host_probe::nvlsm`), as the preflight sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum NvlsmProbe {
    /// Not looked at (an example, a snapshot, no NVLink-5 GPU on the host): why.
    NotProbed(String),
    Probed(NvlsmFacts),
}

/// What the host shows of NVLSM and Fabric Manager: installed files, ib_umad, the
/// running daemons.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct NvlsmFacts {
    /// NVLSM's binary, where installed.
    pub nvlsm_binary: Option<String>,
    /// Fabric Manager's binary, where installed.
    pub fm_binary: Option<String>,
    /// `/sys/class/infiniband_mad` exists: `ib_umad` is loaded, without which NVLSM
    /// cannot send its management datagrams.
    pub umad: bool,
    /// The running `nvlsm`, if any.
    pub nvlsm: Option<Daemon>,
    /// The running `nv-fabricmanager`, if any.
    pub fm: Option<Daemon>,
}

/// A running daemon, from `/proc/PID/cmdline`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Daemon {
    pub pid: u32,
    /// The management port GUID on its command line (`-g`, `--guid`,
    /// `--fm-sm-mgmt-port-guid`): the ConnectX-7 bridge port FM and NVLSM must share.
    pub port_guid: Option<u64>,
}
