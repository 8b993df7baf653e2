//! `report`: everything about every ordered pair, with a one-line verdict each, and
//! the comparison with a bare-metal run of the same GPUs (`--baseline`).

use pci_config::Bdf;
use serde::{Deserialize, Serialize};

use crate::expect::ExpectReport;
use crate::guest_topo::TopoReport;
use crate::measure::{PairReport, Phases};
use crate::peers::{GpuInfo, PeerCheck};
use crate::sysfs::gpus::Scan;
use vfio_p2p_contract::{Expectation, Verdict};

/// Where the agent ran.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostInfo {
    /// A hypervisor is visible (CPUID flag): PCIe P2P then goes through the IOMMU.
    pub virtual_machine: bool,
    pub cuda_driver_version: i32,
    pub nvml: bool,
}

/// VM / bare-metal ratios of one pair.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BaselineRatio {
    pub src: Bdf,
    pub dst: Bdf,
    /// How the baseline pair was found: `uuid` or `bus_id`.
    pub matched_by: String,
    /// Latencies: VM / bare metal (above 1: slower in the VM).
    pub one_way_latency: Option<f64>,
    pub remote_read_latency: Option<f64>,
    pub memcpy_latency: Option<f64>,
    /// Bandwidths: VM / bare metal (below 1: slower in the VM).
    pub ce_bandwidth: Option<f64>,
    pub ce_bidir_bandwidth: Option<f64>,
    pub sm_copy_bandwidth: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub agent_version: String,
    pub host: HostInfo,
    pub quick: bool,
    pub scan: Option<Scan>,
    pub expect: Option<ExpectReport>,
    /// Path labels in the guest against the host's (with an expectation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topo: Option<TopoReport>,
    /// Each GPU's module id and NVSwitch fabric registration (NVML), judged against the
    /// planned partition when the expectation has one (absent without NVML).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fabric: Option<crate::fabric::FabricReport>,
    pub gpus: Vec<GpuInfo>,
    pub pairs: Vec<PairReport>,
    pub baseline: Option<Vec<BaselineRatio>>,
    /// The NCCL topology file NCCL_TOPO_FILE names, checked against the guest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nccl_topo: Option<crate::nccl_topo::NcclTopoCheck>,
    /// How the pairs were measured and what 8 GPUs would take (absent in older reports).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<crate::schedule::Estimate>,
    /// The rounds of disjoint pairs as they ran: at once or one pair at a time, and why
    /// (absent in older reports).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rounds: Option<Vec<crate::schedule::RoundRecord>>,
    /// Peer access across processes (`report --cross-process`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cross_process: Option<Vec<crate::cross_process::CrossProcessResult>>,
    /// Where the time went (absent in older reports).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phases: Option<Phases>,
    pub elapsed_s: f64,
}

impl Report {
    /// What 8 GPUs of this kind would take, from this run: the setup per GPU (the phases
    /// other than verify, bench and cross-process), and the time of one ordered pair: from
    /// the rounds as they ran (a concurrent round counts as one pair's time), else from
    /// the verify and bench phases over the measured pairs (reports without rounds). The
    /// fabric is non-blocking when every measured pair is (see [`crate::schedule::pair_fabric`]).
    pub fn eight_gpu_estimate(&self, phases: &Phases) -> Option<crate::schedule::Estimate> {
        use crate::schedule::{pair_fabric, Fabric};
        let measured: Vec<&PairReport> = self.pairs.iter().filter(|p| p.bench.is_some()).collect();
        if measured.is_empty() || self.gpus.len() < 2 {
            return None;
        }
        let sum = |pick: &dyn Fn(&str) -> bool| -> f64 {
            phases
                .laps
                .iter()
                .filter(|(n, _)| pick(n))
                .map(|(_, s)| s)
                .sum()
        };
        let setup = sum(&|n| {
            !n.starts_with("verify") && !n.starts_with("bench") && !n.starts_with("cross")
        });
        let from_rounds = self
            .rounds
            .as_ref()
            .filter(|r| !r.is_empty())
            .map(|rounds| {
                let time: f64 = rounds
                    .iter()
                    .map(|r| r.verify_s.unwrap_or(0.0) + r.bench_s)
                    .sum();
                let steps: usize = rounds
                    .iter()
                    .map(|r| if r.concurrent { 1 } else { r.pairs.len() })
                    .sum();
                let ways = measured.len() as f64
                    / rounds.iter().map(|r| r.pairs.len()).sum::<usize>() as f64;
                time / steps as f64 / ways
            });
        let pair_s = from_rounds.unwrap_or_else(|| {
            sum(&|n| n.starts_with("verify") || n.starts_with("bench")) / measured.len() as f64
        });
        let scan = self.scan.as_ref();
        let all_switched = measured.iter().all(|p| {
            let nvlinks = p.peer.link.as_ref().map(|l| l.nvlinks);
            pair_fabric(nvlinks, scan.and_then(|s| s.part_of(p.src))).0 == Fabric::NonBlocking
        });
        let fabric = if all_switched {
            Fabric::NonBlocking
        } else {
            Fabric::Shared
        };
        Some(crate::schedule::estimate(
            8,
            fabric,
            self.gpus.len(),
            setup,
            pair_s,
        ))
    }

