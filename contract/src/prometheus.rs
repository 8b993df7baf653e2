//! Prometheus text exposition (format 0.0.4) of gauges, shared by the agent's report and
//! the host's stored verdicts so both name the same things alike (`vfio_p2p_…`, base units:
//! seconds, bytes per second). Suitable for node_exporter's textfile collector.

use std::fmt::Write;

/// Gauges grouped by metric name, in the order first added.
#[derive(Debug, Default)]
pub struct Exposition {
    families: Vec<Family>,
}

#[derive(Debug)]
struct Family {
    name: &'static str,
    help: &'static str,
    samples: Vec<(String, f64)>,
}

/// A label value escaped as the format asks (`\\`, `\"`, `\n`).
fn escape(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

impl Exposition {
    /// Adds one sample of gauge `name` (`help` is used the first time the name is seen).
    pub fn gauge(
        &mut self,
        name: &'static str,
        help: &'static str,
        labels: &[(&str, &str)],
        value: f64,
    ) {
        let labels = labels
            .iter()
            .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
            .collect::<Vec<_>>()
            .join(",");
        let i = match self.families.iter().position(|f| f.name == name) {
            Some(i) => i,
            None => {
                self.families.push(Family {
                    name,
                    help,
                    samples: Vec::new(),
                });
                self.families.len() - 1
            }
        };
        self.families[i].samples.push((labels, value));
    }

    /// The text, one `# HELP`/`# TYPE` block per metric.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for f in &self.families {
            let _ = writeln!(out, "# HELP {} {}", f.name, f.help);
            let _ = writeln!(out, "# TYPE {} gauge", f.name);
            for (labels, v) in &f.samples {
                if labels.is_empty() {
                    let _ = writeln!(out, "{} {v}", f.name);
                } else {
                    let _ = writeln!(out, "{}{{{labels}}} {v}", f.name);
                }
            }
        }
        out
    }
}

/// Adds the metrics of one measured ordered pair; `extra` labels come first (e.g. domain).
#[allow(clippy::too_many_arguments)]
pub fn pair_metrics(
    x: &mut Exposition,
    extra: &[(&str, &str)],
    src: &str,
    dst: &str,
    link: &str,
    p2p_ok: Option<bool>,
    bandwidth_gbps: Option<f64>,
    latency_us: Option<f64>,
) {
    let mut labels: Vec<(&str, &str)> = extra.to_vec();
    labels.extend([("src", src), ("dst", dst), ("link", link)]);
    if let Some(ok) = p2p_ok {
        x.gauge(
            "vfio_p2p_pair_p2p_ok",
            "1 when peer access is enabled and every written word arrived, else 0",
            &labels,
            f64::from(u8::from(ok)),
        );
    }
    if let Some(b) = bandwidth_gbps {
        x.gauge(
            "vfio_p2p_pair_bandwidth_bytes_per_second",
            "Copy-engine bandwidth src to dst (median)",
            &labels,
            b * 1e9,
        );
    }
    if let Some(l) = latency_us {
        x.gauge(
            "vfio_p2p_pair_latency_seconds",
            "One-way latency src to dst (median)",
            &labels,
            l * 1e-6,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_help_type_and_escaped_labels() {
        let mut x = Exposition::default();
        x.gauge("m", "a metric", &[("d", "a\"b\\c\nd")], 1.0);
        x.gauge("m", "ignored", &[], 0.5);
        assert_eq!(
            x.render(),
            "# HELP m a metric\n# TYPE m gauge\nm{d=\"a\\\"b\\\\c\\nd\"} 1\nm 0.5\n"
        );
    }
}
