//! The collector's stored verdicts as a table (one line per domain) and as Prometheus text
//! (per domain, and per domain and GPU pair) for node_exporter's textfile collector.

use vfio_p2p_contract::prometheus::{pair_metrics, Exposition};

use vfio_p2p_decide::fleet_verdict::{LinkType, Outcome, Record};

/// One line per domain: verdict, when, boot, GPUs and pairs that are fine, first problem.
pub fn table(records: &[Record]) -> String {
    if records.is_empty() {
        return "no verdicts stored yet\n".into();
    }
    let mut t = vfio_p2p_style::table(vec![
        "domain",
        "verdict",
        "received",
        "boot",
        "GPUs ok",
        "pairs ok",
        "first problem",
    ]);
    for r in records {
        t.add_row(vec![
            r.domain.clone(),
            format!("{:?}", r.verdict).to_uppercase(),
            r.received_at.to_string(),
            r.boot_id.chars().take(8).collect(),
            format!(
                "{}/{}",
                r.gpus.iter().filter(|g| g.ok).count(),
                r.gpus.len()
            ),
            format!(
                "{}/{}",
                r.pairs.iter().filter(|p| p.ok).count(),
                r.pairs.len()
            ),
            r.problems.first().cloned().unwrap_or_default(),
        ]);
    }
    format!("{t}\n")
}

fn link_label(l: LinkType) -> &'static str {
    match l {
        LinkType::Nvlink => "nvlink",
        LinkType::Pcie => "pcie",
    }
}

/// Prometheus text of every record.
pub fn prometheus(records: &[Record]) -> String {
    let mut x = Exposition::default();
    for r in records {
        let d = [("domain", r.domain.as_str())];
        x.gauge(
            "vfio_p2p_verdict_pass",
            "1 when the guest's latest report matched the host's plan, else 0",
            &d,
            f64::from(u8::from(r.verdict == Outcome::Pass)),
        );
        x.gauge(
            "vfio_p2p_verdict_timestamp_seconds",
            "When the latest report arrived (Unix time)",
            &d,
            r.received_at as f64,
        );
        x.gauge(
            "vfio_p2p_verdict_problems",
            "Problems found in the latest report",
            &d,
            r.problems.len() as f64,
        );
        for p in &r.pairs {
            let (src, dst) = (p.src.to_string(), p.dst.to_string());
            let link = link_label(p.link);
            pair_metrics(
                &mut x,
                &d,
                &src,
                &dst,
                link,
                p.p2p_ok,
                p.bandwidth_gbps,
                p.latency_us,
            );
            if p.p2p_ok.is_none() {
                continue; // not measured (expect --send): nothing to say per pair
            }
            x.gauge(
                "vfio_p2p_pair_verdict_pass",
                "1 when the pair is as planned (P2P, writes, bandwidth floor), else 0",
                &[
                    ("domain", &r.domain),
                    ("src", &src),
                    ("dst", &dst),
                    ("link", link),
                ],
                f64::from(u8::from(p.ok)),
            );
        }
    }
    x.render()
}