    /// Exit status: 0 all as expected, 1 otherwise.
    pub fn exit_code(&self) -> i32 {
        let gpus_ok = self.expect.as_ref().is_none_or(|e| e.mismatches() == 0)
            && self.topo.as_ref().is_none_or(|t| t.mismatches() == 0)
            && self.fabric.as_ref().is_none_or(|f| f.mismatches() == 0);
        let pairs_ok = self.pairs.iter().all(|p| p.as_expected);
        let nccl_ok = self.nccl_topo.as_ref().is_none_or(|c| c.ok());
        let across_ok = self
            .cross_process
            .as_ref()
            .is_none_or(|v| v.iter().all(|r| r.ok()));
        if gpus_ok && pairs_ok && nccl_ok && across_ok {
            0
        } else {
            1
        }
    }

    fn uuid(&self, bdf: Bdf) -> Option<&str> {
        self.gpus
            .iter()
            .find(|g| g.bus_id == bdf)
            .map(|g| g.uuid.as_str())
    }

    /// Ratios against `base` (the same GPUs on bare metal), pair by pair. Pairs are
    /// matched by GPU UUIDs (stable across pass-through), else by PCI addresses.
    pub fn compare_with(&self, base: &Report) -> Vec<BaselineRatio> {
        let mut out = Vec::new();
        for p in &self.pairs {
            let by_uuid = match (self.uuid(p.src), self.uuid(p.dst)) {
                (Some(us), Some(ud)) => base
                    .pairs
                    .iter()
                    .find(|b| base.uuid(b.src) == Some(us) && base.uuid(b.dst) == Some(ud)),
                _ => None,
            };
            let (found, matched_by) = match by_uuid {
                Some(b) => (Some(b), "uuid"),
                None => (
                    base.pairs.iter().find(|b| b.src == p.src && b.dst == p.dst),
                    "bus_id",
                ),
            };
            let (Some(b), Some(vm)) = (found, &p.bench) else {
                continue;
            };
            let Some(bm) = &b.bench else {
                continue;
            };
            let r = |v: f64, base: f64| (base > 0.0).then(|| v / base);
            let opt =
                |v: &Option<crate::stats::Stat>, base: &Option<crate::stats::Stat>| match (v, base)
                {
                    (Some(v), Some(b)) => r(v.median, b.median),
                    _ => None,
                };
            out.push(BaselineRatio {
                src: p.src,
                dst: p.dst,
                matched_by: matched_by.into(),
                one_way_latency: opt(&vm.one_way_latency_us, &bm.one_way_latency_us),
                remote_read_latency: r(
                    vm.remote_read_latency_us.median,
                    bm.remote_read_latency_us.median,
                ),
                memcpy_latency: r(vm.memcpy_latency_us.median, bm.memcpy_latency_us.median),
                ce_bandwidth: r(vm.ce_bandwidth_gbps.median, bm.ce_bandwidth_gbps.median),
                ce_bidir_bandwidth: r(
                    vm.ce_bidir_bandwidth_gbps.median,
                    bm.ce_bidir_bandwidth_gbps.median,
                ),
                sm_copy_bandwidth: r(
                    vm.sm_copy_bandwidth_gbps.median,
                    bm.sm_copy_bandwidth_gbps.median,
                ),
            });
        }
        out
    }

