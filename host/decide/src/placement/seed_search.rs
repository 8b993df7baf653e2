//! The search for one VM's set: from each free seed, grow the set greedily; keep the best.
//!
//! Three things keep it near-linear on big hosts without changing its answer:
//! - **Host bridge first.** Without NVLink, every pair of GPUs under one host bridge has a
//!   path of at most PHB and every pair across host bridges NODE or SYS
//!   (`pci_config::classify`), so while a unit under the seed's host bridge still fits,
//!   the greedy step picks one of those; the set looks beyond its host bridge only when
//!   none fits. The grown set then depends only on the free units under that host bridge.
//! - **A cache per VM size.** A seed's grown set is kept until a unit under the host
//!   bridge it looked at (any unit, for a set that looked beyond) is taken.
//! - **Settled host bridges.** Under a host bridge whose GPUs all sit alike, every set
//!   grown there has the same paths and leftover, so the least set of the fewest groups
//!   beats every other seed there, and those seeds need not be tried.

use std::cmp::Reverse;
use std::collections::BTreeSet;

use pci_config::PathKind;

use super::{Candidate, FreeState, PlacementHost, Reach, Unit, WorstPath};
use crate::pair_links::PairLinks;

/// Per unit, the host bridge (its domain) all its GPUs sit under, if one; per domain, the
/// units under it and whether its GPUs all sit alike. Domain 2 of a GPU's chain is its
/// host bridge.
pub(super) type HostBridgeIndex = (Vec<Option<usize>>, Vec<Vec<usize>>, Vec<bool>);

