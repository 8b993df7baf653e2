//! P2P clique planning: which of a VM's GPUs may share a GPUDirect clique, and why.
//!
//! The clique capability is the hypervisor's warranty that PCIe P2P works between
//! every pair of GPUs with the same ID, so a pair only shares a clique when its host
//! path is no worse than the requested level and P2P on that path is correct for
//! a VM (guest-physical addresses reach the IOMMU). NVLink peers need no clique.
//!
//! [`plan`] is the library entry point; the config generators, the libvirt hook
//! and placement call it with the GPUs of one VM.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use pci_config::clique::MAX_CLIQUE;
use pci_config::Bdf;
use serde::Serialize;

use super::plan_reach;
use pci_config::PathKind;
use vfio_p2p_model::Topology;

pub mod pair_route;
mod warnings;

use pair_route::{pair, untranslated_ports, Pair, PairRoute};
use warnings::{pair_warnings, WarningContext};

/// Most cliques a VM can have: the ID is four bits.
pub const MAX_CLIQUES: usize = MAX_CLIQUE as usize + 1;

/// What the caller allows. Build with `PlanOptions { p2p_level: .., ..PlanOptions::default() }`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlanOptions {
    /// Worst host path allowed inside a clique (default `PXB`, NCCL's default: one switch tree).
    pub p2p_level: PathKind,
    /// Put pairs whose switch routes untranslated guest-physical addresses into cliques anyway.
    pub allow_untranslated_p2p: bool,
}

impl Default for PlanOptions {
    fn default() -> Self {
        PlanOptions {
            p2p_level: PathKind::Pxb,
            allow_untranslated_p2p: false,
        }
    }
}

/// One clique: its ID (0..=15) and its GPUs in BDF order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Clique {
    pub id: u8,
    pub gpus: Vec<Bdf>,
}

/// The cliques of one VM's GPUs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CliquePlan {
    /// Selected P2P level, for reports.
    #[serde(skip)]
    pub p2p_level: PathKind,
    pub cliques: Vec<Clique>,
    /// Every selected GPU → its clique ID, `None` when it needs none (NVLink-only
    /// peers, no peer within the level, or not an NVIDIA GPU).
    pub assignments: BTreeMap<Bdf, Option<u8>>,
    pub pairs: Vec<Pair>,
    /// Pairs not in `pairs`: past [`PAIR_LIST_MAX_GPUS`] GPUs, those across switch trees
    /// without NVLink.
    #[serde(skip_serializing_if = "is_zero")]
    pub pairs_left_out: usize,
    pub warnings: Vec<String>,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

impl CliquePlan {
    /// The clique to put on `gpu`'s vfio-pci device (`x-nv-gpudirect-clique`), if any.
    pub fn clique_of(&self, gpu: &Bdf) -> Option<u8> {
        self.assignments.get(gpu).copied().flatten()
    }

    pub fn pair(&self, a: &Bdf, b: &Bdf) -> Option<&Pair> {
        self.pairs
            .iter()
            .find(|p| (p.a == *a && p.b == *b) || (p.a == *b && p.b == *a))
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("no GPUs selected; pass --gpus BDF,BDF,… (`vfio-p2p topo` lists them)")]
    NoGpus,
    #[error("{0}: no such PCI device on this host; `vfio-p2p topo` lists the GPUs")]
    UnknownDevice(Bdf),
    #[error("{bdf}: class {class:#08x} is not a GPU (display controller); select GPUs only")]
    NotAGpu { bdf: Bdf, class: u32 },
    #[error("{0} is selected twice")]
    Duplicate(Bdf),
    #[error(
        "these GPUs need {needed} cliques but the clique ID has 4 bits (at most {MAX_CLIQUES}): \
         {groups}; give the VM fewer GPUs, or raise --p2p-level so groups merge"
    )]
    TooManyCliques { needed: usize, groups: String },
    #[error(
        "{a} ↔ {b}: ACS P2P redirect (RR/CR) is cleared on {ports}, so the switch routes \
         guest-physical addresses untranslated and P2P writes land at the wrong host address; \
         enable RR+CR on those ports (drop `pci=disable_acs_redir=`/`pcie_acs_override=`, or \
         `pci=config_acs=` to set them), enable ATS with ACS DT, or pass --allow-untranslated-p2p \
         if the IOMMU is off or identity-mapped for this VM"
    )]
    Untranslated { a: Bdf, b: Bdf, ports: String },
}

