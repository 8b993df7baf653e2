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

pub mod host;
pub mod request;
mod seed_search;

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};

use pci_config::PathKind;
use vfio_p2p_model::Topology;

use host::{FreeState, PlacementHost};
use request::{
    validate_requests, PlacedVm, Placement, PlacementError, PlacementOptions, UnplacedVm, VmRequest,
};
use seed_search::SeedCache;

impl PlacementHost {
    /// The most GPUs one VM could get now with its worst path within `limit`.
    fn largest_fit(&self, s: &FreeState, below: usize, limit: Option<PathKind>) -> usize {
        (1..below.min(self.free_gpus(s) + 1))
            .rev()
            .find(|n| self.best(s, *n).is_some_and(|c| c.worst.within(limit)))
            .unwrap_or(0)
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
    use super::request::WorstPath;
    use super::*;
    use pci_config::Bdf;
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

    pub(super) fn server_spec() -> impl Strategy<Value = tree::ServerSpec> {
        let leaf = (1u8..=3, proptest::bool::weighted(0.2))
            .prop_map(|(gpus, shared_group)| tree::LeafSpec { gpus, shared_group });
        let bridge = proptest::collection::vec(leaf, 1..=2);
        let socket = proptest::collection::vec(bridge, 1..=2);
        proptest::collection::vec(socket, 1..=2).prop_map(|sockets| tree::ServerSpec { sockets })
    }

    pub(super) fn taken(t: &Topology, picks: &[proptest::sample::Index]) -> BTreeSet<Bdf> {
        let gpus: Vec<Bdf> = t.gpus().map(|g| g.bdf).collect();
        picks.iter().map(|i| *i.get(&gpus)).collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

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
