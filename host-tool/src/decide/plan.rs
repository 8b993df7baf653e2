//! P2P clique planning: which of a VM's GPUs may share a GPUDirect clique, and why.
//!
//! The clique capability is the hypervisor's warranty that PCIe P2P works between
//! every pair of GPUs with the same ID, so a pair only shares a clique when its host
//! path is no worse than the requested level and P2P on that path is correct for
//! a VM (guest-physical addresses reach the IOMMU). NVLink peers need no clique.
//!
//! [`plan`] is the library entry point; the config generators, the libvirt hook
//! and placement call it with the GPUs of one VM.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt;

use pci_config::clique::MAX_CLIQUE;
use pci_config::{AcsFlags, Bdf};
use serde::Serialize;

use crate::model::{AcsUnknown, BridgeRole, Device, GpuPath, PathKind, Topology};

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

/// Whether PCIe P2P between two GPUs is right in a VM, and how it flows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
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

impl Verdict {
    pub const fn label(&self) -> &'static str {
        match self {
            Verdict::Nvlink => "nvlink",
            Verdict::IommuRouted => "iommu-routed",
            Verdict::Untranslated => "untranslated",
            Verdict::DirectTranslated => "direct-translated",
            Verdict::RootComplex => "root-complex",
            Verdict::CrossHostBridge => "cross-host-bridge",
            Verdict::CrossSocket => "cross-socket",
            Verdict::AcsUnknown => "acs-unknown",
        }
    }
}

impl fmt::Display for Verdict {
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
    pub verdict: Verdict,
    /// The clique both share, if any.
    pub clique: Option<u8>,
    /// Why, in words, with the consequence.
    /// Borrowed for the fixed texts: a 1,000-GPU VM has half a million pairs.
    pub explanation: Cow<'static, str>,
    pub acs: Vec<BridgeAcs>,
}

/// The cliques of one VM's GPUs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Plan {
    /// Selected P2P level, for reports.
    #[serde(skip)]
    pub p2p_level: PathKind,
    pub cliques: Vec<Clique>,
    /// Every selected GPU → its clique ID, `None` when it needs none (NVLink-only
    /// peers, no peer within the level, or not an NVIDIA GPU).
    pub assignments: BTreeMap<Bdf, Option<u8>>,
    pub pairs: Vec<Pair>,
    pub warnings: Vec<String>,
}