/// Plans the cliques of the GPUs `gpus` (one VM's) on `topo`.
///
/// Cliques are built greedily in BDF order: a GPU joins the first clique all of whose
/// members it reaches within `options.p2p_level` on a VM-correct path, else opens a
/// new one. On tree-shaped PCIe paths this is also the fewest cliques. Cliques of a
/// single GPU are dropped (the GPU gets `None`), and IDs are numbered in BDF order of
/// each clique's first member, so the same host and selection always give the same IDs.
pub fn plan(topo: &Topology, gpus: &[Bdf], options: &PlanOptions) -> Result<CliquePlan, PlanError> {
    let selected = validate_selection(topo, gpus)?;
    let mut warnings = Vec::new();
    let (mut pairs, pairs_left_out) = listed_pairs(topo, &selected);
    let eligible: Vec<Bdf> = selected
        .iter()
        .filter_map(|b| topo.device(b))
        .filter(|d| {
            if !d.is_nvidia_gpu() {
                warnings.push(format!(
                    "{}: vendor {:#06x} is not NVIDIA; the clique capability is NVIDIA's, no clique assigned",
                    d.bdf, d.vendor
                ));
            }
            d.is_nvidia_gpu()
        })
        .map(|d| d.bdf)
        .collect();
    let eligible_set: HashSet<Bdf> = eligible.iter().copied().collect();
    let is_eligible = |g: &Bdf| eligible_set.contains(g);
    if !options.allow_untranslated_p2p {
        // untranslated pairs share a switch tree (PIX/PXB), and those pairs are all listed
        if let Some(p) = pairs.iter().find(|p| {
            p.verdict == PairRoute::Untranslated
                && p.path <= options.p2p_level
                && is_eligible(&p.a)
                && is_eligible(&p.b)
        }) {
            return Err(PlanError::Untranslated {
                a: p.a,
                b: p.b,
                ports: untranslated_ports(p).join(", "),
            });
        }
    }
    let groups = plan_reach::groups(topo, &eligible, options.p2p_level);
    // A group needs a clique unless every pair of it is joined by NVLink.
    let degree = plan_reach::nvlink_degrees(topo, &eligible);
    let group_of: HashMap<Bdf, usize> = groups
        .iter()
        .enumerate()
        .flat_map(|(i, g)| g.iter().map(move |b| (*b, i)))
        .collect();
    let mut nvlink_pairs = vec![0usize; groups.len()];
    for (a, b) in topo.nvlinks.keys() {
        match (group_of.get(a), group_of.get(b)) {
            (Some(x), Some(y)) if x == y && a != b => nvlink_pairs[*x] += 1,
            _ => {}
        }
    }
    let groups: Vec<Vec<Bdf>> = groups
        .into_iter()
        .zip(nvlink_pairs)
        .filter(|(g, nv)| g.len() > 1 && *nv < g.len() * (g.len() - 1) / 2)
        .map(|(g, _)| g)
        .collect();
    if groups.len() > MAX_CLIQUES {
        return Err(PlanError::TooManyCliques {
            needed: groups.len(),
            groups: plan_reach::groups_text(&groups),
        });
    }
    let cliques: Vec<Clique> = groups
        .into_iter()
        .enumerate()
        .map(|(i, gpus)| Clique { id: i as u8, gpus })
        .collect();
    let mut assignments: BTreeMap<Bdf, Option<u8>> = selected.iter().map(|b| (*b, None)).collect();
    for c in &cliques {
        for g in &c.gpus {
            assignments.insert(*g, Some(c.id));
        }
    }
    for p in &mut pairs {
        p.clique = match (assignments[&p.a], assignments[&p.b]) {
            (Some(x), Some(y)) if x == y => Some(x),
            _ => None,
        };
    }
    let context = WarningContext {
        topo,
        pairs: &pairs,
        assignments: &assignments,
        cliques: cliques.iter().map(|c| c.gpus.as_slice()).collect(),
        degree: &degree,
        p2p_level: options.p2p_level,
    };
    warnings.extend(pair_warnings(&context));
    Ok(CliquePlan {
        p2p_level: options.p2p_level,
        cliques,
        assignments,
        pairs,
        pairs_left_out,
        warnings,
    })
}

