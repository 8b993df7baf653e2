//! Human-readable rendering of a clique [`Plan`].

use comfy_table::{presets::UTF8_BORDERS_ONLY, Table};

use crate::decide::plan::Plan;

/// Cliques, per-GPU assignments, per-pair paths and verdicts, then warnings.
pub fn table(p: &Plan) -> String {
    let mut out = String::new();
    let mut gpus = Table::new();
    gpus.load_preset(UTF8_BORDERS_ONLY)
        .set_header(vec!["GPU", "clique"]);
    for (g, c) in &p.assignments {
        gpus.add_row(vec![
            g.to_string(),
            c.map_or("none".to_string(), |c| c.to_string()),
        ]);
    }
    out += &format!(
        "{} clique(s) at --p2p-level {}\n{gpus}\n",
        p.cliques.len(),
        p.p2p_level.label().to_lowercase()
    );
    if !p.pairs.is_empty() {
        let mut pairs = Table::new();
        pairs.load_preset(UTF8_BORDERS_ONLY).set_header(vec![
            "GPU a",
            "GPU b",
            "path",
            "clique",
            "verdict",
            "ACS control on path",
        ]);
        for pr in &p.pairs {
            let acs = pr
                .acs
                .iter()
                .map(|b| match b.control {
                    Some(c) => format!("{} {}", b.bridge, c.names().join(" ")),
                    None => format!("{} ({})", b.bridge, serde_label(&b.state)),
                })
                .collect::<Vec<_>>()
                .join("\n");
            pairs.add_row(vec![
                pr.a.to_string(),
                pr.b.to_string(),
                match pr.nvlink {
                    Some(n) => format!("NV{n} ({})", pr.path),
                    None => pr.path.to_string(),
                },
                pr.clique.map_or("-".to_string(), |c| c.to_string()),
                pr.verdict.to_string(),
                acs,
            ]);
        }
        out += &format!("{pairs}\n");
        let mut seen = Vec::new();
        for pr in &p.pairs {
            if !seen.contains(&pr.verdict) {
                seen.push(pr.verdict);
                out += &format!("{}: {}\n", pr.verdict, pr.explanation);
            }
        }
    }
    for w in &p.warnings {
        out += &format!("warning: {w}\n");
    }
    out
}

fn serde_label<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_value(v)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}
