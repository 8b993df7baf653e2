//! Placement: which free GPUs each of many VMs gets.
//!
//! A VM's GPUs should do P2P with each other, so each VM gets the set that
//! maximises its worst GPU-to-GPU path (NVLink > PIX > PXB > PHB > NODE > SYS), then
//! spans the fewest NUMA nodes, then the fewest IOMMU groups. An IOMMU group is
//! the unit of assignment (vfio hands whole groups to one VM), so its GPUs go to
//! one VM or stay free.
//!
//! Exhaustive search is out of reach (64 GPUs choose 4 per VM, 16 VMs), but PCIe
//! paths are a tree metric: the best set for a VM lies under the lowest bridge, host
//! bridge or NUMA node that holds enough free GPUs. So, from every free group as a
//! seed, the set grows by the group that keeps the worst path best (nearest in the
//! tree first); among the seeds' sets of equal quality the one that best fits its
//! enclosing subtree wins (fewest free GPUs left stranded there), which keeps whole
//! switches and sockets free for the VMs that follow. Larger VMs are placed first.
//! Everything iterates in BDF order, so the result is deterministic. Where every GPU
//! sits alike (flat hosts), the first seed's set is unbeatable and the search stops there.
//! Without NVLink a set grows under its seed's host bridge first, seeds' sets are kept
//! until a unit they looked at is taken, and under a host bridge whose GPUs sit alike one
//! seed stands for all (see `seed_search`): same sets, near-linear on big hosts.

use std::cmp::{Ordering, Reverse};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use pci_config::Bdf;
use serde::Serialize;

use crate::pair_links::{PairLink, PairLinks};
use pci_config::PathKind;
use vfio_p2p_model::HostBridgeId;
use vfio_p2p_model::Topology;

mod seed_search;
use seed_search::SeedCache;

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
    fn of_pair(link: PairLink) -> WorstPath {
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

/// A node of the placement tree: the machine, a NUMA node, a host bridge or a bridge.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Domain {
    Machine,
    Numa(Option<u32>),
    HostBridge(HostBridgeId),
    Bridge(Bdf),
}

/// An IOMMU group's GPUs: what is assigned as a whole.
#[derive(Debug, Clone)]
struct Unit {
    gpus: Vec<usize>,
    group: Option<u32>,
}

/// The host reduced to what placement needs, with GPUs as indices in BDF order.
#[derive(Debug)]
pub struct PlacementHost {
    gpus: Vec<Bdf>,
    links: PairLinks,
    /// Every GPU has the same domains and links alike (see [`PairLinks::uniform`]).
    uniform: bool,
    numa: Vec<Option<u32>>,
    /// Per GPU, its domains from the machine down to its parent bridge.
    domains: Vec<Vec<usize>>,
    domain_count: usize,
    units: Vec<Unit>,
    /// Units whose IOMMU group holds an unavailable device.
    blocked: Vec<bool>,
    /// No NVLink: sets may be searched under one host bridge first (see `seed_search`).
    scoped: bool,
    /// Per unit, the domain of the host bridge all its GPUs sit under (none: several).
    unit_host_bridge: Vec<Option<usize>>,
    /// Per domain, the units under it when it is a host bridge.
    host_bridge_units: Vec<Vec<usize>>,
    /// Per domain, whether it is a host bridge whose GPUs all sit alike.
    host_bridge_alike: Vec<bool>,
}

/// Which units are still free, and free GPUs per domain.
#[derive(Debug, Clone)]
struct FreeState {
    unit_free: Vec<bool>,
    free_under: Vec<usize>,
}

/// A unit a growing set could take next: the set's worst path and worst PCIe path were
/// it taken, and its link to the seed.
#[derive(Debug, Clone)]
struct Reach {
    unit: usize,
    worst: (WorstPath, PathKind),
    near: WorstPath,
}

/// One candidate set and how good it is; compares best first.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Candidate {
    worst: WorstPath,
    numa_nodes: usize,
    groups: usize,
    pcie: PathKind,
    /// Free GPUs left in the enclosing domain and each domain above it (best fit).
    leftover: Vec<usize>,
    gpus: Vec<usize>,
    units: Vec<usize>,
}