pub(super) fn index_host_bridges(
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

/// A seed's grown set (none: no whole groups add up) and the host bridge it stayed under
/// (`None`: it looked at every unit).
#[derive(Debug, Clone)]
struct Grown {
    candidate: Option<Candidate>,
    scope: Option<usize>,
}

/// Grown sets by seed unit, for one VM size; see the module documentation.
#[derive(Debug, Default)]
pub(super) struct SeedCache {
    size: usize,
    grown: Vec<Option<Grown>>,
}

impl SeedCache {
    /// Forgets every set that may change now that `units` are taken.
    pub(super) fn forget_taken(&mut self, host: &PlacementHost, units: &[usize]) {
        let touched: BTreeSet<Option<usize>> =
            units.iter().map(|u| host.unit_host_bridge[*u]).collect();
        for entry in &mut self.grown {
            if entry
                .as_ref()
                .is_some_and(|g| g.scope.is_none() || touched.contains(&g.scope))
            {
                *entry = None;
            }
        }
    }
}

impl PlacementHost {
    /// The set grown from `seed`: each step adds the free unit that keeps the set
    /// best, nearest to the seed on ties. `None` when no whole groups add up to `n`.
    /// With `scope`, only units under that host bridge are tried until none fits.
    fn grow_in(
        &self,
        s: &FreeState,
        seed: usize,
        n: usize,
        mut scope: Option<usize>,
    ) -> (Option<Candidate>, Option<usize>) {
        let mut units = vec![seed];
        let mut members: Vec<usize> = Vec::with_capacity(n);
        let mut worst = self.extend_worst(&[], &self.units[seed], (WorstPath::Single, PathKind::X));
        members.extend(&self.units[seed].gpus);
        let mut numa: BTreeSet<Option<u32>> = members.iter().map(|g| self.numa[*g]).collect();
        // The free units that could still fit, each with the set's worst paths were it
        // added (kept up to date as the set grows) and its link to the seed.
        let seed_gpus = &self.units[seed].gpus;
        let reach = |u: usize, members: &[usize], worst| Reach {
            unit: u,
            worst: self.extend_worst(members, &self.units[u], worst),
            near: WorstPath::of_pair(self.link(seed_gpus[0], self.units[u].gpus[0])),
        };
        let fits = |u: &usize, taken: usize| {
            *u != seed && s.unit_free[*u] && taken + self.units[*u].gpus.len() <= n
        };
        let mut rest: Vec<Reach> = match scope {
            Some(hb) => self.host_bridge_units[hb]
                .iter()
                .copied()
                .filter(|u| fits(u, members.len()))
                .map(|u| reach(u, seed_gpus, worst))
                .collect(),
            None => (0..self.units.len())
                .filter(|u| fits(u, members.len()))
                .map(|u| reach(u, seed_gpus, worst))
                .collect(),
        };
        while members.len() < n {
            let need = n - members.len();
            let Some(i) = self.next_unit(&rest, &numa, need) else {
                // Nothing under the host bridge fits: look at every other unit.
                let Some(hb) = scope.take() else {
                    return (None, None);
                };
                rest.extend(
                    (0..self.units.len())
                        .filter(|u| self.unit_host_bridge[*u] != Some(hb))
                        .filter(|u| fits(u, members.len()))
                        .map(|u| reach(u, &members, worst)),
                );
                continue;
            };
            let Reach {
                unit: u, worst: w, ..
            } = rest.swap_remove(i);
            units.push(u);
            members.extend(&self.units[u].gpus);
            numa.extend(self.units[u].gpus.iter().map(|g| self.numa[*g]));
            worst = w;
            if members.len() < n {
                for r in &mut rest {
                    let so_far = (r.worst.0.max(w.0), r.worst.1.max(w.1));
                    r.worst = self.extend_worst(&self.units[u].gpus, &self.units[r.unit], so_far);
                }
            }
        }
        members.sort_unstable();
        units.sort_unstable();
        let c = Candidate::new(worst, numa.len(), members, units);
        (Some(c), scope)
    }

    /// The index in `rest` of the unit that keeps the set best, with `need` GPUs to go.
    fn next_unit(
        &self,
        rest: &[Reach],
        numa: &BTreeSet<Option<u32>>,
        need: usize,
    ) -> Option<usize> {
        let (_, i) = rest
            .iter()
            .enumerate()
            .filter(|(_, r)| self.units[r.unit].gpus.len() <= need)
            .map(|(i, r)| {
                let unit = &self.units[r.unit];
                let key = (
                    r.worst.0,
                    numa.len() + self.new_numa(numa, unit),
                    r.worst.1,
                    r.near,
                    Reverse(unit.gpus.len()),
                    r.unit,
                );
                (key, i)
            })
            .min()?;
        Some(i)
    }

    /// The set grown from `seed` over every unit (the reference the scoped search keeps).
    #[cfg(test)]
    pub(super) fn grow(&self, s: &FreeState, seed: usize, n: usize) -> Option<Candidate> {
        let (c, _) = self.grow_in(s, seed, n, None);
        c.map(|mut c| {
            c.leftover = self.leftover(s, &c.gpus);
            c
        })
    }

    /// How many NUMA nodes `unit` adds to a set spanning `numa`.
    fn new_numa(&self, numa: &BTreeSet<Option<u32>>, unit: &Unit) -> usize {
        let node = |g: &usize| self.numa[*g];
        unit.gpus
            .iter()
            .enumerate()
            .filter(|(i, g)| {
                !numa.contains(&node(g)) && !unit.gpus[..*i].iter().any(|h| node(h) == node(g))
            })
            .count()
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
    pub(super) fn best(&self, s: &FreeState, n: usize) -> Option<Candidate> {
        self.best_cached(s, n, &mut SeedCache::default())
    }

    /// The best free set of `n` GPUs, with the grown sets `cache` still holds.
    pub(super) fn best_cached(
        &self,
        s: &FreeState,
        n: usize,
        cache: &mut SeedCache,
    ) -> Option<Candidate> {
        if cache.size != n || cache.grown.len() != self.units.len() {
            cache.size = n;
            cache.grown = vec![None; self.units.len()];
        }
        let mut best: Option<Candidate> = None;
        let mut settled: BTreeSet<usize> = BTreeSet::new();
        let seeds =
            (0..self.units.len()).filter(|u| s.unit_free[*u] && self.units[*u].gpus.len() <= n);
        for seed in seeds {
            let hb = self.unit_host_bridge[seed];
            if hb.is_some_and(|h| settled.contains(&h)) {
                continue;
            }
            let grown = cache.grown[seed].get_or_insert_with(|| {
                let scope = if self.scoped { hb } else { None };
                let (candidate, scope) = self.grow_in(s, seed, n, scope);
                Grown { candidate, scope }
            });
            let Some(mut c) = grown.candidate.clone() else {
                continue;
            };
            c.leftover = self.leftover(s, &c.gpus);
            if let Some(h) = grown.scope.filter(|h| self.settles(s, n, *h, &c)) {
                settled.insert(h);
            }
            if best.as_ref().is_none_or(|b| c < *b) {
                let unbeatable = self.beats_every_set(s, n, &c);
                best = Some(c);
                if unbeatable {
                    break;
                }
            }
        }
        best
    }

    /// Whether `c`, grown under host bridge `hb`, is no worse than any set grown from
    /// another seed under it: its GPUs all sit alike (same paths, same leftover), `c`
    /// spans one NUMA node, takes the fewest groups any `n` of its GPUs could, and is
    /// its first `n` free GPUs in BDF order. (Sets that left `hb` have worse paths.)
    fn settles(&self, s: &FreeState, n: usize, hb: usize, c: &Candidate) -> bool {
        if !self.host_bridge_alike[hb] || c.numa_nodes != 1 {
            return false;
        }
        let free = || {
            self.host_bridge_units[hb]
                .iter()
                .filter(|u| s.unit_free[**u])
                .map(|u| &self.units[*u])
        };
        let largest = free().map(|u| u.gpus.len()).max().unwrap_or(1);
        let last = c.gpus.last().copied().unwrap_or(0);
        let up_to_last = free().flat_map(|u| &u.gpus).filter(|g| **g <= last).count();
        c.groups == n.div_ceil(largest) && up_to_last == n
    }

    /// Whether no set of `n` free GPUs is better than `c`. On a uniform host every set of
    /// `n` GPUs has the same worst paths and leftover, so `c` is the best when it spans one
    /// NUMA node, takes the fewest groups any `n` GPUs could, and is the first `n` free
    /// GPUs in BDF order (the least list). The other seeds need not be tried.
    fn beats_every_set(&self, s: &FreeState, n: usize, c: &Candidate) -> bool {
        if !self.uniform || c.numa_nodes != 1 {
            return false;
        }
        let free = || {
            self.units
                .iter()
                .enumerate()
                .filter(|(u, _)| s.unit_free[*u])
                .map(|(_, unit)| unit)
        };
        let largest = free().map(|u| u.gpus.len()).max().unwrap_or(1);
        let last = c.gpus.last().copied().unwrap_or(0);
        let up_to_last = free().flat_map(|u| &u.gpus).filter(|g| **g <= last).count();
        c.groups == n.div_ceil(largest) && up_to_last == n
    }
}
