//! `--send`: the agent's findings as a [`GuestReport`], sent to the host over virtio-vsock
//! (the host's CID is always 2; the port comes from the host's expectation, so the guest
//! needs no configuration), and as Prometheus text (`--format prometheus`).

use std::io::{self, Write};
use std::time::Duration;

use vfio_p2p_contract::prometheus::{pair_metrics, Exposition};
use vfio_p2p_contract::{
    GuestReport, ReportChannel, ReportedFabric, ReportedGpu, ReportedPair, GUEST_REPORT_VERSION,
    HOST_CID, MAX_FABRIC_PROBLEMS, MAX_PROBLEM_TEXT,
};

use vfio_p2p_vsock::VsockStream;

use crate::report::Report;
use crate::sysfs::gpus::Scan;

/// Where Linux keeps this boot's id.
pub const BOOT_ID_PATH: &str = "/proc/sys/kernel/random/boot_id";

/// How long the agent waits for the host to take the report.
pub const SEND_TIMEOUT: Duration = Duration::from_secs(10);

/// This boot's id, or `unknown` (which the host refuses) when unreadable.
pub fn boot_id() -> String {
    std::fs::read_to_string(BOOT_ID_PATH)
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

fn gpus(scan: &Scan) -> Vec<ReportedGpu> {
    scan.gpus
        .iter()
        .map(|g| ReportedGpu {
            guest_bdf: g.bdf,
            clique: g.clique,
            clique_readable: g.caps_readable,
        })
        .collect()
}

/// The fabric check as sent: `checked: false` where the expectation planned a fabric and
/// NVML was not there to check it.
pub fn fabric_result(
    fabric: Option<&crate::fabric::FabricReport>,
    unchecked: Option<&String>,
) -> Option<ReportedFabric> {
    match (fabric, unchecked) {
        (Some(f), _) => Some(ReportedFabric {
            checked: true,
            problems: f
                .problems
                .iter()
                .take(MAX_FABRIC_PROBLEMS)
                .map(|p| cut(p, MAX_PROBLEM_TEXT))
                .collect(),
        }),
        (None, Some(why)) => Some(ReportedFabric {
            checked: false,
            problems: vec![cut(why, MAX_PROBLEM_TEXT)],
        }),
        (None, None) => None,
    }
}

/// `s` cut to at most `max` bytes at a character boundary.
fn cut(s: &str, max: usize) -> String {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

/// A sysfs-only report (`expect --send`): GPUs and cliques, nothing measured; the fabric
/// check when the expectation planned one.
pub fn from_scan(
    scan: &Scan,
    vm: &str,
    agent_exit: u8,
    fabric: Option<ReportedFabric>,
) -> GuestReport {
    GuestReport {
        fabric,
        ..from_scan_gpus(gpus(scan), vm, agent_exit)
    }
}

fn from_scan_gpus(gpus: Vec<ReportedGpu>, vm: &str, agent_exit: u8) -> GuestReport {
    GuestReport {
        version: GUEST_REPORT_VERSION,
        vm: vm.into(),
        boot_id: boot_id(),
        agent_version: env!("CARGO_PKG_VERSION").into(),
        measured: false,
        agent_exit,
        gpus,
        pairs: Vec::new(),
        fabric: None,
    }
}

/// A full report (`report --send`): every measured ordered pair.
pub fn from_report(r: &Report, vm: &str, agent_exit: u8) -> GuestReport {
    let mut out = GuestReport {
        measured: true,
        gpus: r.scan.as_ref().map(gpus).unwrap_or_default(),
        fabric: fabric_result(r.fabric.as_ref(), None),
        ..from_scan_gpus(Vec::new(), vm, agent_exit)
    };
    out.pairs = r
        .pairs
        .iter()
        .map(|p| ReportedPair {
            src: p.src,
            dst: p.dst,
            peer_access: p.peer.enabled,
            writes_ok: p.verify.as_ref().map(|v| v.ok()),
            nvlinks: p.peer.link.as_ref().map(|l| l.nvlinks),
            bandwidth_gbps: p.bench.as_ref().map(|b| b.ce_bandwidth_gbps.median),
            latency_us: p
                .bench
                .as_ref()
                .and_then(|b| b.one_way_latency_us.as_ref())
                .map(|s| s.median),
        })
        .collect();
    out
}

/// Prometheus text of a report (no domain label: node_exporter on the guest adds the instance).
pub fn prometheus(r: &GuestReport) -> String {
    let mut x = Exposition::default();
    x.gauge(
        "vfio_p2p_agent_exit",
        "The agent's exit status: 0 as expected, 1 mismatch, 2 could not run",
        &[],
        f64::from(r.agent_exit),
    );
    for g in &r.gpus {
        if let Some(c) = g.clique {
            x.gauge(
                "vfio_p2p_gpu_clique",
                "The GPUDirect clique the GPU's capability carries",
                &[("gpu", &g.guest_bdf.to_string())],
                f64::from(c),
            );
        }
    }
    for p in &r.pairs {
        let link = match p.nvlinks {
            Some(0) => "pcie",
            Some(_) => "nvlink",
            None => "unknown",
        };
        let p2p_ok = Some(p.peer_access && p.writes_ok != Some(false));
        let (src, dst) = (p.src.to_string(), p.dst.to_string());
        pair_metrics(
            &mut x,
            &[],
            &src,
            &dst,
            link,
            p2p_ok,
            p.bandwidth_gbps,
            p.latency_us,
        );
    }
    x.render()
}

/// Sends `r` to the host's collector (CID 2, the channel's port) and closes the connection.
pub fn send(channel: &ReportChannel, r: &GuestReport) -> io::Result<()> {
    let mut stream = VsockStream::connect(HOST_CID, channel.vsock_port, Some(SEND_TIMEOUT))?;
    stream.write_all(r.to_json().as_bytes())?;
    // tells the host the report is complete
    stream.shutdown_write()
}
