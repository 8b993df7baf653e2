//! Verdicts against the link (issue 42): for each pair, what its link should carry, from
//! published link rates, and each measured figure judged against it (pass, or slow with
//! the ratio), with the thresholds stated.
//!
//! Rates, per direction:
//! - NVLink: 25 GB/s per link for NVLink 2, 3 and 4 (V100 300 GB/s over 6 links, A100 600
//!   GB/s over 12, H100/H200 900 GB/s over 18, NVIDIA's product pages, both directions
//!   counted), 50 GB/s per link for NVLink 5 (Blackwell, 1.8 TB/s over 18). The link count
//!   is the guest's view through NVML ([`vfio_p2p_nvml::Link`]), the generation the GPU's
//!   part ([`vfio_p2p_contract::nvidia_parts`]).
//! - PCIe: the slower end's width × the per-lane rate after line coding: 2.5 GT/s 0.25
//!   GB/s (8b/10b), 5 GT/s 0.5, 8 GT/s 0.985 and 16 GT/s 1.969 (128b/130b), 32 GT/s 3.938,
//!   64 GT/s 7.563 (FLIT mode); PCI-SIG's specification figures, read from sysfs
//!   (`current_link_speed`, `current_link_width`).
//!
//! Bidirectional is twice the one-way rate. One-way latency has no published rate: the
//! ceiling is the reference probe's NVLink figure (0.61 µs, 2 × H200 NV18) and the
//! published PCIe P2P latency in VMs with the clique (1.0–1.4 µs), each with room for the
//! spread over flag placements (±15 %): 1.0 µs over NVLink, 2.0 µs over PCIe. The verdict
//! takes the median over placements (stable within 3 % between processes; the min and
//! max belong to particular placements).

use serde::{Deserialize, Serialize};

use crate::bench::PairBench;

/// Share of the link rate a copy-engine copy (one way or both ways) must reach: H200
/// NV18 reached 0.88 one way and 0.86 both ways; PCIe Gen4/Gen5 x16 copies reach 0.79–0.87
/// (REFERENCE §5: 25–27 GB/s of 31.5, 50–55 of 63).
pub const NVLINK_CE_PASS: f64 = 0.80;
pub const PCIE_PASS: f64 = 0.70;
/// SM stores through the peer mapping carry more protocol per byte: H200 NV18 reached 0.82.
pub const NVLINK_SM_PASS: f64 = 0.75;
/// NCCL all-reduce bus bandwidth against the one-way link rate: 2 × H200 NV18 reached
/// 0.67 (299.5 of 450 GB/s, 256 MiB, NVLink SHARP off).
pub const NCCL_BUSBW_PASS: f64 = 0.50;
/// One-way latency ceilings (µs): see the module's text.
pub const NVLINK_ONE_WAY_US: f64 = 1.0;
pub const PCIE_ONE_WAY_US: f64 = 2.0;
/// A P2P copy no faster than this times the copy staged through the host (peer access
/// disabled) is host-staged: the path is not P2P, whatever the driver says.
pub const HOST_STAGED_WITHIN: f64 = 1.25;

/// The link of a pair and what it should carry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LinkExpectation {
    /// In words: "18 × NVLink 4 (25 GB/s per link and direction)", "PCIe 32.0 GT/s x16".
    pub link: String,
    pub nvlink: bool,
    /// GB/s (10^9 bytes) one way and both ways.
    pub uni_gbps: f64,
    pub bidir_gbps: f64,
    /// Ceiling of the one-way latency (µs).
    pub one_way_latency_us: f64,
}

/// One figure against its expectation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FigureVerdict {
    /// The `PairBench` field.
    pub figure: String,
    pub measured: f64,
    pub expected: f64,
    /// Bandwidths: measured / expected; latency: expected ceiling / measured (above 1 is
    /// better for both).
    pub ratio: f64,
    /// The ratio a pass needs.
    pub threshold: f64,
    pub pass: bool,
}

/// A pair's figures against its link.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LinkVerdict {
    pub expectation: LinkExpectation,
    pub figures: Vec<FigureVerdict>,
    /// The P2P copy runs at the speed of the copy staged through the host.
    pub host_staged: bool,
    pub ok: bool,
    /// One line: "link 18 × NVLink 4: all pass" or what failed, with ratios and thresholds.
    pub line: String,
}

/// GB/s per lane and direction at `gts` GT/s, after line coding.
pub fn pcie_lane_gbps(gts: f64) -> Option<f64> {
    let rate = [
        (2.5, 0.25),
        (5.0, 0.5),
        (8.0, 0.985),
        (16.0, 1.969),
        (32.0, 3.938),
        (64.0, 7.563),
    ];
    rate.iter()
        .find(|(g, _)| (g - gts).abs() < 0.01)
        .map(|&(_, r)| r)
}

