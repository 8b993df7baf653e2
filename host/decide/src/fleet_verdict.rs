//! Judges a guest's report against the plan the host made for that guest's domain:
//! every planned GPU at its guest address with its clique, no GPU the host did not give,
//! and, when the agent measured, every pair the plan says has P2P working both ways with
//! writes arriving and bandwidth above the floor for its link type.

use std::collections::BTreeMap;

use pci_config::Bdf;
use serde::{Deserialize, Serialize};
use vfio_p2p_contract::{Expectation, GuestReport, ReportedPair, Verdict};

/// What the host planned for one domain: written by `gen --state-dir`, read by the collector.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DomainPlan {
    pub domain: String,
    /// The guest CID `gen` gave the VM's vsock device.
    pub cid: u32,
    pub expectation: Expectation,
}

/// The lowest acceptable copy-engine bandwidth per link type, GB/s.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct BandwidthFloors {
    pub nvlink_gbps: f64,
    pub pcie_gbps: f64,
}

impl Default for BandwidthFloors {
    /// NVLink: well under one NVLink 3 link pair; PCIe: under half of Gen3 x16 through an IOMMU.
    fn default() -> Self {
        BandwidthFloors {
            nvlink_gbps: 20.0,
            pcie_gbps: 5.0,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Outcome {
    Pass,
    Fail,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LinkType {
    Nvlink,
    Pcie,
}

/// One planned GPU, as found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuVerdict {
    pub guest_bdf: Bdf,
    pub expected_clique: Option<u8>,
    pub found_clique: Option<u8>,
    pub found: bool,
    pub ok: bool,
}

/// One planned ordered pair, as measured (or not).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PairVerdict {
    pub src: Bdf,
    pub dst: Bdf,
    pub link: LinkType,
    pub expected: Verdict,
    /// Peer access enabled and writes arrived; `None`: not measured.
    pub p2p_ok: Option<bool>,
    pub bandwidth_gbps: Option<f64>,
    pub latency_us: Option<f64>,
    pub floor_gbps: f64,
    /// As planned; `None` (JSON `null`): the report did not measure it (a sysfs-only
    /// report, `expect --send`), so nothing is claimed for it.
    pub ok: Option<bool>,
}

/// The judged report of one domain and boot: what the state directory stores.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub domain: String,
    pub cid: u32,
    pub boot_id: String,
    /// Seconds since the Unix epoch, host clock.
    pub received_at: u64,
    pub verdict: Outcome,
    pub problems: Vec<String>,
    /// The VM name the guest claimed (ignored for filing; a mismatch is a problem).
    pub claimed_vm: String,
    pub agent_version: String,
    pub agent_exit: u8,
    pub measured: bool,
    pub gpus: Vec<GpuVerdict>,
    pub pairs: Vec<PairVerdict>,
}

/// Judges `report`, received from `plan.cid` at `received_at`.
pub fn judge(
    plan: &DomainPlan,
    report: &GuestReport,
    floors: BandwidthFloors,
    received_at: u64,
) -> Record {
    let e = &plan.expectation;
    let mut problems = Vec::new();
    if report.vm != e.vm {
        problems.push(format!(
            "the guest claims to be '{}', but CID {} belongs to '{}' (planned as '{}')",
            report.vm, plan.cid, plan.domain, e.vm
        ));
    }
    if report.agent_exit == 2 {
        problems.push("the agent could not run (exit 2)".into());
    }
    let gpus = judge_gpus(e, report, &mut problems);
    listed_twice(report, &mut problems);
    let pairs = judge_pairs(e, report, floors, &mut problems);
    judge_fabric(e, report, &mut problems);
    Record {
        domain: plan.domain.clone(),
        cid: plan.cid,
        boot_id: report.boot_id.clone(),
        received_at,
        verdict: if problems.is_empty() {
            Outcome::Pass
        } else {
            Outcome::Fail
        },
        problems,
        claimed_vm: report.vm.clone(),
        agent_version: report.agent_version.clone(),
        agent_exit: report.agent_exit,
        measured: report.measured,
        gpus,
        pairs,
    }
}

/// A VM planned on an NVSwitch fabric passes only with the guest's fabric check in the
/// report, done and clean.
fn judge_fabric(e: &Expectation, r: &GuestReport, problems: &mut Vec<String>) {
    let planned = e.fabric.is_some() || e.gpus.iter().any(|g| g.module_id.is_some());
    if !planned {
        return;
    }
    match &r.fabric {
        None => problems.push("planned on an NVSwitch fabric, but the report carries no fabric check (an agent older than the check, or one run without the expectation)".into()),
        Some(f) if !f.checked => problems.push(format!(
            "fabric not checked in the guest: {}",
            f.problems.first().map_or("no reason given", String::as_str)
        )),
        Some(f) => problems.extend(f.problems.iter().map(|p| format!("fabric: {p}"))),
    }
}

fn judge_gpus(e: &Expectation, r: &GuestReport, problems: &mut Vec<String>) -> Vec<GpuVerdict> {
    let mut out = Vec::new();
    for g in &e.gpus {
        let found = r.gpus.iter().find(|f| f.guest_bdf == g.guest_bdf);
        let ok = match found {
            None => {
                problems.push(format!("GPU {} is missing", g.guest_bdf));
                false
            }
            Some(f) if !f.clique_readable => {
                problems.push(format!(
                    "GPU {}: clique unreadable (agent not root)",
                    g.guest_bdf
                ));
                false
            }
            Some(f) if f.clique != g.clique => {
                problems.push(format!(
                    "GPU {}: clique {} where the plan has {}",
                    g.guest_bdf,
                    clique_text(f.clique),
                    clique_text(g.clique)
                ));
                false
            }
            Some(_) => true,
        };
        out.push(GpuVerdict {
            guest_bdf: g.guest_bdf,
            expected_clique: g.clique,
            found_clique: found.and_then(|f| f.clique),
            found: found.is_some(),
            ok,
        });
    }
    for f in &r.gpus {
        if e.gpu_at(f.guest_bdf).is_none() {
            problems.push(format!("GPU {} was not planned", f.guest_bdf));
        }
    }
    out
}

/// One GPU listed twice contradicts itself (two cliques for one device), and so does a pair
/// measured twice: the verdict must not rest on whichever entry came first.
fn listed_twice(r: &GuestReport, problems: &mut Vec<String>) {
    let mut listed: BTreeMap<Bdf, Vec<String>> = BTreeMap::new();
    for f in &r.gpus {
        listed
            .entry(f.guest_bdf)
            .or_default()
            .push(clique_text(f.clique));
    }
    for (bdf, cliques) in listed.iter().filter(|(_, c)| c.len() > 1) {
        problems.push(format!(
            "GPU {bdf} is listed {} times in the report (cliques {}): a report lists each GPU once",
            cliques.len(),
            cliques.join(", ")
        ));
    }
    let mut pairs: BTreeMap<(Bdf, Bdf), usize> = BTreeMap::new();
    for p in &r.pairs {
        *pairs.entry((p.src, p.dst)).or_default() += 1;
    }
    for ((src, dst), n) in pairs.iter().filter(|(_, n)| **n > 1) {
        problems.push(format!(
            "{src} → {dst} is listed {n} times in the report: a report lists each pair once"
        ));
    }
}

fn clique_text(c: Option<u8>) -> String {
    c.map_or_else(|| "none".into(), |c| c.to_string())
}

fn judge_pairs(
    e: &Expectation,
    r: &GuestReport,
    floors: BandwidthFloors,
    problems: &mut Vec<String>,
) -> Vec<PairVerdict> {
    let mut out = Vec::new();
    for p in &e.pairs {
        let link = if p.nvlink.is_some() {
            LinkType::Nvlink
        } else {
            LinkType::Pcie
        };
        let floor_gbps = match link {
            LinkType::Nvlink => floors.nvlink_gbps,
            LinkType::Pcie => floors.pcie_gbps,
        };
        for (src, dst) in [(p.a, p.b), (p.b, p.a)] {
            let m = r.pairs.iter().find(|m| m.src == src && m.dst == dst);
            let mut v = PairVerdict {
                src,
                dst,
                link,
                expected: p.verdict,
                p2p_ok: m.map(|m| m.peer_access && m.writes_ok != Some(false)),
                bandwidth_gbps: m.and_then(|m| m.bandwidth_gbps),
                latency_us: m.and_then(|m| m.latency_us),
                floor_gbps,
                ok: None,
            };
            if r.measured && p.verdict == Verdict::P2p {
                v.ok = Some(pair_problem(&v, m).map(|t| problems.push(t)).is_none());
            } else if r.measured && m.is_some() {
                // measured, and the plan asks nothing of it (no P2P planned)
                v.ok = Some(true);
            }
            out.push(v);
        }
    }
    out
}

fn pair_problem(v: &PairVerdict, m: Option<&ReportedPair>) -> Option<String> {
    let (src, dst) = (v.src, v.dst);
    let Some(m) = m else {
        return Some(format!("{src} → {dst}: not measured"));
    };
    if !m.peer_access {
        return Some(format!(
            "{src} → {dst}: no peer access where the plan has P2P"
        ));
    }
    if m.writes_ok == Some(false) {
        return Some(format!("{src} → {dst}: writes were lost"));
    }
    if v.link == LinkType::Nvlink && m.nvlinks == Some(0) {
        return Some(format!(
            "{src} → {dst}: over PCIe where the plan has NVLink"
        ));
    }
    match m.bandwidth_gbps {
        Some(b) if b < v.floor_gbps => Some(format!(
            "{src} → {dst}: {b:.1} GB/s, under the {:?} floor of {:.1} GB/s",
            v.link, v.floor_gbps
        )),
        _ => None,
    }
}
