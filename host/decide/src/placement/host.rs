//! The host as placement sees it: its GPUs as indices in BDF order, their IOMMU groups as
//! the units assigned whole, the domains (machine, NUMA node, host bridge, bridges) each
//! GPU sits under, which units are still free, and a candidate set with its worth.

use std::collections::{BTreeMap, BTreeSet};

use pci_config::{Bdf, PathKind};
use vfio_p2p_model::{HostBridgeId, Topology};

use super::request::{PlacedVm, PlacementError, PlacementOptions, WorstPath};
use crate::pair_links::{PairLink, PairLinks};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Domain {
    Machine,
    Numa(Option<u32>),
    HostBridge(HostBridgeId),
    Bridge(Bdf),
}

/// An IOMMU group's GPUs: what is assigned as a whole.
#[derive(Debug, Clone)]
pub(super) struct Unit {
    pub(super) gpus: Vec<usize>,
    pub(super) group: Option<u32>,
}

/// The host reduced to what placement needs, with GPUs as indices in BDF order.
#[derive(Debug)]
pub struct PlacementHost {
    pub(super) gpus: Vec<Bdf>,
    pub(super) links: PairLinks,
    /// Every GPU has the same domains and links alike (see [`PairLinks::uniform`]).
    pub(super) uniform: bool,
    pub(super) numa: Vec<Option<u32>>,
    /// Per GPU, its domains from the machine down to its parent bridge.
    pub(super) domains: Vec<Vec<usize>>,
    pub(super) domain_count: usize,
    pub(super) units: Vec<Unit>,
    /// Units whose IOMMU group holds an unavailable device.
    pub(super) blocked: Vec<bool>,
    /// No NVLink: sets may be searched under one host bridge first (see `seed_search`).
    pub(super) scoped: bool,
    /// Per unit, the domain of the host bridge all its GPUs sit under (none: several).
    pub(super) unit_host_bridge: Vec<Option<usize>>,
    /// Per domain, the units under it when it is a host bridge.
    pub(super) host_bridge_units: Vec<Vec<usize>>,
    /// Per domain, whether it is a host bridge whose GPUs all sit alike.
    pub(super) host_bridge_alike: Vec<bool>,
}

/// Which units are still free, and free GPUs per domain.
#[derive(Debug, Clone)]
pub(super) struct FreeState {
    pub(super) unit_free: Vec<bool>,
    pub(super) free_under: Vec<usize>,
}

/// A unit a growing set could take next: the set's worst path and worst PCIe path were
/// it taken, and its link to the seed.
#[derive(Debug, Clone)]
pub(super) struct Reach {
    pub(super) unit: usize,
    pub(super) worst: (WorstPath, PathKind),
    pub(super) near: WorstPath,
}

/// One candidate set and how good it is; compares best first.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Candidate {
    pub(super) worst: WorstPath,
    pub(super) numa_nodes: usize,
    pub(super) groups: usize,
    pub(super) pcie: PathKind,
    /// Free GPUs left in the enclosing domain and each domain above it (best fit).
    pub(super) leftover: Vec<usize>,
    pub(super) gpus: Vec<usize>,
    pub(super) units: Vec<usize>,
}

impl Candidate {
    /// The set `gpus`, made of whole `units`, with its worst path (the kind, the PCIe
    /// path) and how many NUMA nodes it spans; its leftover is the ranking's to fill in.
    pub(super) fn new(
        worst: (WorstPath, PathKind),
        numa_nodes: usize,
        gpus: Vec<usize>,
        units: Vec<usize>,
    ) -> Candidate {
        Candidate {
            worst: worst.0,
            numa_nodes,
            groups: units.len(),
            pcie: worst.1,
            leftover: Vec::new(),
            gpus,
            units,
        }
    }
}