/// GB/s per NVLink and direction of the GPU with PCI device ID `device`, and its NVLink
/// generation: 5 for Blackwell parts (names starting with B or GB), else 4 or earlier at 25.
pub fn nvlink_rate(device: u16) -> Option<(u8, f64)> {
    let part = vfio_p2p_contract::nvidia_parts::gpu_part(device)?;
    Some(
        if part.name.starts_with('B') || part.name.starts_with("GB") {
            (5, 50.0)
        } else if part.name.starts_with('V') {
            (2, 25.0)
        } else if part.name.starts_with('A') {
            (3, 25.0)
        } else {
            (4, 25.0)
        },
    )
}

/// The expectation of an NVLink path of `links` links between GPUs of device ID `device`.
pub fn nvlink_expectation(links: u32, device: u16) -> Option<LinkExpectation> {
    let (gen, per_link) = nvlink_rate(device)?;
    let uni = f64::from(links) * per_link;
    Some(LinkExpectation {
        link: format!("{links} × NVLink {gen} ({per_link:.0} GB/s per link and direction)"),
        nvlink: true,
        uni_gbps: uni,
        bidir_gbps: 2.0 * uni,
        one_way_latency_us: NVLINK_ONE_WAY_US,
    })
}

/// The expectation of a PCIe path whose slower end runs `gts` GT/s × `width` lanes.
pub fn pcie_expectation(gts: f64, width: u32) -> Option<LinkExpectation> {
    let uni = pcie_lane_gbps(gts)? * f64::from(width);
    Some(LinkExpectation {
        link: format!("PCIe {gts:.1} GT/s x{width}"),
        nvlink: false,
        uni_gbps: uni,
        bidir_gbps: 2.0 * uni,
        one_way_latency_us: PCIE_ONE_WAY_US,
    })
}

/// `"32.0 GT/s PCIe"` → 32.0.
pub fn parse_gts(speed: &str) -> Option<f64> {
    speed.split_whitespace().next()?.parse().ok()
}

fn bandwidth(figure: &str, measured: f64, expected: f64, threshold: f64) -> FigureVerdict {
    let ratio = if expected > 0.0 {
        measured / expected
    } else {
        0.0
    };
    FigureVerdict {
        figure: figure.into(),
        measured,
        expected,
        ratio,
        threshold,
        pass: ratio >= threshold,
    }
}