impl Plan {
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
pub fn plan(topo: &Topology, gpus: &[Bdf], options: &PlanOptions) -> Result<Plan, PlanError> {
    let selected = validate_selection(topo, gpus)?;
    let mut warnings = Vec::new();
    let mut pairs = Vec::new();
    for (i, a) in selected.iter().enumerate() {
        for b in &selected[i + 1..] {
            pairs.push(pair(topo, a, b));
        }
    }
    let eligible: Vec<&Device> = selected
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
        .collect();
    // Pairs are in (i, j > i) order of `selected`: a pair's index follows from the
    // positions of its ends, without a map of n² entries (a linear search here made
    // 500 GPUs take 28 s; a hash map of the pairs took most of the time for 1,000).
    let position: HashMap<Bdf, usize> = selected.iter().enumerate().map(|(i, b)| (*b, i)).collect();
    let n = selected.len();
    let find = |a: &Bdf, b: &Bdf| {
        let (x, y) = (position[a], position[b]);
        let (i, j) = (x.min(y), x.max(y));
        &pairs[i * (2 * n - i - 1) / 2 + (j - i - 1)]
    };
    let eligible_set: HashSet<Bdf> = eligible.iter().map(|d| d.bdf).collect();
    let is_eligible = |g: &Bdf| eligible_set.contains(g);
    if !options.allow_untranslated_p2p {
        if let Some(p) = pairs.iter().find(|p| {
            p.verdict == Verdict::Untranslated
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
    let clique_ok = |p: &Pair| p.path <= options.p2p_level;
    // A GPU needs a clique only for peers it reaches over PCIe but not over NVLink.
    let mut groups: Vec<Vec<Bdf>> = Vec::new();
    for d in &eligible {
        let mut placed = false;
        for g in groups.iter_mut() {
            if g.iter().all(|m| clique_ok(find(m, &d.bdf))) {
                g.push(d.bdf);
                placed = true;
                break;
            }
        }
        if !placed {
            groups.push(vec![d.bdf]);
        }
    }
    let needs_clique = |g: &Vec<Bdf>| {
        g.len() > 1
            && g.iter()
                .enumerate()
                .any(|(i, a)| g[i + 1..].iter().any(|b| find(a, b).nvlink.is_none()))
    };
    let groups: Vec<Vec<Bdf>> = groups.into_iter().filter(needs_clique).collect();
    if groups.len() > MAX_CLIQUES {
        return Err(PlanError::TooManyCliques {
            needed: groups.len(),
            groups: groups
                .iter()
                .map(|g| {
                    format!(
                        "[{}]",
                        g.iter().map(Bdf::to_string).collect::<Vec<_>>().join(" ")
                    )
                })
                .collect::<Vec<_>>()
                .join(" "),
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
    warnings.extend(pair_warnings(topo, &pairs, &assignments, options));
    Ok(Plan {
        p2p_level: options.p2p_level,
        cliques,
        assignments,
        pairs,
        warnings,
    })
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

/// Path, ACS and verdict of one pair.
fn pair(topo: &Topology, a: &Bdf, b: &Bdf) -> Pair {
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

fn untranslated_ports(p: &Pair) -> Vec<String> {
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
) -> (Verdict, Cow<'static, str>) {
    if let Some(n) = path.nvlink {
        return (
            Verdict::Nvlink,
            // the same words for every NVLink pair: the summary prints one per verdict, and
            // the pair's PCIe path stands in its own column (`NV18 (PIX)`)
            format!("NVLink ×{n}: the driver does P2P over NVLink without a clique").into(),
        );
    }
    match path.kind {
        PathKind::X => (Verdict::IommuRouted, "same device".into()),
        PathKind::Pix | PathKind::Pxb => {
            let ports = steering_ports(path, acs);
            if let Some(why) = ports
                .iter()
                .filter(|p| p.state == AcsState::Unknown)
                .find_map(|p| Some((p.bridge, topo.device(&p.bridge)?.acs_unknown()?)))
            {
                return (Verdict::AcsUnknown, acs_unknown_explanation(why));
            }
            if ports.iter().all(redirects) {
                return (
                    Verdict::IommuRouted,
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
                    Verdict::DirectTranslated,
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
                Verdict::Untranslated,
                format!(
                    "ACS RR/CR cleared below the switch: the switch routes guest-physical addresses \
                     without IOMMU translation, so P2P is wrong in a VM{shared}"
                )
                .into(),
            )
        }
        PathKind::Phb => (
            Verdict::RootComplex,
            "through the host bridge (root complex): translated by the IOMMU; whether the \
             root complex forwards P2P between its ports is platform-dependent"
                .into(),
        ),
        PathKind::Node => (
            Verdict::CrossHostBridge,
            "between host bridges (root complexes) of one NUMA node: P2P is platform-dependent"
                .into(),
        ),
        PathKind::Sys => (
            Verdict::CrossSocket,
            "across sockets (QPI/UPI/xGMI): P2P is unsupported across sockets on Intel and \
             platform-dependent elsewhere"
                .into(),
        ),
    }
}

/// Warnings about the pairs that share a clique, one line per kind of concern.
fn pair_warnings(
    topo: &Topology,
    pairs: &[Pair],
    assignments: &BTreeMap<Bdf, Option<u8>>,
    options: &PlanOptions,
) -> Vec<String> {
    let mut out = Vec::new();
    let in_clique = |v: Verdict| -> Vec<String> {
        pairs
            .iter()
            .filter(|p| p.clique.is_some() && p.verdict == v)
            .map(|p| format!("{}↔{}", p.a, p.b))
            .collect()
    };
    let list = |v: Vec<String>| v.join(", ");
    let routed = in_clique(Verdict::IommuRouted);
    if !routed.is_empty() {
        out.push(format!(
            "P2P is IOMMU-routed through the root complex for {}: correct in a VM, slower than bare metal",
            list(routed)
        ));
    }
    let untranslated = in_clique(Verdict::Untranslated);
    if !untranslated.is_empty() {
        out.push(format!(
            "--allow-untranslated-p2p: {} share a clique although their switch routes guest-physical \
             addresses untranslated; this is only right with the IOMMU off or identity-mapped for the VM",
            list(untranslated)
        ));
    }
    let unknown = in_clique(Verdict::AcsUnknown);
    if !unknown.is_empty() {
        let corrupt: BTreeSet<String> = pairs
            .iter()
            .filter(|p| p.clique.is_some() && p.verdict == Verdict::AcsUnknown)
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
                "ACS state unknown for {} (not running as root): the clique assumes the switch \
                 redirects P2P to the IOMMU; run `vfio-p2p plan` as root to verify",
                list(unknown)
            )
        } else {
            format!(
                "ACS state unknown for {}: a corrupt capability list on {} (see the warnings); \
                 the clique assumes the switch redirects P2P to the IOMMU",
                list(unknown),
                corrupt.into_iter().collect::<Vec<_>>().join(", ")
            )
        });
    }
    let rc = in_clique(Verdict::RootComplex);
    if !rc.is_empty() {
        out.push(format!(
            "--p2p-level {}: {} do P2P through the root complex (PHB), which is platform-dependent; \
             verify with the guest agent",
            options.p2p_level.label().to_lowercase(),
            list(rc)
        ));
    }
    let node = in_clique(Verdict::CrossHostBridge);
    if !node.is_empty() {
        out.push(format!(
            "--p2p-level {}: {} do P2P across root complexes, which is platform-dependent; \
             verify with the guest agent",
            options.p2p_level.label().to_lowercase(),
            list(node)
        ));
    }
    let sys = in_clique(Verdict::CrossSocket);
    if !sys.is_empty() {
        let intel = topo
            .devices
            .values()
            .any(|d| d.bridge_role() == Some(BridgeRole::RootPort) && d.vendor == 0x8086);
        out.push(format!(
            "--p2p-level sys: {} do P2P across sockets, which is unsupported on Intel (QPI/UPI){}",
            list(sys),
            if intel {
                " — and this host's root ports are Intel's: expect P2P to fail or corrupt data"
            } else {
                " and platform-dependent elsewhere; verify with the guest agent"
            }
        ));
    }
    let lonely: Vec<String> = assignments
        .iter()
        .filter(|(g, c)| {
            c.is_none()
                && topo.device(g).is_some_and(Device::is_nvidia_gpu)
                && pairs
                    .iter()
                    .filter(|p| p.a == **g || p.b == **g)
                    .any(|p| p.nvlink.is_none())
        })
        .map(|(g, _)| g.to_string())
        .collect();
    if !lonely.is_empty() {
        out.push(format!(
            "no clique for {}: no other selected GPU within --p2p-level {} without NVLink, so PCIe P2P stays off for them",
            lonely.join(", "),
            options.p2p_level.label().to_lowercase()
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::read::HostRecord;
    use crate::synth::{self, Attach, EndpointSpec, HostBuilder, ACS_ISOLATING};

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
        assert_eq!(inner.verdict, Verdict::IommuRouted);
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
        assert_eq!(across.verdict, Verdict::CrossHostBridge);
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
        assert_eq!(p.pairs[0].verdict, Verdict::Untranslated);
        assert!(p.warnings.iter().any(|w| w.contains("untranslated")));
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
        let sizes = |p: &Plan| p.cliques.iter().map(|c| c.gpus.len()).collect::<Vec<_>>();
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
        assert_eq!(p.pairs[0].verdict, Verdict::Nvlink);
        assert_eq!(p.pairs[0].nvlink, Some(18));
        assert!(p.warnings.is_empty(), "{:?}", p.warnings);
    }

    #[test]
    fn non_root_view_warns_acs_unknown() {
        let host = switches(1, 2, Some(ACS_ISOLATING)).unprivileged_view();
        let t = topo(&host);
        let p = plan(&t, &all_gpus(&t), &PlanOptions::default()).unwrap();
        assert_eq!(p.cliques.len(), 1);
        assert_eq!(p.pairs[0].verdict, Verdict::AcsUnknown);
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