impl PlacementHost {
    /// Indexes the topology's GPUs; `options.unavailable` must name devices of it.
    pub fn new(topo: &Topology, options: &PlacementOptions) -> Result<Self, PlacementError> {
        if let Some(b) = options
            .unavailable
            .iter()
            .find(|b| topo.device(b).is_none())
        {
            return Err(PlacementError::UnknownDevice(*b));
        }
        let gpus: Vec<Bdf> = topo.gpus().map(|g| g.bdf).collect();
        let n = gpus.len();
        let links = PairLinks::new(topo, &gpus);
        let bridge_numa: BTreeMap<HostBridgeId, Option<u32>> = topo
            .host_bridges
            .iter()
            .map(|h| (h.id, h.numa_node))
            .collect();
        let mut domain_ids: BTreeMap<Domain, usize> = BTreeMap::new();
        let mut numa = Vec::with_capacity(n);
        let mut domains: Vec<Vec<usize>> = Vec::with_capacity(n);
        for bdf in &gpus {
            let dev = &topo.devices[bdf];
            let node = bridge_numa
                .get(&dev.host_bridge)
                .copied()
                .flatten()
                .or(dev.numa_node);
            numa.push(dev.numa_node.or(node));
            let mut chain = vec![
                Domain::Machine,
                Domain::Numa(node),
                Domain::HostBridge(dev.host_bridge),
            ];
            chain.extend(topo.ancestors(bdf).iter().map(|d| Domain::Bridge(d.bdf)));
            domains.push(
                chain
                    .into_iter()
                    .map(|d| {
                        let next = domain_ids.len();
                        *domain_ids.entry(d).or_insert(next)
                    })
                    .collect(),
            );
        }
        let mut by_group: BTreeMap<Option<u32>, Vec<usize>> = BTreeMap::new();
        let mut units = Vec::new();
        for (i, bdf) in gpus.iter().enumerate() {
            match topo.devices[bdf].iommu_group {
                Some(g) => by_group.entry(Some(g)).or_default().push(i),
                // Without an IOMMU (a VM, iommu=off) every GPU stands alone.
                None => units.push(Unit {
                    gpus: vec![i],
                    group: None,
                }),
            }
        }
        units.extend(
            by_group
                .into_iter()
                .map(|(group, gpus)| Unit { gpus, group }),
        );
        units.sort_by_key(|u| u.gpus[0]);
        let blocked = units
            .iter()
            .map(|u| {
                options.unavailable.iter().any(|b| {
                    u.gpus.iter().any(|g| gpus[*g] == *b)
                        || (u.group.is_some() && topo.devices[b].iommu_group == u.group)
                })
            })
            .collect();
        let uniform = links.uniform() && domains.iter().all(|d| *d == domains[0]);
        let (unit_host_bridge, host_bridge_units, host_bridge_alike) =
            index_host_bridges(&units, &domains, &numa, &links, domain_ids.len());
        let scoped = !links.has_nvlink();
        Ok(PlacementHost {
            gpus,
            links,
            uniform,
            numa,
            domains,
            domain_count: domain_ids.len(),
            units,
            blocked,
            scoped,
            unit_host_bridge,
            host_bridge_units,
            host_bridge_alike,
        })
    }

    pub(super) fn link(&self, a: usize, b: usize) -> PairLink {
        self.links.link(a, b)
    }

    pub(super) fn initial_state(&self) -> FreeState {
        let mut s = FreeState {
            unit_free: self.blocked.iter().map(|b| !b).collect(),
            free_under: vec![0; self.domain_count],
        };
        for (u, unit) in self.units.iter().enumerate() {
            if s.unit_free[u] {
                for g in &unit.gpus {
                    for d in &self.domains[*g] {
                        s.free_under[*d] += 1;
                    }
                }
            }
        }
        s
    }

    pub(super) fn take(&self, s: &mut FreeState, units: &[usize]) {
        for u in units {
            s.unit_free[*u] = false;
            for g in &self.units[*u].gpus {
                for d in &self.domains[*g] {
                    s.free_under[*d] -= 1;
                }
            }
        }
    }

    pub(super) fn free_gpus(&self, s: &FreeState) -> usize {
        // Domain 0 is the machine: the first domain of the first GPU.
        s.free_under.first().copied().unwrap_or(0)
    }

    /// Adds `unit` to a set: its new worst path and worst PCIe path.
    pub(super) fn extend_worst(
        &self,
        members: &[usize],
        unit: &Unit,
        worst: (WorstPath, PathKind),
    ) -> (WorstPath, PathKind) {
        let (mut w, mut p) = worst;
        for (i, g) in unit.gpus.iter().enumerate() {
            for m in members.iter().chain(&unit.gpus[..i]) {
                let l = self.link(*m, *g);
                w = w.max(WorstPath::of_pair(l));
                p = p.max(l.pcie);
            }
        }
        (w, p)
    }