    /// Recomputes every pair's verdict and summary (after loading, or adding a baseline).
    pub fn judge(&mut self) {
        let vm = self.host.virtual_machine;
        let baseline = self.baseline.clone();
        let links: Vec<_> = self
            .pairs
            .iter()
            .map(|p| self.link_expectation(p))
            .collect();
        for (p, link) in self.pairs.iter_mut().zip(links) {
            p.link_verdict = link
                .zip(p.bench.as_ref())
                .map(|(e, b)| crate::link_verdict::judge(b, &e));
            let ratio = baseline
                .as_ref()
                .and_then(|b| b.iter().find(|r| r.src == p.src && r.dst == p.dst));
            let (ok, summary) = judge_pair(p, vm, ratio);
            p.as_expected = ok;
            p.summary = summary;
        }
    }
}

impl Report {
    /// What the pair's link should carry: NVLink from NVML's link count and the GPU's
    /// part, else PCIe from the slower end's sysfs speed and width; `None` when unknown.
    pub fn link_expectation(&self, p: &PairReport) -> Option<crate::link_verdict::LinkExpectation> {
        use crate::link_verdict::{
            nvlink_expectation, parse_gts, pcie_expectation, pcie_lane_gbps,
        };
        let scan = self.scan.as_ref()?;
        let (a, b) = (scan.gpu(p.src)?, scan.gpu(p.dst)?);
        match &p.peer.link {
            Some(l) if l.nvlinks > 0 => {
                let device = u16::from_str_radix(a.device.trim_start_matches("0x"), 16).ok()?;
                nvlink_expectation(l.nvlinks, device)
            }
            _ => {
                let end = |g: &crate::sysfs::gpus::GpuScan| {
                    let gts = parse_gts(g.link_speed.as_deref()?)?;
                    Some((
                        gts,
                        g.link_width?,
                        pcie_lane_gbps(gts)? * f64::from(g.link_width?),
                    ))
                };
                let (ea, eb) = (end(a)?, end(b)?);
                let slower = if ea.2 <= eb.2 { ea } else { eb };
                pcie_expectation(slower.0, slower.1)
            }
        }
    }
}

/// Fills in a pair's expectation from the host's document.
pub fn attach_expectation(pair: &mut PairReport, expect: Option<&Expectation>) {
    if let Some(e) = expect.and_then(|e| e.pair(pair.src, pair.dst)) {
        pair.expected = Some(e.verdict);
        pair.expected_nvlinks = e.nvlink.map(u32::from);
    }
}

/// The path in words: "NVLink (NV18)", "PCIe (IOMMU-routed)", "PCIe (PIX)".
pub fn path_text(peer: &PeerCheck, vm: bool) -> String {
    match &peer.link {
        Some(l) if l.is_nvlink() => format!("NVLink ({})", l.label),
        Some(_) | None if vm => "PCIe (IOMMU-routed)".into(),
        Some(l) => format!("PCIe ({})", l.label),
        None => "an unidentified link (no NVML)".into(),
    }
}

fn times(x: f64) -> String {
    if x >= 10.0 {
        format!("{x:.0}×")
    } else {
        format!("{x:.1}×")
    }
}