/// Judges `b`'s figures against `e`.
pub fn judge(b: &PairBench, e: &LinkExpectation) -> LinkVerdict {
    let (ce_pass, sm_pass) = if e.nvlink {
        (NVLINK_CE_PASS, NVLINK_SM_PASS)
    } else {
        (PCIE_PASS, PCIE_PASS)
    };
    let mut figures = vec![
        bandwidth(
            "ce_bandwidth_gbps",
            b.ce_bandwidth_gbps.median,
            e.uni_gbps,
            ce_pass,
        ),
        bandwidth(
            "ce_bidir_bandwidth_gbps",
            b.ce_bidir_bandwidth_gbps.median,
            e.bidir_gbps,
            ce_pass,
        ),
        bandwidth(
            "sm_copy_bandwidth_gbps",
            b.sm_copy_bandwidth_gbps.median,
            e.uni_gbps,
            sm_pass,
        ),
    ];
    if let Some(l) = &b.one_way_latency_us {
        let ratio = if l.median > 0.0 {
            e.one_way_latency_us / l.median
        } else {
            0.0
        };
        figures.push(FigureVerdict {
            figure: "one_way_latency_us".into(),
            measured: l.median,
            expected: e.one_way_latency_us,
            ratio,
            threshold: 1.0,
            pass: ratio >= 1.0,
        });
    }
    let staged = b.disabled_bandwidth_gbps.median;
    let host_staged = staged > 0.0 && b.ce_bandwidth_gbps.median <= HOST_STAGED_WITHIN * staged;
    let slow: Vec<String> = figures
        .iter()
        .filter(|f| !f.pass)
        .map(|f| {
            format!(
                "SLOW {} {:.2} against {:.2} ({:.2}×, needs {:.2}×)",
                f.figure, f.measured, f.expected, f.ratio, f.threshold
            )
        })
        .collect();
    let ok = slow.is_empty() && !host_staged;
    let line = if host_staged {
        format!(
            "HOST-STAGED: P2P copies at {:.1} GB/s, no faster than copies staged through the \
             host ({staged:.1} GB/s with peer access disabled), where {} carries {:.0} GB/s",
            b.ce_bandwidth_gbps.median, e.link, e.uni_gbps
        )
    } else if ok {
        let worst = figures
            .iter()
            .min_by(|a, b| (a.ratio / a.threshold).total_cmp(&(b.ratio / b.threshold)))
            .map(|f| {
                format!(
                    "; closest: {} {:.2}× (needs {:.2}×)",
                    f.figure, f.ratio, f.threshold
                )
            })
            .unwrap_or_default();
        format!("link {}: every figure passes{worst}", e.link)
    } else {
        format!("link {}: {}", e.link, slow.join("; "))
    };
    LinkVerdict {
        expectation: e.clone(),
        figures,
        host_staged,
        ok,
        line,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::Stat;

    fn stat(x: f64) -> Stat {
        Stat::of(vec![x]).unwrap()
    }

    /// 0000:00:06.0 → 0000:00:07.0 of the recorded 2 × H200 run (issue 42, medians).
    fn h200() -> PairBench {
        let text =
            include_str!("../../tests/fixtures/agent/reference-comparison/h200x2/report-1.json");
        let r: crate::report::Report = serde_json::from_str(text).unwrap();
        r.pairs[0].bench.clone().unwrap()
    }

    #[test]
    fn published_rates() {
        let e = nvlink_expectation(18, 0x2335).unwrap();
        assert_eq!((e.uni_gbps, e.bidir_gbps), (450.0, 900.0));
        assert!(e.link.starts_with("18 × NVLink 4"), "{}", e.link);
        assert_eq!(nvlink_expectation(18, 0x2901).unwrap().uni_gbps, 900.0);
        assert_eq!(nvlink_expectation(12, 0x20b2).unwrap().uni_gbps, 300.0);
        assert!(nvlink_expectation(18, 0x1234).is_none());
        let p = pcie_expectation(32.0, 16).unwrap();
        assert!((p.uni_gbps - 63.008).abs() < 1e-9);
        assert!((pcie_expectation(16.0, 16).unwrap().uni_gbps - 31.504).abs() < 1e-9);
        assert!(pcie_expectation(3.0, 16).is_none());
        assert_eq!(parse_gts("32.0 GT/s PCIe"), Some(32.0));
    }

    #[test]
    fn the_recorded_h200_pair_passes_every_figure_against_nv18() {
        let v = judge(&h200(), &nvlink_expectation(18, 0x2335).unwrap());
        assert!(v.ok, "{}", v.line);
        assert_eq!(v.figures.len(), 4);
        assert!(v.line.contains("every figure passes"), "{}", v.line);
    }

    /// Flips: each threshold crossed turns the verdict red, naming the figure and ratio.
    #[test]
    fn a_slow_figure_or_a_host_staged_copy_fails_naming_it() {
        let e = nvlink_expectation(18, 0x2335).unwrap();
        let mut b = h200();
        b.sm_copy_bandwidth_gbps = stat(300.0);
        let v = judge(&b, &e);
        assert!(!v.ok && !v.host_staged);
        assert!(
            v.line
                .contains("SLOW sm_copy_bandwidth_gbps 300.00 against 450.00 (0.67×, needs 0.75×)"),
            "{}",
            v.line
        );
        let mut b = h200();
        b.one_way_latency_us = Some(stat(1.25));
        let v = judge(&b, &e);
        assert!(
            v.line
                .contains("SLOW one_way_latency_us 1.25 against 1.00 (0.80×"),
            "{}",
            v.line
        );
        // Copies at the speed of the host-staged path: named as such.
        let mut b = h200();
        b.ce_bandwidth_gbps = stat(38.0);
        let v = judge(&b, &e);
        assert!(!v.ok && v.host_staged);
        assert!(
            v.line.starts_with("HOST-STAGED: P2P copies at 38.0 GB/s"),
            "{}",
            v.line
        );
        // Just above the staged speed × 1.25: slow, not host-staged.
        b.ce_bandwidth_gbps = stat(b.disabled_bandwidth_gbps.median * 1.3);
        assert!(!judge(&b, &e).host_staged);
        // 18 links expected but only 9 carry: the bandwidths fail against the link.
        let v = judge(&h200(), &nvlink_expectation(36, 0x2335).unwrap());
        assert!(
            !v.ok && v.line.contains("SLOW ce_bandwidth_gbps"),
            "{}",
            v.line
        );
    }

    #[test]
    fn pcie_thresholds_are_pcies() {
        let e = pcie_expectation(16.0, 16).unwrap();
        let mut b = h200();
        b.ce_bandwidth_gbps = stat(25.0);
        b.ce_bidir_bandwidth_gbps = stat(45.0);
        b.sm_copy_bandwidth_gbps = stat(23.0);
        b.one_way_latency_us = Some(stat(1.4));
        b.disabled_bandwidth_gbps = stat(12.0);
        let v = judge(&b, &e);
        assert!(v.ok, "{}", v.line);
        b.ce_bandwidth_gbps = stat(20.0);
        assert!(!judge(&b, &e).ok);
    }
}