impl Candidate {
    /// The set `gpus`, made of whole `units`, with its worst path (the kind, the PCIe
    /// path) and how many NUMA nodes it spans; its leftover is the ranking's to fill in.
    fn new(
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
            seed_search::index_host_bridges(&units, &domains, &numa, &links, domain_ids.len());
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

    fn link(&self, a: usize, b: usize) -> PairLink {
        self.links.link(a, b)
    }

    fn initial_state(&self) -> FreeState {
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

    fn take(&self, s: &mut FreeState, units: &[usize]) {
        for u in units {
            s.unit_free[*u] = false;
            for g in &self.units[*u].gpus {
                for d in &self.domains[*g] {
                    s.free_under[*d] -= 1;
                }
            }
        }
    }

    fn free_gpus(&self, s: &FreeState) -> usize {
        // Domain 0 is the machine: the first domain of the first GPU.
        s.free_under.first().copied().unwrap_or(0)
    }

    /// Adds `unit` to a set: its new worst path and worst PCIe path.
    fn extend_worst(
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

    /// The most GPUs one VM could get now with its worst path within `limit`.
    fn largest_fit(&self, s: &FreeState, below: usize, limit: Option<PathKind>) -> usize {
        (1..below.min(self.free_gpus(s) + 1))
            .rev()
            .find(|n| self.best(s, *n).is_some_and(|c| c.worst.within(limit)))
            .unwrap_or(0)
    }

    fn placed(&self, name: &str, c: &Candidate) -> PlacedVm {
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

    /// Places every request, largest first; see the module documentation.
    pub fn place(&self, requests: &[VmRequest], max_path: Option<PathKind>) -> Placement {
        let mut s = self.initial_state();
        let mut order: Vec<usize> = (0..requests.len()).collect();
        order.sort_by_key(|i| (Reverse(requests[*i].gpus), *i));
        let mut placed: BTreeMap<usize, PlacedVm> = BTreeMap::new();
        let mut unplaced: BTreeMap<usize, UnplacedVm> = BTreeMap::new();
        let mut cache = SeedCache::default();
        for i in order {
            let r = &requests[i];
            let free = self.free_gpus(&s);
            let best = self.best_cached(&s, r.gpus, &mut cache);
            match best {
                Some(c) if c.worst.within(max_path) => {
                    self.take(&mut s, &c.units);
                    cache.forget_taken(self, &c.units);
                    placed.insert(i, self.placed(&r.name, &c));
                }
                best => {
                    let reason = match (&best, max_path) {
                        (Some(c), Some(l)) => format!(
                            "the best {} free GPUs have worst path {}, worse than the limit {l}",
                            r.gpus, c.worst
                        ),
                        _ if free < r.gpus => {
                            format!("needs {} GPUs, {free} are free", r.gpus)
                        }
                        _ => format!(
                            "{free} GPUs are free but no whole IOMMU groups add up to {} (groups are not split)",
                            r.gpus
                        ),
                    };
                    unplaced.insert(
                        i,
                        UnplacedVm {
                            name: r.name.clone(),
                            gpus: r.gpus,
                            reason,
                            best_worst_path: best.map(|c| c.worst),
                            largest_fit: self.largest_fit(&s, r.gpus, max_path),
                        },
                    );
                }
            }
        }
        Placement {
            vms: placed.into_values().collect(),
            unplaced: unplaced.into_values().collect(),
            free: self
                .units
                .iter()
                .enumerate()
                .filter(|(u, _)| s.unit_free[*u])
                .flat_map(|(_, unit)| unit.gpus.iter().map(|g| self.gpus[*g]))
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect(),
        }
    }
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

/// Places `requests` on `topo`: validation, indexing and placement in one call.
pub fn place(
    topo: &Topology,
    requests: &[VmRequest],
    options: &PlacementOptions,
) -> Result<Placement, PlacementError> {
    validate_requests(requests)?;
    Ok(PlacementHost::new(topo, options)?.place(requests, options.max_path))
}

/// `count` VMs of `gpus` each, named `vm0`, `vm1`…
pub fn shape(count: usize, gpus: usize) -> Vec<VmRequest> {
    (0..count)
        .map(|i| VmRequest {
            name: format!("vm{i}"),
            gpus,
        })
        .collect()
}

/// When a `count × gpus` shape does not fit: the largest `count × g` that does, then
/// the largest `c × gpus`.
pub fn largest_shape(
    host: &PlacementHost,
    count: usize,
    gpus: usize,
    max_path: Option<PathKind>,
) -> Option<(usize, usize)> {
    let fits = |c: usize, g: usize| host.place(&shape(c, g), max_path).unplaced.is_empty();
    let narrower = (1..gpus).rev().find(|g| fits(count, *g));
    let fewer = (1..count).rev().find(|c| fits(*c, gpus));
    match (narrower, fewer) {
        (Some(g), Some(c)) if c * gpus > count * g => Some((c, gpus)),
        (Some(g), _) => Some((count, g)),
        (None, Some(c)) => Some((c, gpus)),
        (None, None) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use vfio_p2p_read::synth::{self, tree};

    fn topo(name: &str) -> Topology {
        Topology::from_record(&synth::example(name).unwrap())
    }

    fn bdfs(list: &[&str]) -> Vec<Bdf> {
        list.iter().map(|s| s.parse().unwrap()).collect()
    }

    fn run(topo: &Topology, requests: &[VmRequest]) -> Placement {
        place(topo, requests, &PlacementOptions::default()).unwrap()
    }

    fn with_nvswitch_fabric(mut t: Topology) -> Topology {
        let gpus: Vec<Bdf> = t.gpus().map(|g| g.bdf).collect();
        for a in &gpus {
            for b in &gpus {
                if a < b {
                    t.set_nvlink(*a, *b, 18);
                }
            }
        }
        t
    }

    #[test]
    fn dual_socket_two_by_four_gives_each_vm_one_socket() {
        let p = run(&topo("dual-socket-pcie"), &shape(2, 4));
        assert!(p.unplaced.is_empty());
        assert_eq!(p.vms[0].name, "vm0");
        assert_eq!(
            p.vms[0].gpus,
            bdfs(&[
                "0000:05:00.0",
                "0000:06:00.0",
                "0000:09:00.0",
                "0000:0a:00.0"
            ])
        );
        assert_eq!(
            p.vms[1].gpus,
            bdfs(&[
                "0000:85:00.0",
                "0000:86:00.0",
                "0000:89:00.0",
                "0000:8a:00.0"
            ])
        );
        for vm in &p.vms {
            assert_eq!(vm.worst_path, WorstPath::Pcie(PathKind::Pxb));
            assert_eq!(vm.numa_nodes.len(), 1);
            assert_eq!(vm.iommu_groups.len(), 4);
        }
        assert_ne!(p.vms[0].numa_nodes, p.vms[1].numa_nodes);
        assert!(p.free.is_empty());
    }

    #[test]
    fn dual_socket_pairs_get_one_leaf_switch_each() {
        let p = run(&topo("dual-socket-pcie"), &shape(4, 2));
        assert!(p.unplaced.is_empty());
        let pairs: Vec<Vec<Bdf>> = p.vms.iter().map(|v| v.gpus.clone()).collect();
        assert_eq!(
            pairs,
            vec![
                bdfs(&["0000:05:00.0", "0000:06:00.0"]),
                bdfs(&["0000:09:00.0", "0000:0a:00.0"]),
                bdfs(&["0000:85:00.0", "0000:86:00.0"]),
                bdfs(&["0000:89:00.0", "0000:8a:00.0"]),
            ]
        );
        assert!(p
            .vms
            .iter()
            .all(|v| v.worst_path == WorstPath::Pcie(PathKind::Pix)));
    }

    #[test]
    fn mixed_sizes_keep_a_socket_whole_for_the_large_vm() {
        // The 2-GPU VM is asked first but placed after the 4-GPU one, and best-fit
        // puts it on the other socket's leaf switch, leaving two PIX pairs free.
        let requests = vec![
            VmRequest {
                name: "small".into(),
                gpus: 2,
            },
            VmRequest {
                name: "large".into(),
                gpus: 4,
            },
        ];
        let p = run(&topo("dual-socket-pcie"), &requests);
        assert_eq!(p.vms[0].name, "small");
        assert_eq!(p.vms[0].worst_path, WorstPath::Pcie(PathKind::Pix));
        assert_eq!(p.vms[1].worst_path, WorstPath::Pcie(PathKind::Pxb));
        assert_ne!(p.vms[0].numa_nodes, p.vms[1].numa_nodes);
    }

    #[test]
    fn hgx_two_by_four_splits_by_socket_over_nvlink() {
        let t = with_nvswitch_fabric(topo("hgx-h100"));
        let p = run(&t, &shape(2, 4));
        assert!(p.unplaced.is_empty());
        assert_eq!(
            p.vms[0].gpus,
            bdfs(&[
                "0000:18:00.0",
                "0000:19:00.0",
                "0000:3a:00.0",
                "0000:3b:00.0"
            ])
        );
        assert_eq!(
            p.vms[1].gpus,
            bdfs(&[
                "0000:9d:00.0",
                "0000:9e:00.0",
                "0000:bb:00.0",
                "0000:bc:00.0"
            ])
        );
        for (vm, node) in p.vms.iter().zip([0, 1]) {
            assert_eq!(vm.worst_path, WorstPath::NvLink(18));
            assert_eq!(vm.worst_path.label(), "NV18");
            assert_eq!(vm.worst_pcie_path, PathKind::Node);
            assert_eq!(vm.numa_nodes, vec![node]);
        }
    }

    #[test]
    fn hgx_pairs_without_nvlink_share_a_switch() {
        let p = run(&topo("hgx-h100"), &shape(4, 2));
        assert!(p.unplaced.is_empty());
        assert!(p
            .vms
            .iter()
            .all(|v| v.worst_path == WorstPath::Pcie(PathKind::Pix)));
    }

    #[test]
    fn flat_vm_places_its_two_gpus_without_iommu_groups() {
        let p = run(&topo("flat-vm"), &shape(1, 2));
        assert_eq!(p.vms[0].gpus, bdfs(&["0000:00:06.0", "0000:00:07.0"]));
        assert_eq!(p.vms[0].worst_path, WorstPath::Pcie(PathKind::Phb));
        assert!(p.vms[0].iommu_groups.is_empty());
    }

    #[test]
    fn taken_gpus_are_skipped_and_the_shortfall_explained() {
        let t = topo("dual-socket-pcie");
        let options = PlacementOptions {
            unavailable: bdfs(&["0000:05:00.0"]).into_iter().collect(),
            max_path: None,
        };
        let p = place(&t, &shape(2, 4), &options).unwrap();
        assert_eq!(p.vms.len(), 1);
        assert_eq!(p.vms[0].worst_path, WorstPath::Pcie(PathKind::Pxb));
        let u = &p.unplaced[0];
        assert_eq!(u.name, "vm1");
        assert_eq!(u.reason, "needs 4 GPUs, 3 are free");
        assert_eq!(u.largest_fit, 3);
        assert!(!p.free.contains(&"0000:05:00.0".parse().unwrap()));
        assert_eq!(
            largest_shape(&PlacementHost::new(&t, &options).unwrap(), 2, 4, None),
            Some((2, 3))
        );
    }

    #[test]
    fn taking_a_gpu_audio_function_takes_its_group() {
        // The audio function shares the GPU's IOMMU group: the GPU is not free.
        let t = topo("dual-socket-pcie");
        let options = PlacementOptions {
            unavailable: bdfs(&["0000:05:00.1"]).into_iter().collect(),
            max_path: None,
        };
        let p = place(&t, &shape(1, 8), &options).unwrap();
        assert_eq!(p.unplaced[0].reason, "needs 8 GPUs, 7 are free");
        assert!(!p.free.contains(&"0000:05:00.0".parse().unwrap()));
    }

    #[test]
    fn path_limit_reports_what_would_have_to_be_accepted() {
        let t = topo("dual-socket-pcie");
        let options = PlacementOptions {
            unavailable: BTreeSet::new(),
            max_path: Some(PathKind::Pix),
        };
        let p = place(&t, &shape(1, 4), &options).unwrap();
        let u = &p.unplaced[0];
        assert_eq!(u.best_worst_path, Some(WorstPath::Pcie(PathKind::Pxb)));
        assert_eq!(u.largest_fit, 2);
        assert!(
            u.reason.contains("worse than the limit PIX"),
            "{}",
            u.reason
        );
    }

    #[test]
    fn bad_requests_are_refused() {
        let t = topo("dual-socket-pcie");
        let two = |a: &str, b: &str| {
            vec![
                VmRequest {
                    name: a.into(),
                    gpus: 1,
                },
                VmRequest {
                    name: b.into(),
                    gpus: 1,
                },
            ]
        };
        let o = PlacementOptions::default();
        assert_eq!(
            place(&t, &two("a", "a"), &o),
            Err(PlacementError::DuplicateName("a".into()))
        );
        assert_eq!(
            place(&t, &two("a", "../b"), &o),
            Err(PlacementError::BadName("../b".into()))
        );
        assert_eq!(
            place(
                &t,
                &[VmRequest {
                    name: "z".into(),
                    gpus: 0
                }],
                &o
            ),
            Err(PlacementError::NoGpus("z".into()))
        );
        let o = PlacementOptions {
            unavailable: bdfs(&["0001:00:00.0"]).into_iter().collect(),
            max_path: None,
        };
        assert_eq!(
            place(&t, &shape(1, 1), &o),
            Err(PlacementError::UnknownDevice(
                "0001:00:00.0".parse().unwrap()
            ))
        );
    }

    #[test]
    fn shared_groups_are_never_split() {
        let spec = tree::ServerSpec {
            sockets: vec![vec![vec![
                tree::LeafSpec {
                    gpus: 2,
                    shared_group: true,
                },
                tree::LeafSpec {
                    gpus: 1,
                    shared_group: false,
                },
            ]]],
        };
        let t = Topology::from_record(&tree::server(&spec));
        let p = run(&t, &shape(3, 1));
        assert_eq!(p.vms.len(), 1);
        assert_eq!(p.unplaced.len(), 2);
        assert!(p.unplaced[0]
            .reason
            .contains("no whole IOMMU groups add up to 1"));
        let p = run(&t, &shape(1, 2));
        assert_eq!(p.vms[0].iommu_groups.len(), 1);
        assert_eq!(p.vms[0].worst_path, WorstPath::Pcie(PathKind::Pix));
    }

    #[test]
    fn sixty_four_gpus_pack_into_leaf_switches_and_sockets() {
        let t = Topology::from_record(&tree::server(&tree::ServerSpec::uniform(2, 4, 2, 4)));
        let p = run(&t, &shape(16, 4));
        assert!(p.unplaced.is_empty());
        assert!(p
            .vms
            .iter()
            .all(|v| v.worst_path == WorstPath::Pcie(PathKind::Pix)));
        let p = run(&t, &shape(8, 8));
        assert!(p
            .vms
            .iter()
            .all(|v| v.worst_path == WorstPath::Pcie(PathKind::Pxb)));
        // Mixed sizes: the 32-GPU VM takes a whole socket, the rest still fit their switches.
        let mut requests = shape(8, 4);
        requests.push(VmRequest {
            name: "half".into(),
            gpus: 32,
        });
        let p = run(&t, &requests);
        assert!(p.unplaced.is_empty());
        let half = p.vms.iter().find(|v| v.name == "half").unwrap();
        assert_eq!(
            (half.worst_path, half.numa_nodes.len()),
            (WorstPath::Pcie(PathKind::Node), 1)
        );
        assert!(p
            .vms
            .iter()
            .filter(|v| v.name != "half")
            .all(|v| v.worst_path == WorstPath::Pcie(PathKind::Pix)));
    }

    /// The best (worst path, NUMA nodes, groups) over every set of whole free groups.
    fn exhaustive(host: &PlacementHost, n: usize) -> Option<(WorstPath, usize, usize)> {
        fn walk(
            host: &PlacementHost,
            free: &[usize],
            n: usize,
            from: usize,
            chosen: &mut Vec<usize>,
            best: &mut Option<(WorstPath, usize, usize)>,
        ) {
            let size: usize = chosen.iter().map(|u| host.units[*u].gpus.len()).sum();
            if size == n {
                let gpus: Vec<usize> = chosen
                    .iter()
                    .flat_map(|u| host.units[*u].gpus.clone())
                    .collect();
                let mut worst = WorstPath::Single;
                for a in &gpus {
                    for b in &gpus {
                        if a != b {
                            worst = worst.max(WorstPath::of_pair(host.link(*a, *b)));
                        }
                    }
                }
                let numa: BTreeSet<_> = gpus.iter().map(|g| host.numa[*g]).collect();
                let q = (worst, numa.len(), chosen.len());
                if best.is_none_or(|b| q < b) {
                    *best = Some(q);
                }
                return;
            }
            for (i, u) in free.iter().enumerate().skip(from) {
                if size + host.units[*u].gpus.len() <= n {
                    chosen.push(*u);
                    walk(host, free, n, i + 1, chosen, best);
                    chosen.pop();
                }
            }
        }
        let s = host.initial_state();
        let free: Vec<usize> = (0..host.units.len()).filter(|u| s.unit_free[*u]).collect();
        let mut best = None;
        walk(host, &free, n, 0, &mut Vec::new(), &mut best);
        best
    }

    fn server_spec() -> impl Strategy<Value = tree::ServerSpec> {
        let leaf = (1u8..=3, proptest::bool::weighted(0.2))
            .prop_map(|(gpus, shared_group)| tree::LeafSpec { gpus, shared_group });
        let bridge = proptest::collection::vec(leaf, 1..=2);
        let socket = proptest::collection::vec(bridge, 1..=2);
        proptest::collection::vec(socket, 1..=2).prop_map(|sockets| tree::ServerSpec { sockets })
    }

    fn taken(t: &Topology, picks: &[proptest::sample::Index]) -> BTreeSet<Bdf> {
        let gpus: Vec<Bdf> = t.gpus().map(|g| g.bdf).collect();
        picks.iter().map(|i| *i.get(&gpus)).collect()
    }

    /// Known limitation (found by the property test above): growing greedily from each seed
    /// can take one group more than needed once the worst path is SYS, e.g. 5 GPUs from
    /// socket 0 {1, 2 shared} and socket 1 {1}, {3 shared}: it takes 3+1+1, not 3+2.
    #[test]
    #[ignore = "placement minimizes groups greedily; the exact minimum is an open item"]
    fn fewest_groups_is_not_always_found() {
        let leaf = |gpus, shared_group| tree::LeafSpec { gpus, shared_group };
        let spec = tree::ServerSpec {
            sockets: vec![
                vec![vec![leaf(1, false), leaf(2, true)]],
                vec![vec![leaf(1, false)], vec![leaf(3, true)]],
            ],
        };
        let t = Topology::from_record(&tree::server(&spec));
        let options = PlacementOptions {
            unavailable: BTreeSet::new(),
            max_path: None,
        };
        let host = PlacementHost::new(&t, &options).unwrap();
        let s = host.initial_state();
        let found = host.best(&s, 5).map(|c| (c.worst, c.numa_nodes, c.groups));
        assert_eq!(found, exhaustive(&host, 5));
    }

    /// GPUs on root buses below one host bridge (every GPU alike), with the given IOMMU
    /// groups and NUMA nodes: the flat dump `tests/hostile/flat_host.py` writes.
    fn uniform_host(groups: &[u32], numa: &[u8]) -> Topology {
        flat_host(groups, numa, &vec![0; groups.len()])
    }

    /// GPUs on root buses, each in PCI domain `domains[i]` (a host bridge per domain).
    fn flat_host(groups: &[u32], numa: &[u8], domains: &[u16]) -> Topology {
        let mut config = [0u8; 256];
        config[0..4].copy_from_slice(&[0xde, 0x10, 0x30, 0x23]);
        config[0x0a..0x0c].copy_from_slice(&[0x02, 0x03]);
        let config: String = config.iter().map(|b| format!("{b:02x}")).collect();
        let mut dump = serde_json::Map::new();
        for (i, ((group, node), domain)) in groups.iter().zip(numa).zip(domains).enumerate() {
            let bdf = format!("{domain:04x}:01:{i:02x}.0");
            dump.insert(
                bdf.clone(),
                serde_json::json!({
                    "path": format!("/sys/devices/pci{domain:04x}:00/{bdf}"),
                    "vendor": "0x10de", "device": "0x2330", "class": "0x030200",
                    "numa_node": node.to_string(), "iommu_group": group.to_string(),
                    "resource": "0x0 0x0 0x0\n", "config": config,
                }),
            );
        }
        let text = serde_json::Value::Object(dump).to_string();
        Topology::from_record(&vfio_p2p_read::flat_json::parse(&text, "test").unwrap())
    }

    /// The best over every seed, without the uniform host's early stop.
    fn best_of_every_seed(host: &PlacementHost, s: &FreeState, n: usize) -> Option<Candidate> {
        (0..host.units.len())
            .filter(|u| s.unit_free[*u] && host.units[*u].gpus.len() <= n)
            .filter_map(|u| host.grow(s, u, n))
            .min()
    }

    /// VM after VM (taking each set), the search with its host-bridge scope, seed cache
    /// and settled host bridges finds what growing from every seed over every unit finds.
    fn same_as_every_seed(host: &PlacementHost, sizes: &[usize]) -> Result<(), TestCaseError> {
        let mut s = host.initial_state();
        let mut cache = SeedCache::default();
        for n in sizes {
            let found = host.best_cached(&s, *n, &mut cache);
            prop_assert_eq!(&found, &best_of_every_seed(host, &s, *n));
            if let Some(c) = found {
                host.take(&mut s, &c.units);
                cache.forget_taken(host, &c.units);
            }
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Switched hosts with several host bridges and NUMA nodes, some GPUs taken.
        #[test]
        fn scoped_search_matches_every_seed_on_switched_hosts(
            switches in 1usize..=6,
            per_bridge in 1usize..=3,
            gpus in 1u8..=3,
            sockets in 1usize..=2,
            sizes in proptest::collection::vec(1usize..=5, 1..=8),
            picks in proptest::collection::vec(any::<proptest::sample::Index>(), 0..3),
        ) {
            let t = Topology::from_record(&tree::switched(switches, per_bridge, gpus, sockets));
            let options = PlacementOptions { unavailable: taken(&t, &picks), max_path: None };
            same_as_every_seed(&PlacementHost::new(&t, &options).unwrap(), &sizes)?;
        }

        /// Flat hosts over several PCI domains, with shared groups (some across domains),
        /// NUMA nodes and taken GPUs; and the server trees with shared-group leaves.
        #[test]
        fn scoped_search_matches_every_seed_on_flat_hosts_and_servers(
            gpus in proptest::collection::vec((0u32..8, 0u8..2, 0u16..3), 1..=14),
            spec in server_spec(),
            sizes in proptest::collection::vec(1usize..=5, 1..=8),
            picks in proptest::collection::vec(any::<proptest::sample::Index>(), 0..3),
        ) {
            let groups: Vec<u32> = gpus.iter().map(|g| g.0).collect();
            let numa: Vec<u8> = gpus.iter().map(|g| g.1).collect();
            let domains: Vec<u16> = gpus.iter().map(|g| g.2).collect();
            for t in [flat_host(&groups, &numa, &domains), Topology::from_record(&tree::server(&spec))] {
                let options = PlacementOptions { unavailable: taken(&t, &picks), max_path: None };
                same_as_every_seed(&PlacementHost::new(&t, &options).unwrap(), &sizes)?;
            }
        }

        /// On a host whose GPUs all sit alike, stopping at the first unbeatable set gives
        /// what trying every seed gives, with shared groups, NUMA nodes and taken GPUs.
        #[test]
        fn uniform_host_stops_early_with_the_same_set(
            gpus in proptest::collection::vec((0u32..6, 0u8..2), 1..=10),
            one_node in any::<bool>(),
            n in 1usize..=5,
            picks in proptest::collection::vec(any::<proptest::sample::Index>(), 0..3),
        ) {
            let groups: Vec<u32> = gpus.iter().map(|g| g.0).collect();
            let numa: Vec<u8> = gpus.iter().map(|g| if one_node { 0 } else { g.1 }).collect();
            let t = uniform_host(&groups, &numa);
            let options = PlacementOptions { unavailable: taken(&t, &picks), max_path: None };
            let host = PlacementHost::new(&t, &options).unwrap();
            prop_assert!(host.uniform);
            let mut s = host.initial_state();
            for _ in 0..3 {
                let found = host.best(&s, n);
                prop_assert_eq!(&found, &best_of_every_seed(&host, &s, n));
                match found {
                    Some(c) => host.take(&mut s, &c.units),
                    None => break,
                }
            }
        }

        /// One VM: the greedy tree search finds the exhaustive optimum's worst path and
        /// NUMA spread, and never more groups than it would with those. (The fewest groups is
        /// not always found: see `fewest_groups_is_not_always_found`.)
        #[test]
        fn single_vm_matches_exhaustive_search(
            spec in server_spec(),
            n in 1usize..=5,
            picks in proptest::collection::vec(any::<proptest::sample::Index>(), 0..3),
        ) {
            let t = Topology::from_record(&tree::server(&spec));
            let options = PlacementOptions { unavailable: taken(&t, &picks), max_path: None };
            let host = PlacementHost::new(&t, &options).unwrap();
            let s = host.initial_state();
            let found = host.best(&s, n).map(|c| (c.worst, c.numa_nodes));
            prop_assert_eq!(found, exhaustive(&host, n).map(|(w, numa, _)| (w, numa)));
        }

        /// Many VMs: every VM gets what it asked for, no GPU twice, no group split,
        /// nothing unavailable, and the same answer every time.
        #[test]
        fn many_vms_respect_groups_and_are_deterministic(
            spec in server_spec(),
            sizes in proptest::collection::vec(1usize..=4, 1..=6),
            picks in proptest::collection::vec(any::<proptest::sample::Index>(), 0..3),
        ) {
            let t = Topology::from_record(&tree::server(&spec));
            let options = PlacementOptions { unavailable: taken(&t, &picks), max_path: None };
            let requests: Vec<VmRequest> = sizes
                .iter()
                .enumerate()
                .map(|(i, g)| VmRequest { name: format!("vm{i}"), gpus: *g })
                .collect();
            let p = place(&t, &requests, &options).unwrap();
            prop_assert_eq!(&p, &place(&t, &requests, &options).unwrap());
            prop_assert_eq!(p.vms.len() + p.unplaced.len(), requests.len());
            let mut owner: BTreeMap<Bdf, &str> = BTreeMap::new();
            for vm in &p.vms {
                let want = requests.iter().find(|r| r.name == vm.name).unwrap().gpus;
                prop_assert_eq!(vm.gpus.len(), want);
                for g in &vm.gpus {
                    prop_assert!(owner.insert(*g, &vm.name).is_none(), "{} used twice", g);
                    for member in t.group_members(g) {
                        prop_assert!(!options.unavailable.contains(&member));
                        if t.device(&member).unwrap().is_gpu() {
                            prop_assert!(vm.gpus.contains(&member), "group of {} split", g);
                        }
                    }
                }
            }
            for g in &p.free {
                prop_assert!(!owner.contains_key(g));
            }
            prop_assert_eq!(
                owner.len() + p.free.len()
                    + t.gpus().filter(|g| {
                        t.group_members(&g.bdf).iter().any(|m| options.unavailable.contains(m))
                    }).count(),
                t.gpus().count()
            );
        }
    }
}
