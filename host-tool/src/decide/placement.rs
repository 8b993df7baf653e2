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
//! Everything iterates in BDF order, so the result is deterministic.

use std::cmp::{Ordering, Reverse};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use pci_config::Bdf;
use serde::Serialize;

use crate::model::{PathKind, Topology};
use crate::read::HostBridgeId;

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
    #[error("VM name '{0}' cannot be a file name; use letters, digits, '-', '_' and '.'")]
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

/// The PCIe path and NVLink between two GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PairLink {
    pcie: PathKind,
    nvlink: Option<u8>,
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
    links: Vec<PairLink>,
    numa: Vec<Option<u32>>,
    /// Per GPU, its domains from the machine down to its parent bridge.
    domains: Vec<Vec<usize>>,
    domain_count: usize,
    units: Vec<Unit>,
    /// Units whose IOMMU group holds an unavailable device.
    blocked: Vec<bool>,
}

/// Which units are still free, and free GPUs per domain.
#[derive(Debug, Clone)]
struct FreeState {
    unit_free: Vec<bool>,
    free_under: Vec<usize>,
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
        let mut links = Vec::with_capacity(n * n);
        for a in &gpus {
            for b in &gpus {
                links.push(PairLink {
                    pcie: topo.path(a, b).kind,
                    nvlink: if a == b { None } else { topo.nvlink(a, b) },
                });
            }
        }
        let bridge_numa: BTreeMap<HostBridgeId, Option<u32>> = topo
            .host_bridges
            .iter()
            .map(|h| (h.id, h.numa_node))
            .collect();
        let mut domain_ids: BTreeMap<Domain, usize> = BTreeMap::new();
        let mut numa = Vec::with_capacity(n);
        let mut domains = Vec::with_capacity(n);
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
        units.extend(by_group.into_iter().map(|(group, gpus)| Unit { gpus, group }));
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
        Ok(PlacementHost {
            gpus,
            links,
            numa,
            domains,
            domain_count: domain_ids.len(),
            units,
            blocked,
        })
    }

    fn link(&self, a: usize, b: usize) -> PairLink {
        self.links[a * self.gpus.len() + b]
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

    /// The set grown from `seed`: each step adds the free unit that keeps the set
    /// best, nearest to the seed on ties. `None` when no whole groups add up to `n`.
    fn grow(&self, s: &FreeState, seed: usize, n: usize) -> Option<Candidate> {
        let mut units = vec![seed];
        let mut members: Vec<usize> = Vec::with_capacity(n);
        let mut worst = self.extend_worst(&[], &self.units[seed], (WorstPath::Single, PathKind::X));
        members.extend(&self.units[seed].gpus);
        let mut numa: BTreeSet<Option<u32>> = members.iter().map(|g| self.numa[*g]).collect();
        let anchor = members[0];
        while members.len() < n {
            let need = n - members.len();
            let (_, u, w) = self
                .units
                .iter()
                .enumerate()
                .filter(|(u, unit)| {
                    s.unit_free[*u] && unit.gpus.len() <= need && !units.contains(u)
                })
                .map(|(u, unit)| {
                    let w = self.extend_worst(&members, unit, worst);
                    let new_numa = unit
                        .gpus
                        .iter()
                        .filter(|g| !numa.contains(&self.numa[**g]))
                        .map(|g| self.numa[*g])
                        .collect::<BTreeSet<_>>()
                        .len();
                    let near = WorstPath::of_pair(self.link(anchor, unit.gpus[0]));
                    let key = (w.0, numa.len() + new_numa, w.1, near, Reverse(unit.gpus.len()));
                    (key, u, w)
                })
                .min_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(&b.1)))?;
            units.push(u);
            members.extend(&self.units[u].gpus);
            numa.extend(self.units[u].gpus.iter().map(|g| self.numa[*g]));
            worst = w;
        }
        members.sort_unstable();
        units.sort_unstable();
        Some(Candidate {
            worst: worst.0,
            numa_nodes: numa.len(),
            groups: units.len(),
            pcie: worst.1,
            leftover: self.leftover(s, &members),
            gpus: members,
            units,
        })
    }

    /// Free GPUs that would be left in the set's enclosing domain and every domain above.
    fn leftover(&self, s: &FreeState, members: &[usize]) -> Vec<usize> {
        let first = &self.domains[members[0]];
        let common = members[1..].iter().fold(first.len(), |len, g| {
            first
                .iter()
                .zip(&self.domains[*g])
                .take(len)
                .take_while(|(a, b)| a == b)
                .count()
        });
        first[..common]
            .iter()
            .rev()
            .map(|d| s.free_under[*d] - members.len())
            .collect()
    }

    /// The best free set of `n` GPUs, whatever its path.
    fn best(&self, s: &FreeState, n: usize) -> Option<Candidate> {
        (0..self.units.len())
            .filter(|u| s.unit_free[*u] && self.units[*u].gpus.len() <= n)
            .filter_map(|u| self.grow(s, u, n))
            .min()
    }

    /// The most GPUs one VM could get now with its worst path within `limit`.
    fn largest_fit(&self, s: &FreeState, below: usize, limit: Option<PathKind>) -> usize {
        (1..below.min(self.free_gpus(s) + 1))
            .rev()
            .find(|n| {
                self.best(s, *n)
                    .is_some_and(|c| c.worst.within(limit))
            })
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
            iommu_groups: c.units.iter().filter_map(|u| self.units[*u].group).collect(),
        }
    }

    /// Places every request, largest first; see the module documentation.
    pub fn place(&self, requests: &[VmRequest], max_path: Option<PathKind>) -> Placement {
        let mut s = self.initial_state();
        let mut order: Vec<usize> = (0..requests.len()).collect();
        order.sort_by_key(|i| (Reverse(requests[*i].gpus), *i));
        let mut placed: BTreeMap<usize, PlacedVm> = BTreeMap::new();
        let mut unplaced: BTreeMap<usize, UnplacedVm> = BTreeMap::new();
        for i in order {
            let r = &requests[i];
            let free = self.free_gpus(&s);
            let best = self.best(&s, r.gpus);
            match best {
                Some(c) if c.worst.within(max_path) => {
                    self.take(&mut s, &c.units);
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
        let file_safe = !r.name.is_empty()
            && !r.name.starts_with('.')
            && r
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
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
    use crate::synth::{self, tree};

    fn topo(name: &str) -> Topology {
        Topology::from_record(&synth::example(name).unwrap())
    }

    fn bdfs(list: &[&str]) -> Vec<Bdf> {
        list.iter().map(|s| s.parse().unwrap()).collect()
    }

    fn run(topo: &Topology, requests: &[VmRequest]) -> Placement {
        place(topo, requests, &PlacementOptions::default()).unwrap()
    }

    #[test]
    fn dual_socket_two_by_four_gives_each_vm_one_socket() {
        let t = topo("dual-socket-pcie");
        let p = run(&t, &shape(2, 4));
        assert!(p.unplaced.is_empty());
        for vm in &p.vms {
            eprintln!("{} {:?} {}", vm.name, vm.gpus, vm.worst_path);
        }
        panic!();
    }
}