/// Whether the pair is as expected, and one line that says how it is.
pub fn judge_pair(p: &PairReport, vm: bool, baseline: Option<&BaselineRatio>) -> (bool, String) {
    let want_p2p = p.expected != Some(Verdict::NoP2p);
    let expectation = match p.expected {
        Some(Verdict::P2p) => " (the host expected P2P)",
        Some(Verdict::NoP2p) => " (the host expected no P2P)",
        None => "",
    };
    if !p.peer.can_access {
        let ok = !want_p2p;
        let head = if ok { "no P2P, as expected" } else { "NO P2P" };
        return (
            ok,
            format!("{head}: the driver reports no peer access{expectation}"),
        );
    }
    if !want_p2p {
        return (
            false,
            format!("UNEXPECTED P2P: the driver reports peer access{expectation}"),
        );
    }
    if let Some(e) = &p.peer.enable_error {
        return (
            false,
            format!("P2P REFUSED: enabling peer access failed: {e}"),
        );
    }
    if let Some(v) = &p.verify {
        let lost = |what: &str, c: &crate::verify::WriteCheck| {
            format!(
                "{} of {} words of a {what} from {} never reached {} (first at word {})",
                c.bad_words,
                v.words,
                p.src,
                p.dst,
                c.first_bad.unwrap_or(0)
            )
        };
        let mut broken = Vec::new();
        if !v.kernel_write.ok() {
            broken.push(lost("kernel write", &v.kernel_write));
        }
        if !v.ce_copy.ok() {
            broken.push(lost("copy-engine copy", &v.ce_copy));
        }
        let note = v.injected.as_ref().map(|i| self_test_note(v, i));
        if !broken.is_empty() {
            let mut line = format!("P2P BROKEN: {}", broken.join("; "));
            if let Some(n) = note {
                line.push_str(&format!("; {n}"));
            }
            return (false, line);
        }
        if let Some(n) = note {
            return (true, format!("P2P OK; {n}"));
        }
    }
    if p.bench.as_ref().is_some_and(|b| b.pingpong_timed_out) {
        return (
            false,
            "P2P BROKEN: a ping-pong flag write never arrived (kernel timed out)".into(),
        );
    }
    let path = path_text(&p.peer, vm);
    let mut nvlink_note = String::new();
    let mut ok = true;
    if let (Some(want), Some(link)) = (p.expected_nvlinks, &p.peer.link) {
        if link.nvlinks > 0 && link.nvlinks != want {
            ok = false;
            nvlink_note = format!("; MISMATCH: {} NVLinks, the host has {want}", link.nvlinks);
        }
    }
    let verified = if p.verify.is_some() { "OK" } else { "enabled" };
    let Some(b) = &p.bench else {
        return (ok, format!("P2P {verified} over {path}{nvlink_note}"));
    };
    let latency = b
        .one_way_latency_us
        .as_ref()
        .map(|l| format!("{:.2} µs", l.median))
        .unwrap_or_else(|| format!("{:.2} µs per small copy", b.memcpy_latency_us.median));
    let bw = b.ce_bandwidth_gbps.median;
    let mut line = format!("P2P {verified} over {path}, {latency}, {bw:.0} GB/s");
    if b.disabled_bandwidth_gbps.median > 0.0 {
        line.push_str(&format!(
            "; {} faster than disabled",
            times(bw / b.disabled_bandwidth_gbps.median)
        ));
    }
    if let Some(r) = baseline {
        let mut parts = Vec::new();
        if let Some(x) = r.one_way_latency {
            parts.push(format!("latency {x:.2}×"));
        }
        if let Some(x) = r.ce_bandwidth {
            parts.push(format!("bandwidth {x:.2}×"));
        }
        if !parts.is_empty() {
            line.push_str(&format!("; vs bare metal: {}", parts.join(", ")));
        }
    }
    line.push_str(&nvlink_note);
    if let Some(v) = &p.link_verdict {
        if v.host_staged {
            line = line.replacen(&format!("P2P {verified}"), "P2P HOST-STAGED", 1);
        }
        line.push_str(&format!("; {}", v.line));
        ok &= v.ok;
    }
    (ok, line)
}

/// What `--inject` (a self-test) corrupted and whether the check saw exactly the
/// destination's words: each write's check must count every injected destination word
/// and name the first, and never a source word.
fn self_test_note(v: &crate::verify::VerifyResult, i: &crate::verify::Injection) -> String {
    let mut dst = i.dst_words.clone();
    dst.sort_unstable();
    dst.dedup();
    let exact = |c: &crate::verify::WriteCheck| {
        c.bad_words == dst.len() as u64 && c.first_bad == dst.first().copied()
    };
    let list = |w: &[u64]| w.iter().map(u64::to_string).collect::<Vec<_>>().join(", ");
    let verdict = if exact(&v.kernel_write) && exact(&v.ce_copy) {
        "self-test passed"
    } else {
        "SELF-TEST FAILED"
    };
    let src = if i.src_words.is_empty() {
        String::new()
    } else {
        format!(
            ", source word(s) {} (not P2P failures: the check reads the destination)",
            list(&i.src_words)
        )
    };
    format!(
        "--inject corrupted destination word(s) [{}]{src}: {verdict}",
        list(&dst)
    )
}

/// Whether the CPU reports a hypervisor (the `hypervisor` CPUID flag in /proc/cpuinfo).
pub fn in_virtual_machine() -> bool {
    std::fs::read_to_string("/proc/cpuinfo")
        .map(|s| {
            s.lines()
                .filter(|l| l.starts_with("flags"))
                .any(|l| l.split_whitespace().any(|f| f == "hypervisor"))
        })
        .unwrap_or(false)
}
