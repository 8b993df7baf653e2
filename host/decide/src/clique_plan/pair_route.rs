//! One pair's route: the bridges on its path with their ACS state, where the switches'
//! ACS sends its peer TLPs (up to the IOMMU, direct, or untranslated), and the verdict
//! in words.

use std::borrow::Cow;
use std::fmt;

use pci_config::{AcsFlags, Bdf, PathKind};
use serde::Serialize;
use vfio_p2p_model::{AcsUnknown, BridgeRole, GpuPath, Topology};

/// Whether PCIe P2P between two GPUs is right in a VM, and how it flows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PairRoute {
    /// NVLink/NVSwitch: the driver uses NVLink, no clique needed.
    Nvlink,
    /// ACS RR+CR on the switch ports: peer TLPs go up to the root complex and the IOMMU.
    IommuRouted,
    /// RR/CR cleared below a switch: the switch routes untranslated guest-physical addresses.
    Untranslated,
    /// RR/CR cleared but ATS enabled on both GPUs and DT on the ports: translated P2P goes direct.
    DirectTranslated,
    /// Through one host bridge (different root ports): translated by the IOMMU.
    RootComplex,
    /// Between host bridges of one NUMA node.
    CrossHostBridge,
    /// Across NUMA nodes / sockets.
    CrossSocket,
    /// ACS state of a port on the path is unknown (config space unreadable).
    AcsUnknown,
}

impl PairRoute {
    pub const fn label(&self) -> &'static str {
        match self {
            PairRoute::Nvlink => "nvlink",
            PairRoute::IommuRouted => "iommu-routed",
            PairRoute::Untranslated => "untranslated",
            PairRoute::DirectTranslated => "direct-translated",
            PairRoute::RootComplex => "root-complex",
            PairRoute::CrossHostBridge => "cross-host-bridge",
            PairRoute::CrossSocket => "cross-socket",
            PairRoute::AcsUnknown => "acs-unknown",
        }
    }
}

impl fmt::Display for PairRoute {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// ACS state of one bridge on a pair's path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BridgeAcs {
    pub bridge: Bdf,
    pub role: Option<BridgeRole>,
    /// `present`, `absent` (no ACS capability) or `unknown` (config space not readable).
    pub state: AcsState,
    /// Control bits set, when present.
    pub control: Option<AcsFlags>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AcsState {
    Present,
    Absent,
    Unknown,
}

/// The path, ACS bits and verdict of one GPU pair.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Pair {
    pub a: Bdf,
    pub b: Bdf,
    /// PCIe path label (`PIX`, `PXB`, `PHB`, `NODE`, `SYS`).
    pub path: PathKind,
    pub nvlink: Option<u8>,
    pub verdict: PairRoute,
    /// The clique both share, if any.
    pub clique: Option<u8>,
    /// Why, in words, with the consequence.
    /// Borrowed for the fixed texts: a 1,000-GPU VM has half a million pairs.
    pub explanation: Cow<'static, str>,
    pub acs: Vec<BridgeAcs>,
}

/// Path, ACS and verdict of one pair.
pub(super) fn pair(topo: &Topology, a: &Bdf, b: &Bdf) -> Pair {
    let path = topo.path(a, b);
    let acs: Vec<BridgeAcs> = path
        .bridges
        .iter()
        .filter_map(|br| topo.device(br))
        .map(|d| BridgeAcs {
            bridge: d.bdf,
            role: d.bridge_role(),
            state: match (d.acs_unknown(), d.acs) {
                (Some(_), _) => AcsState::Unknown,
                (None, Some(_)) => AcsState::Present,
                (None, None) => AcsState::Absent,
            },
            control: d.acs.map(|c| c.control),
        })
        .collect();
    let (verdict, explanation) = verdict(topo, a, b, &path, &acs);
    Pair {
        a: *a,
        b: *b,
        path: path.kind,
        nvlink: path.nvlink,
        verdict,
        clique: None,
        explanation,
        acs,
    }
}

/// The bridges whose ACS decides where peer TLPs go: downstream ports of the switch(es)
/// below the pair's lowest common bridge, and legacy PCI bridges (which never redirect).
fn steering_ports(path: &GpuPath, acs: &[BridgeAcs]) -> Vec<BridgeAcs> {
    if !matches!(path.kind, PathKind::Pix | PathKind::Pxb) {
        return vec![];
    }
    acs.iter()
        .filter(|b| {
            matches!(
                b.role,
                Some(BridgeRole::DownstreamPort) | Some(BridgeRole::PciBridge)
            )
        })
        .cloned()
        .collect()
}

