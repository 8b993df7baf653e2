//! The warnings about the pairs that share a clique: routed through the root complex,
//! untranslated, ACS unknown, across root complexes or sockets, and GPUs left without one.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use pci_config::{Bdf, PathKind};
use vfio_p2p_model::{AcsUnknown, BridgeRole, Device, Topology};

use super::pair_route::{Pair, PairRoute};
use crate::plan_reach;

/// What the warnings are made from.
pub(super) struct WarningContext<'a> {
    pub(super) topo: &'a Topology,
    /// The listed pairs (every pair up to
    /// [`PAIR_LIST_MAX_GPUS`](super::PAIR_LIST_MAX_GPUS) GPUs).
    pub(super) pairs: &'a [Pair],
    pub(super) assignments: &'a BTreeMap<Bdf, Option<u8>>,
    /// Each clique's GPUs.
    pub(super) cliques: Vec<&'a [Bdf]>,
    /// Selected peers over NVLink, per GPU.
    pub(super) degree: &'a HashMap<Bdf, usize>,
    /// The level the cliques were planned at.
    pub(super) p2p_level: PathKind,
}

/// The most pairs one warning names; the others are counted.
const WARNING_PAIRS: usize = 64;

impl WarningContext<'_> {
    /// The pairs sharing a clique with verdict `v`, named up to [`WARNING_PAIRS`], then
    /// counted (with those a large plan does not list); `None` when there are none.
    fn in_clique(&self, v: PairRoute) -> Option<String> {
        let listed: Vec<String> = self
            .pairs
            .iter()
            .filter(|p| p.clique.is_some() && p.verdict == v)
            .map(|p| format!("{}↔{}", p.a, p.b))
            .collect();
        let unlisted = match v {
            PairRoute::RootComplex => self.unlisted_in_cliques(PathKind::Phb),
            PairRoute::CrossHostBridge => self.unlisted_in_cliques(PathKind::Node),
            PairRoute::CrossSocket => self.unlisted_in_cliques(PathKind::Sys),
            _ => 0,
        };
        let more = listed.len().saturating_sub(WARNING_PAIRS) + unlisted;
        if listed.is_empty() && more == 0 {
            return None;
        }
        let mut text = listed
            .into_iter()
            .take(WARNING_PAIRS)
            .collect::<Vec<_>>()
            .join(", ");
        if more > 0 {
            text = match text.is_empty() {
                true => format!("{more} pair(s)"),
                false => format!("{text} and {more} more pair(s)"),
            };
        }
        Some(text)
    }

    /// Pairs sharing a clique over PCIe path `kind` that the plan does not list.
    fn unlisted_in_cliques(&self, kind: PathKind) -> usize {
        if self.pairs.len() * 2 >= self.assignments.len() * (self.assignments.len() - 1) {
            return 0; // every pair is listed
        }
        let counted: usize = self
            .cliques
            .iter()
            .flat_map(|c| plan_reach::far_pairs_by_path(self.topo, c))
            .filter(|(k, _)| *k == kind)
            .map(|(_, n)| n)
            .sum();
        let listed = self
            .pairs
            .iter()
            .filter(|p| p.clique.is_some() && p.path == kind)
            .count();
        counted.saturating_sub(listed)
    }
}

/// Warnings about the pairs that share a clique, one line per kind of concern.
pub(super) fn pair_warnings(cx: &WarningContext<'_>) -> Vec<String> {
    let (topo, pairs, p2p_level) = (cx.topo, cx.pairs, cx.p2p_level);
    let mut out = Vec::new();
    if let Some(routed) = cx.in_clique(PairRoute::IommuRouted) {
        out.push(format!(
            "P2P is IOMMU-routed through the root complex for {routed}: correct in a VM, slower than bare metal"
        ));
    }
    if let Some(untranslated) = cx.in_clique(PairRoute::Untranslated) {
        out.push(format!(
            "--allow-untranslated-p2p: {untranslated} share a clique although their switch routes guest-physical \
             addresses untranslated; this is only right with the IOMMU off or identity-mapped for the VM"
        ));
    }
    if let Some(unknown) = cx.in_clique(PairRoute::AcsUnknown) {
        let corrupt: BTreeSet<String> = pairs
            .iter()
            .filter(|p| p.clique.is_some() && p.verdict == PairRoute::AcsUnknown)
            .flat_map(|p| &p.acs)
            .filter(|b| {
                topo.device(&b.bridge)
                    .and_then(Device::acs_unknown)
                    .is_some_and(|w| w != AcsUnknown::NotRoot)
            })
            .map(|b| b.bridge.to_string())
            .collect();
        out.push(if corrupt.is_empty() {
            format!(
                "ACS state unknown for {unknown} (not running as root): the clique assumes the switch \
                 redirects P2P to the IOMMU; run `vfio-p2p plan` as root to verify"
            )
        } else {
            format!(
                "ACS state unknown for {}: a corrupt capability list on {} (see the warnings); \
                 the clique assumes the switch redirects P2P to the IOMMU",
                unknown,
                corrupt.into_iter().collect::<Vec<_>>().join(", ")
            )
        });
    }
    if let Some(rc) = cx.in_clique(PairRoute::RootComplex) {
        out.push(format!(
            "--p2p-level {}: {rc} do P2P through the root complex (PHB), which is platform-dependent; \
             verify with the guest agent",
            p2p_level.label().to_lowercase(),
        ));
    }
    if let Some(node) = cx.in_clique(PairRoute::CrossHostBridge) {
        out.push(format!(
            "--p2p-level {}: {node} do P2P across root complexes, which is platform-dependent; \
             verify with the guest agent",
            p2p_level.label().to_lowercase(),
        ));
    }
    if let Some(sys) = cx.in_clique(PairRoute::CrossSocket) {
        let intel = topo
            .devices
            .values()
            .any(|d| d.bridge_role() == Some(BridgeRole::RootPort) && d.vendor == 0x8086);
        out.push(format!(
            "--p2p-level sys: {sys} do P2P across sockets, which is unsupported on Intel (QPI/UPI){}",
            if intel {
                " — and this host's root ports are Intel's: expect P2P to fail or corrupt data"
            } else {
                " and platform-dependent elsewhere; verify with the guest agent"
            }
        ));
    }
    // a GPU without a clique that has a peer it does not reach over NVLink
    let peers = cx.assignments.len() - 1;
    let lonely: Vec<String> = cx
        .assignments
        .iter()
        .filter(|(g, c)| {
            c.is_none()
                && topo.device(g).is_some_and(Device::is_nvidia_gpu)
                && cx.degree.get(*g).copied().unwrap_or(0) < peers
        })
        .map(|(g, _)| g.to_string())
        .collect();
    if !lonely.is_empty() {
        out.push(format!(
            "no clique for {}: no other selected GPU within --p2p-level {} without NVLink, so PCIe P2P stays off for them",
            lonely.join(", "),
            p2p_level.label().to_lowercase()
        ));
    }
    out
}