/// The most GPUs whose every pair a plan lists (32,640 pairs); past it only the pairs
/// inside a switch tree and the NVLink pairs are listed, the others counted: a plan's
/// pairs grow with the square of its GPUs.
pub const PAIR_LIST_MAX_GPUS: usize = 256;

/// The pairs a plan lists (in the order of `selected`) and how many it leaves out.
fn listed_pairs(topo: &Topology, selected: &[Bdf]) -> (Vec<Pair>, usize) {
    let n = selected.len();
    let all = n * n.saturating_sub(1) / 2;
    if n <= PAIR_LIST_MAX_GPUS {
        let mut pairs = Vec::with_capacity(all);
        for (i, a) in selected.iter().enumerate() {
            for b in &selected[i + 1..] {
                pairs.push(pair(topo, a, b));
            }
        }
        return (pairs, 0);
    }
    let position: HashMap<Bdf, usize> = selected.iter().enumerate().map(|(i, b)| (*b, i)).collect();
    let mut near: BTreeSet<(usize, usize)> = BTreeSet::new();
    for tree in plan_reach::classes(selected, |g| plan_reach::reach(topo, g, PathKind::Pxb)) {
        for (i, a) in tree.iter().enumerate() {
            for b in &tree[i + 1..] {
                near.insert((position[a], position[b]));
            }
        }
    }
    for (a, b) in topo.nvlinks.keys() {
        if let (Some(x), Some(y)) = (position.get(a), position.get(b)) {
            if x != y {
                near.insert((*x.min(y), *x.max(y)));
            }
        }
    }
    let pairs: Vec<Pair> = near
        .into_iter()
        .map(|(i, j)| pair(topo, &selected[i], &selected[j]))
        .collect();
    let left_out = all - pairs.len();
    (pairs, left_out)
}

/// The selected GPUs, checked and in BDF order.
fn validate_selection(topo: &Topology, gpus: &[Bdf]) -> Result<Vec<Bdf>, PlanError> {
    if gpus.is_empty() {
        return Err(PlanError::NoGpus);
    }
    let mut selected = gpus.to_vec();
    selected.sort();
    for w in selected.windows(2) {
        if w[0] == w[1] {
            return Err(PlanError::Duplicate(w[0]));
        }
    }
    for b in &selected {
        let d = topo.device(b).ok_or(PlanError::UnknownDevice(*b))?;
        if !d.is_gpu() {
            return Err(PlanError::NotAGpu {
                bdf: *b,
                class: d.class,
            });
        }
    }
    Ok(selected)
}

#[cfg(test)]
mod tests {
    use super::pair_route::AcsState;
    use super::*;
    use pci_config::AcsFlags;
    use vfio_p2p_model::{BridgeRole, HostRecord};
    use vfio_p2p_read::synth::{self, Attach, EndpointSpec, HostBuilder, ACS_ISOLATING};

    const H100: (u16, u16) = (0x10de, 0x2330);

    fn topo(host: &HostRecord) -> Topology {
        Topology::from_record(host)
    }

    fn all_gpus(t: &Topology) -> Vec<Bdf> {
        t.gpus().map(|d| d.bdf).collect()
    }

    /// `n` host bridges on one NUMA node, each with a switch of `per_switch` GPUs whose
    /// downstream ports carry ACS control `acs`.
    fn switches(n: u8, per_switch: usize, acs: Option<u16>) -> HostRecord {
        let mut b = HostBuilder::new("test switches");
        b.numa_node(0, "0-7");
        for i in 0..n {
            let hb = b.host_bridge(0, i * 8);
            let rp = b.root_port(hb, Some(0), Some(ACS_ISOLATING));
            let (_, dsps) = b.switch(rp, per_switch, acs);
            for d in dsps {
                b.endpoint(
                    Attach::Below(d),
                    0,
                    &EndpointSpec::gpu(H100.0, H100.1, 80),
                    None,
                );
            }
        }
        b.build()
    }