fn redirects(b: &BridgeAcs) -> bool {
    b.control
        .is_some_and(|c| c.has(AcsFlags::RR) && c.has(AcsFlags::CR))
}

pub(super) fn untranslated_ports(p: &Pair) -> Vec<String> {
    p.acs
        .iter()
        .filter(|b| {
            matches!(
                b.role,
                Some(BridgeRole::DownstreamPort) | Some(BridgeRole::PciBridge)
            ) && b.state != AcsState::Unknown
                && !redirects(b)
        })
        .map(|b| match b.control {
            Some(c) => format!("{} ({c})", b.bridge),
            None => format!("{} (no ACS capability)", b.bridge),
        })
        .collect()
}

/// Why a port's ACS is unknown, and what would tell.
fn acs_unknown_explanation((port, why): (Bdf, AcsUnknown)) -> Cow<'static, str> {
    match why {
        AcsUnknown::NotRoot => "the switch ports' ACS state is unknown (config space beyond 64 bytes is \
             readable only by root); run as root to learn whether P2P is routed through the IOMMU"
            .into(),
        AcsUnknown::CorruptCapabilityList(e) => format!(
            "the ACS state of switch port {port} is unknown, not absent: its config space has a {e}; \
             check it with `lspci -vvv -s {port}`"
        )
        .into(),
    }
}

fn verdict(
    topo: &Topology,
    a: &Bdf,
    b: &Bdf,
    path: &GpuPath,
    acs: &[BridgeAcs],
) -> (PairRoute, Cow<'static, str>) {
    if let Some(n) = path.nvlink {
        return (
            PairRoute::Nvlink,
            // the same words for every NVLink pair: the summary prints one per verdict, and
            // the pair's PCIe path stands in its own column (`NV18 (PIX)`)
            format!("NVLink ×{n}: the driver does P2P over NVLink without a clique").into(),
        );
    }
    match path.kind {
        PathKind::X => (PairRoute::IommuRouted, "same device".into()),
        PathKind::Pix | PathKind::Pxb => {
            let ports = steering_ports(path, acs);
            if let Some(why) = ports
                .iter()
                .filter(|p| p.state == AcsState::Unknown)
                .find_map(|p| Some((p.bridge, topo.device(&p.bridge)?.acs_unknown()?)))
            {
                return (PairRoute::AcsUnknown, acs_unknown_explanation(why));
            }
            if ports.iter().all(redirects) {
                return (
                    PairRoute::IommuRouted,
                    "ACS RR+CR set on the switch ports: P2P goes up to the root complex and is \
                     translated by the IOMMU; correct in a VM, but slower than bare metal \
                     (higher latency, bandwidth bounded by the root complex)"
                        .into(),
                );
            }
            let ats_on = |g: &Bdf| {
                topo.device(g)
                    .and_then(|d| d.ats)
                    .is_some_and(|t| t.enabled)
            };
            let dt = ports
                .iter()
                .all(|p| redirects(p) || p.control.is_some_and(|c| c.has(AcsFlags::DT)));
            if ats_on(a) && ats_on(b) && dt {
                return (
                    PairRoute::DirectTranslated,
                    "ACS RR/CR cleared, but both GPUs use ATS and the ports allow direct \
                     translated P2P (DT): translated requests go peer to peer"
                        .into(),
                );
            }
            let group = |g: &Bdf| topo.device(g).and_then(|d| d.iommu_group);
            let shared = match (group(a), group(b)) {
                (Some(x), Some(y)) if x == y => format!("; they share IOMMU group {x}"),
                _ => String::new(),
            };
            (
                PairRoute::Untranslated,
                format!(
                    "ACS RR/CR cleared below the switch: the switch routes guest-physical addresses \
                     without IOMMU translation, so P2P is wrong in a VM{shared}"
                )
                .into(),
            )
        }
        PathKind::Phb => (
            PairRoute::RootComplex,
            "through the host bridge (root complex): translated by the IOMMU; whether the \
             root complex forwards P2P between its ports is platform-dependent"
                .into(),
        ),
        PathKind::Node => (
            PairRoute::CrossHostBridge,
            "between host bridges (root complexes) of one NUMA node: P2P is platform-dependent"
                .into(),
        ),
        PathKind::Sys => (
            PairRoute::CrossSocket,
            "across sockets (QPI/UPI/xGMI): P2P is unsupported across sockets on Intel and \
             platform-dependent elsewhere"
                .into(),
        ),
    }
}