    pub(super) fn placed(&self, name: &str, c: &Candidate) -> PlacedVm {
        let numa: BTreeSet<u32> = c.gpus.iter().filter_map(|g| self.numa[*g]).collect();
        PlacedVm {
            name: name.to_string(),
            gpus: c.gpus.iter().map(|g| self.gpus[*g]).collect(),
            worst_path: c.worst,
            worst_pcie_path: c.pcie,
            numa_nodes: numa.into_iter().collect(),
            iommu_groups: c
                .units
                .iter()
                .filter_map(|u| self.units[*u].group)
                .collect(),
        }
    }

    /// `gpus` as one VM when they are free GPUs of this host making up whole IOMMU
    /// groups: for sets chosen elsewhere (Fabric Manager's partitions).
    pub fn evaluate(&self, name: &str, gpus: &[Bdf]) -> Option<PlacedVm> {
        let mut members = Vec::with_capacity(gpus.len());
        for b in gpus {
            members.push(self.gpus.binary_search(b).ok()?);
        }
        members.sort_unstable();
        members.dedup();
        let mut units: Vec<usize> = Vec::new();
        for (u, unit) in self.units.iter().enumerate() {
            let inside = unit
                .gpus
                .iter()
                .filter(|g| members.binary_search(g).is_ok())
                .count();
            if inside == 0 {
                continue;
            }
            if inside < unit.gpus.len() || self.blocked[u] {
                return None;
            }
            units.push(u);
        }
        let mut worst = (WorstPath::Single, PathKind::X);
        let mut so_far: Vec<usize> = Vec::new();
        for u in &units {
            worst = self.extend_worst(&so_far, &self.units[*u], worst);
            so_far.extend(&self.units[*u].gpus);
        }
        let numa: BTreeSet<Option<u32>> = members.iter().map(|g| self.numa[*g]).collect();
        let c = Candidate::new(worst, numa.len(), members, units);
        Some(self.placed(name, &c))
    }

    /// Whether `bdf` is one of this host's GPUs.
    pub fn has_gpu(&self, bdf: &Bdf) -> bool {
        self.gpus.binary_search(bdf).is_ok()
    }

    /// The host's GPUs that are neither unavailable nor in `used`, in BDF order.
    pub fn free_gpus_without(&self, used: &BTreeSet<Bdf>) -> Vec<Bdf> {
        self.units
            .iter()
            .zip(&self.blocked)
            .filter(|(_, blocked)| !**blocked)
            .flat_map(|(unit, _)| unit.gpus.iter().map(|g| self.gpus[*g]))
            .filter(|b| !used.contains(b))
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect()
    }
}

/// Per unit, the host bridge (its domain) all its GPUs sit under, if one; per domain, the
/// units under it and whether its GPUs all sit alike. Domain 2 of a GPU's chain is its
/// host bridge.
type HostBridgeIndex = (Vec<Option<usize>>, Vec<Vec<usize>>, Vec<bool>);

fn index_host_bridges(
    units: &[Unit],
    domains: &[Vec<usize>],
    numa: &[Option<u32>],
    links: &PairLinks,
    domain_count: usize,
) -> HostBridgeIndex {
    let unit_host_bridge: Vec<Option<usize>> = units
        .iter()
        .map(|u| {
            let hb = domains[u.gpus[0]][2];
            u.gpus.iter().all(|g| domains[*g][2] == hb).then_some(hb)
        })
        .collect();
    let mut host_bridge_units = vec![Vec::new(); domain_count];
    let mut alike = vec![false; domain_count];
    for (u, hb) in unit_host_bridge.iter().enumerate() {
        if let Some(hb) = *hb {
            host_bridge_units[hb].push(u);
            alike[hb] = true;
        }
    }
    for (u, unit) in units.iter().enumerate() {
        match unit_host_bridge[u] {
            Some(hb) => {
                let f = units[host_bridge_units[hb][0]].gpus[0];
                alike[hb] &= unit.gpus.iter().all(|g| {
                    domains[*g] == domains[f] && numa[*g] == numa[f] && links.same_place(*g, f)
                });
            }
            None => {
                for g in &unit.gpus {
                    alike[domains[*g][2]] = false;
                }
            }
        }
    }
    (unit_host_bridge, host_bridge_units, alike)
}
