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
        let tone = match r.verdict {
            Outcome::Pass => vfio_p2p_style::Tone::Plain,
            Outcome::Fail => vfio_p2p_style::Tone::Fail,
        };
        let row = vec![
            r.domain.clone(),
            format!("{:?}", r.verdict).to_uppercase(),
            utc_time(r.received_at),
            r.boot_id.chars().take(8).collect(),
            format!(
                "{}/{}",
                r.gpus.iter().filter(|g| g.ok).count(),
                r.gpus.len()
            ),
            pairs_ok(r),
            r.problems.first().cloned().unwrap_or_default(),
        ];
        t.add_row(vfio_p2p_style::toned_row(row, tone));
    }
    format!("{t}\n")
}

/// The pairs as planned out of those measured; pairs the report did not measure (a
/// sysfs-only report) are counted as such, never as fine.
fn pairs_ok(r: &Record) -> String {
    let measured: Vec<bool> = r.pairs.iter().filter_map(|p| p.ok).collect();
    let unmeasured = r.pairs.len() - measured.len();
    let ok = measured.iter().filter(|ok| **ok).count();
    match (measured.len(), unmeasured) {
        (_, 0) => format!("{ok}/{}", measured.len()),
        (0, _) => "not measured".into(),
        (n, u) => format!("{ok}/{n}, {u} not measured"),
    }
}

/// Seconds since the Unix epoch as a UTC date and time, `2023-11-14 22:13:20Z`
/// (days to a civil date: H. Hinnant's days_from_civil inverse, proleptic Gregorian).
pub fn utc_time(secs: u64) -> String {
    let (days, rest) = (secs / 86_400, secs % 86_400);
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}Z",
        rest / 3_600,
        rest / 60 % 60,
        rest % 60
    )
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
            let (Some(_), Some(ok)) = (p.p2p_ok, p.ok) else {
                continue; // not measured (expect --send): nothing to say per pair
            };
            x.gauge(
                "vfio_p2p_pair_verdict_pass",
                "1 when the pair is as planned (P2P, writes, bandwidth floor), else 0",
                &[
                    ("domain", &r.domain),
                    ("src", &src),
                    ("dst", &dst),
                    ("link", link),
                ],
                f64::from(u8::from(ok)),
            );
        }
    }
    x.render()
}

#[cfg(test)]
mod tests {
    use super::utc_time;

    #[test]
    fn unix_times_print_as_utc_dates() {
        assert_eq!(utc_time(0), "1970-01-01 00:00:00Z");
        assert_eq!(utc_time(1_700_000_000), "2023-11-14 22:13:20Z");
        // a leap day, and the last second of a century leap year
        assert_eq!(utc_time(951_782_400), "2000-02-29 00:00:00Z");
        assert_eq!(utc_time(978_307_199), "2000-12-31 23:59:59Z");
    }
}
