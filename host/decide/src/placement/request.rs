//! What placement is asked and what it answers: the VMs to place and the options they
//! are placed under, the refusals, and each VM's set with its worst path.

use std::cmp::{Ordering, Reverse};
use std::collections::BTreeSet;
use std::fmt;

use pci_config::{Bdf, PathKind};
use serde::Serialize;

use crate::pair_links::PairLink;

/// One VM to place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmRequest {
    pub name: String,
    pub gpus: usize,
}

#[derive(Debug, Clone, Default)]
pub struct PlacementOptions {
    /// Devices not available to new VMs: taken by running VMs or reserved for the
    /// host. Their whole IOMMU group is unavailable.
    pub unavailable: BTreeSet<Bdf>,
    /// Worst PCIe path a VM may have (NVLink pairs always qualify); `None`: any.
    pub max_path: Option<PathKind>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PlacementError {
    #[error("{0} is not a device of this host; list its GPUs with `vfio-p2p topo`")]
    UnknownDevice(Bdf),
    #[error("VM name '{0}' is given twice; give every VM its own name")]
    DuplicateName(String),
    #[error("VM '{0}' asks for 0 GPUs; ask for at least one")]
    NoGpus(String),
    #[error(
        "VM name '{0}': use 1-64 letters, digits, '-', '_' or '.', not starting with '-' or '.'"
    )]
    BadName(String),
}

/// The worst GPU-to-GPU connection inside a VM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorstPath {
    /// A single GPU: nothing to connect.
    Single,
    /// Every pair joined by NVLink; the fewest links of any pair.
    NvLink(u8),
    /// Some pair only over PCIe, at best this path.
    Pcie(PathKind),
}

impl WorstPath {
    pub(super) fn of_pair(link: PairLink) -> WorstPath {
        match link.nvlink {
            Some(n) => WorstPath::NvLink(n),
            None => WorstPath::Pcie(link.pcie),
        }
    }

    /// Ordering key: better first; more NVLinks better than fewer.
    fn key(&self) -> (u8, Reverse<u8>, PathKind) {
        match *self {
            WorstPath::Single => (0, Reverse(0), PathKind::X),
            WorstPath::NvLink(n) => (1, Reverse(n), PathKind::X),
            WorstPath::Pcie(k) => (2, Reverse(0), k),
        }
    }

    /// `X`, `NV18`, `PIX`…: the `nvidia-smi topo -m` label.
    pub fn label(&self) -> String {
        match self {
            WorstPath::Single => PathKind::X.label().to_string(),
            WorstPath::NvLink(n) => format!("NV{n}"),
            WorstPath::Pcie(k) => k.label().to_string(),
        }
    }

    /// Whether every pair qualifies under a PCIe path limit.
    pub fn within(&self, limit: Option<PathKind>) -> bool {
        match (self, limit) {
            (_, None) | (WorstPath::Single | WorstPath::NvLink(_), _) => true,
            (WorstPath::Pcie(k), Some(l)) => *k <= l,
        }
    }
}

impl Ord for WorstPath {
    fn cmp(&self, other: &Self) -> Ordering {
        self.key().cmp(&other.key())
    }
}

impl PartialOrd for WorstPath {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Display for WorstPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.label())
    }
}

impl Serialize for WorstPath {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// A VM that got its GPUs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PlacedVm {
    pub name: String,
    pub gpus: Vec<Bdf>,
    pub worst_path: WorstPath,
    /// Worst PCIe path, NVLink aside: what PCIe P2P (and the clique) would use.
    pub worst_pcie_path: PathKind,
    pub numa_nodes: Vec<u32>,
    pub iommu_groups: Vec<u32>,
}

/// A VM that could not be placed, why, and what would fit instead.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct UnplacedVm {
    pub name: String,
    pub gpus: usize,
    pub reason: String,
    /// The worst path the best free set of the requested size has, when the path
    /// limit was what failed: what the operator would have to accept.
    pub best_worst_path: Option<WorstPath>,
    /// The most GPUs this VM could get right now within the limit.
    pub largest_fit: usize,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Placement {
    /// In request order.
    pub vms: Vec<PlacedVm>,
    pub unplaced: Vec<UnplacedVm>,
    /// GPUs left for later VMs.
    pub free: Vec<Bdf>,
}

/// Checks the requests: unique, file-safe names and at least one GPU each.
pub fn validate_requests(requests: &[VmRequest]) -> Result<(), PlacementError> {
    let mut seen = BTreeSet::new();
    for r in requests {
        let file_safe = vfio_p2p_config::is_valid_vm_name(&r.name);
        if !file_safe {
            return Err(PlacementError::BadName(r.name.clone()));
        }
        if r.gpus == 0 {
            return Err(PlacementError::NoGpus(r.name.clone()));
        }
        if !seen.insert(r.name.as_str()) {
            return Err(PlacementError::DuplicateName(r.name.clone()));
        }
    }
    Ok(())
}