    #[test]
    fn switch_pairs_share_a_clique_iommu_routed() {
        let t = topo(&switches(2, 2, Some(ACS_ISOLATING)));
        let gpus = all_gpus(&t);
        let p = plan(&t, &gpus, &PlanOptions::default()).unwrap();
        assert_eq!(p.cliques.len(), 2);
        assert_eq!(p.cliques[0].gpus, gpus[..2]);
        assert_eq!(p.cliques[1].gpus, gpus[2..]);
        assert_eq!(p.clique_of(&gpus[0]), Some(0));
        assert_eq!(p.clique_of(&gpus[3]), Some(1));
        let inner = p.pair(&gpus[0], &gpus[1]).unwrap();
        assert_eq!(inner.path, PathKind::Pix);
        assert_eq!(inner.verdict, PairRoute::IommuRouted);
        assert_eq!(inner.clique, Some(0));
        assert!(inner.explanation.contains("slower than bare metal"));
        let dsp = inner
            .acs
            .iter()
            .find(|a| a.role == Some(BridgeRole::DownstreamPort))
            .unwrap();
        assert_eq!(dsp.control.unwrap().names(), ["SV", "RR", "CR", "UF"]);
        let across = p.pair(&gpus[1], &gpus[2]).unwrap();
        assert_eq!(across.path, PathKind::Node);
        assert_eq!(across.verdict, PairRoute::CrossHostBridge);
        assert_eq!(across.clique, None);
        assert!(p.warnings.iter().any(|w| w.contains("IOMMU-routed")));
    }

    #[test]
    fn ids_are_stable_whatever_the_selection_order() {
        let t = topo(&switches(3, 2, Some(ACS_ISOLATING)));
        let mut gpus = all_gpus(&t);
        let a = plan(&t, &gpus, &PlanOptions::default()).unwrap();
        gpus.reverse();
        let b = plan(&t, &gpus, &PlanOptions::default()).unwrap();
        assert_eq!(a, b);
        // Dropping the first switch's GPUs renumbers the rest from 0.
        gpus.reverse();
        let c = plan(&t, &gpus[2..], &PlanOptions::default()).unwrap();
        assert_eq!(c.clique_of(&gpus[2]), Some(0));
    }

    #[test]
    fn rr_cleared_below_a_switch_is_an_error_unless_allowed() {
        let no_redirect = AcsFlags::SV | AcsFlags::UF;
        let t = topo(&switches(1, 2, Some(no_redirect)));
        let gpus = all_gpus(&t);
        let err = plan(&t, &gpus, &PlanOptions::default()).unwrap_err();
        let PlanError::Untranslated { a, b, ref ports } = err else {
            panic!("{err}");
        };
        assert_eq!((a, b), (gpus[0], gpus[1]));
        assert!(ports.contains("RR-"), "{ports}");
        assert!(err.to_string().contains("--allow-untranslated-p2p"));

        let opts = PlanOptions {
            allow_untranslated_p2p: true,
            ..PlanOptions::default()
        };
        let p = plan(&t, &gpus, &opts).unwrap();
        assert_eq!(p.cliques.len(), 1);
        assert_eq!(p.pairs[0].verdict, PairRoute::Untranslated);
        assert!(p.warnings.iter().any(|w| w.contains("untranslated")));
    }

    /// Issue 28 (mutation `&&` → `||` in `redirects`): a port redirects peer requests to
    /// the IOMMU only with both RR and CR; either alone leaves the switch routing
    /// guest-physical addresses untranslated.
    #[test]
    fn rr_only_and_cr_only_ports_are_untranslated() {
        for (what, half) in [("RR only", AcsFlags::RR), ("CR only", AcsFlags::CR)] {
            let t = topo(&switches(1, 2, Some(AcsFlags::SV | AcsFlags::UF | half)));
            let gpus = all_gpus(&t);
            let err = plan(&t, &gpus, &PlanOptions::default()).unwrap_err();
            assert!(
                matches!(err, PlanError::Untranslated { .. }),
                "{what}: {err}"
            );
            let opts = PlanOptions {
                allow_untranslated_p2p: true,
                ..PlanOptions::default()
            };
            let p = plan(&t, &gpus, &opts).unwrap();
            assert_eq!(p.pairs[0].verdict, PairRoute::Untranslated, "{what}");
        }
    }

