//! NVIDIA Fabric Manager's view of an NVSwitch board: its partitions.
//!
//! Produced by the FM readers (live API or a capture) and by the embedded examples'
//! partition tables; consumed by planning (`place`, `plan`, `check`), the hook's
//! activation and the expectation. FM names a GPU by its *physical id* (the baseboard
//! module id NVML reports as `nvmlDeviceGetModuleId`) and, when FM can see it, its PCI
//! address.

use pci_config::Bdf;
use serde::Serialize;

/// One GPU of a partition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FabricPartition {
    pub id: u32,
    pub gpus: Vec<PartitionGpu>,
    /// Activated (for some VM) right now.
    pub active: bool,
}

/// Everything FM says about the board, read once.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct FabricState {
    /// FM's version, when the source tells it.
    pub fm_version: Option<String>,
    /// The partitions FM supports on this board as it is now.
    pub partitions: Vec<FabricPartition>,
    /// Partition ids FM lists as unsupported (a GPU or NVSwitch missing or degraded).
    pub unsupported: Vec<u32>,
    /// GPUs (by PCI address) with NVLinks FM could not train.
    pub nvlink_failed_gpus: Vec<Bdf>,
}
