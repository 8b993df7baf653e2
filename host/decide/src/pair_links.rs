//! The PCIe path and NVLink between two GPUs of a placement host, classified on
//! demand from each GPU's place in the tree (its root complex and bridges), with
//! the same rule as [`Topology::path`]: no n² table, so memory stays linear in GPUs.

use std::collections::HashMap;

use pci_config::{Bdf, DevicePlace, PathKind};

use vfio_p2p_model::Topology;

/// The PCIe path and NVLink between two GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PairLink {
    pub pcie: PathKind,
    pub nvlink: Option<u8>,
}

/// Every GPU's place in the PCIe tree and the NVLinks between GPUs, by GPU index.
#[derive(Debug)]
pub struct PairLinks {
    places: Vec<DevicePlace>,
    nvlinks: HashMap<(usize, usize), u8>,
    /// Every GPU sits alike (same root complex, same bridges) and none has NVLink:
    /// every pair of distinct GPUs has the same link.
    uniform: bool,
}

impl PairLinks {
    /// Indexes `gpus` (sorted, the topology's GPUs in BDF order).
    pub fn new(topo: &Topology, gpus: &[Bdf]) -> PairLinks {
        let places: Vec<DevicePlace> = gpus
            .iter()
            .map(|b| DevicePlace {
                device: *b,
                root: topo.root_complex(b),
                bridges: topo.path_bridges(b),
            })
            .collect();
        let nvlinks: HashMap<(usize, usize), u8> = topo
            .nvlinks
            .iter()
            .filter_map(|((a, b), n)| {
                let (a, b) = (gpus.binary_search(a).ok()?, gpus.binary_search(b).ok()?);
                Some(((a.min(b), a.max(b)), *n))
            })
            .collect();
        let uniform = nvlinks.is_empty()
            && places
                .iter()
                .all(|p| p.root == places[0].root && p.bridges == places[0].bridges);
        PairLinks {
            places,
            nvlinks,
            uniform,
        }
    }

    /// The link between GPUs `a` and `b` (`X` and no NVLink for a GPU with itself).
    pub fn link(&self, a: usize, b: usize) -> PairLink {
        let pcie = pci_config::classify(&self.places[a].path(), &self.places[b].path()).kind;
        let nvlink = if a == b {
            None
        } else {
            self.nvlinks.get(&(a.min(b), a.max(b))).copied()
        };
        PairLink { pcie, nvlink }
    }

    /// Whether any two GPUs share an NVLink.
    pub fn has_nvlink(&self) -> bool {
        !self.nvlinks.is_empty()
    }

    /// Whether GPUs `a` and `b` sit alike: the same root complex and bridges.
    pub fn same_place(&self, a: usize, b: usize) -> bool {
        let (a, b) = (&self.places[a], &self.places[b]);
        a.root == b.root && a.bridges == b.bridges
    }

    /// Whether every GPU sits alike with no NVLink (flat hosts, VMs): then every set
    /// of `n` distinct GPUs has the same worst path.
    pub fn uniform(&self) -> bool {
        self.uniform
    }
}