    /// RR/CR cleared, ATS enabled on both GPUs and DT on the ports: translated requests go
    /// peer to peer, which is right in a VM; without ATS on one GPU, or without DT, it is
    /// untranslated again.
    #[test]
    fn ats_on_both_gpus_and_dt_on_the_ports_is_direct_translated() {
        let dt = AcsFlags::SV | AcsFlags::UF | AcsFlags::DT;
        let with_ats = |acs: u16, ats: [bool; 2]| {
            let mut t = topo(&switches(1, 2, Some(acs)));
            let gpus = all_gpus(&t);
            for (g, on) in gpus.iter().zip(ats) {
                t.devices.get_mut(g).unwrap().ats = Some(pci_config::AtsCapability {
                    offset: 0x100,
                    enabled: on,
                });
            }
            (t, gpus)
        };
        let (t, gpus) = with_ats(dt, [true, true]);
        let p = plan(&t, &gpus, &PlanOptions::default()).unwrap();
        assert_eq!(p.pairs[0].verdict, PairRoute::DirectTranslated);
        assert_eq!(p.pairs[0].clique, Some(0));
        assert!(p.pairs[0].explanation.contains("ATS"));
        for (what, acs, ats) in [
            ("ATS on one GPU", dt, [true, false]),
            ("no DT", AcsFlags::SV | AcsFlags::UF, [true, true]),
        ] {
            let (t, gpus) = with_ats(acs, ats);
            let err = plan(&t, &gpus, &PlanOptions::default()).unwrap_err();
            assert!(
                matches!(err, PlanError::Untranslated { .. }),
                "{what}: {err}"
            );
        }
    }

    /// Past PAIR_LIST_MAX_GPUS the plan lists exactly the pairs inside a switch tree (and
    /// NVLink pairs) and counts the others; the cliques are what they would be anyway.
    #[test]
    fn a_huge_selection_lists_the_pairs_inside_switch_trees() {
        let mut b = HostBuilder::new("15 switch trees of 20 GPUs");
        b.numa_node(0, "0-7");
        for d in 0..15u16 {
            let hb = b.host_bridge(d, 0);
            let rp = b.root_port(hb, Some(0), Some(ACS_ISOLATING));
            let (_, dsps) = b.switch(rp, 20, Some(ACS_ISOLATING));
            for p in dsps {
                b.endpoint(
                    Attach::Below(p),
                    0,
                    &EndpointSpec::gpu(H100.0, H100.1, 80),
                    None,
                );
            }
        }
        let mut t = topo(&b.build());
        let gpus = all_gpus(&t);
        assert_eq!(gpus.len(), 300);
        t.set_nvlink(gpus[0], gpus[299], 4);
        let options = PlanOptions {
            p2p_level: PathKind::Phb,
            ..PlanOptions::default()
        };
        let p = plan(&t, &gpus, &options).unwrap();
        assert_eq!(
            p.pairs.len(),
            15 * 190 + 1,
            "190 pairs per tree and the NVLink pair"
        );
        assert_eq!(p.pairs.len() + p.pairs_left_out, 300 * 299 / 2);
        assert!(p
            .pairs
            .iter()
            .all(|x| x.path <= PathKind::Pxb || x.nvlink.is_some()));
        assert_eq!(p.cliques.len(), 15);
        assert!(p.cliques.iter().all(|c| c.gpus.len() == 20));
    }

    #[test]
    fn switch_without_acs_is_untranslated() {
        let t = topo(&switches(1, 2, None));
        let err = plan(&t, &all_gpus(&t), &PlanOptions::default()).unwrap_err();
        assert!(err.to_string().contains("no ACS capability"), "{err}");
    }

    #[test]
    fn seventeen_cliques_do_not_fit() {
        let t = topo(&switches(17, 2, Some(ACS_ISOLATING)));
        let gpus = all_gpus(&t);
        let err = plan(&t, &gpus, &PlanOptions::default()).unwrap_err();
        assert!(
            matches!(err, PlanError::TooManyCliques { needed: 17, .. }),
            "{err}"
        );
        assert!(err.to_string().contains("at most 16"));
        let p = plan(&t, &gpus[..32], &PlanOptions::default()).unwrap();
        assert_eq!(p.cliques.len(), 16);
        assert_eq!(p.cliques[15].id, 15);
        // One node: --p2p-level node merges them all.
        let node = PlanOptions {
            p2p_level: PathKind::Node,
            ..PlanOptions::default()
        };
        let p = plan(&t, &gpus, &node).unwrap();
        assert_eq!(p.cliques.len(), 1);
        assert!(p.warnings.iter().any(|w| w.contains("platform-dependent")));
    }

    #[test]
    fn lone_gpus_get_no_clique() {
        let t = topo(&switches(2, 1, Some(ACS_ISOLATING)));
        let gpus = all_gpus(&t);
        let p = plan(&t, &gpus, &PlanOptions::default()).unwrap();
        assert!(p.cliques.is_empty());
        assert_eq!(p.assignments.values().filter(|c| c.is_none()).count(), 2);
        assert!(p.warnings.iter().any(|w| w.contains("no clique")));
    }

    #[test]
    fn dual_socket_levels() {
        let t = topo(&synth::example("dual-socket-pcie").unwrap());
        let gpus = all_gpus(&t);
        assert_eq!(gpus.len(), 8);
        let at = |level| {
            plan(
                &t,
                &gpus,
                &PlanOptions {
                    p2p_level: level,
                    ..PlanOptions::default()
                },
            )
            .unwrap()
        };
        let sizes = |p: &CliquePlan| p.cliques.iter().map(|c| c.gpus.len()).collect::<Vec<_>>();
        assert_eq!(sizes(&at(PathKind::Pix)), [2, 2, 2, 2]);
        assert_eq!(sizes(&at(PathKind::Pxb)), [4, 4]);
        assert_eq!(sizes(&at(PathKind::Node)), [4, 4]);
        let sys = at(PathKind::Sys);
        assert_eq!(sizes(&sys), [8]);
        assert!(sys
            .warnings
            .iter()
            .any(|w| w.contains("unsupported on Intel")));
    }

    #[test]
    fn nvlink_peers_need_no_clique() {
        let mut t = topo(&switches(1, 2, Some(ACS_ISOLATING)));
        let gpus = all_gpus(&t);
        t.set_nvlink(gpus[0], gpus[1], 18);
        let p = plan(&t, &gpus, &PlanOptions::default()).unwrap();
        assert!(p.cliques.is_empty());
        assert_eq!(p.assignments[&gpus[0]], None);
        assert_eq!(p.pairs[0].verdict, PairRoute::Nvlink);
        assert_eq!(p.pairs[0].nvlink, Some(18));
        assert!(p.warnings.is_empty(), "{:?}", p.warnings);
    }

    #[test]
    fn non_root_view_warns_acs_unknown() {
        let host = switches(1, 2, Some(ACS_ISOLATING)).unprivileged_view();
        let t = topo(&host);
        let p = plan(&t, &all_gpus(&t), &PlanOptions::default()).unwrap();
        assert_eq!(p.cliques.len(), 1);
        assert_eq!(p.pairs[0].verdict, PairRoute::AcsUnknown);
        assert!(p.pairs[0].acs.iter().all(|a| a.state == AcsState::Unknown));
        assert!(p.warnings.iter().any(|w| w.contains("as root")));
    }

    #[test]
    fn bad_selections() {
        let t = topo(&switches(1, 2, Some(ACS_ISOLATING)));
        let gpus = all_gpus(&t);
        assert_eq!(
            plan(&t, &[], &PlanOptions::default()),
            Err(PlanError::NoGpus)
        );
        assert_eq!(
            plan(&t, &[gpus[0], gpus[0]], &PlanOptions::default()),
            Err(PlanError::Duplicate(gpus[0]))
        );
        let missing: Bdf = "0000:ff:1f.7".parse().unwrap();
        assert_eq!(
            plan(&t, &[missing], &PlanOptions::default()),
            Err(PlanError::UnknownDevice(missing))
        );
        let bridge = t.ancestors(&gpus[0])[0].bdf;
        assert!(matches!(
            plan(&t, &[bridge], &PlanOptions::default()),
            Err(PlanError::NotAGpu { .. })
        ));
    }
}
