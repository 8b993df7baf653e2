//! Human-readable rendering of a clique [`CliquePlan`]: a summary that fits a screen by
//! default, every pair with the ACS control on its path with `--details`.

use vfio_p2p_decide::clique_plan::pair_route::{AcsState, Pair, PairRoute};
use vfio_p2p_decide::clique_plan::CliquePlan;

/// Cliques, per-GPU assignments, the pairs, then what each verdict means and the warnings.
/// Without `details`, pairs that cross host bridges or sockets (no clique by default) are
/// counted, not listed, and the ACS path is left out.
pub fn table(p: &CliquePlan, details: bool) -> String {
    let mut gpus = vfio_p2p_style::table(vec!["GPU", "clique"]);
    for (g, c) in &p.assignments {
        gpus.add_row(vec![
            g.to_string(),
            c.map_or("none".to_string(), |c| c.to_string()),
        ]);
    }
    let mut out = format!(
        "{} clique(s) at --p2p-level {}\n{gpus}\n",
        p.cliques.len(),
        p.p2p_level.label().to_lowercase()
    );
    if !p.pairs.is_empty() || p.pairs_left_out > 0 {
        out += &pairs_table(p, details);
    }
    let width = vfio_p2p_style::output_width();
    for w in &p.warnings {
        out += &vfio_p2p_style::wrap(&format!("warning: {w}"), width);
    }
    out
}

/// The most pairs a summary lists: a 1,000-GPU VM has half a million (33 MB of table that
/// took most of `plan`'s time and memory).
const SUMMARY_PAIRS: usize = 1000;

/// The most pairs a summary lists in full (every pair of six GPUs): beyond that, pairs
/// far apart without a clique are only counted, so that the summary fits a screen.
const SCREEN_PAIRS: usize = 15;

/// Pairs the summary leaves out: no clique, far apart, nothing to fix.
fn far_apart(pr: &Pair) -> bool {
    pr.clique.is_none()
        && matches!(
            pr.verdict,
            PairRoute::CrossSocket | PairRoute::CrossHostBridge
        )
}

fn pairs_table(p: &CliquePlan, details: bool) -> String {
    let mut header = vec!["GPU a", "GPU b", "path", "clique", "verdict"];
    if details {
        header.push("ACS control on path");
    }
    let mut pairs = vfio_p2p_style::table(header);
    let mut listed: Vec<&Pair> = p
        .pairs
        .iter()
        .filter(|pr| details || p.pairs.len() <= SCREEN_PAIRS || !far_apart(pr))
        .collect();
    let near = listed.len();
    if !details && near > SUMMARY_PAIRS {
        // Those sharing a clique first, in their order, then the others.
        listed.sort_by_key(|pr| pr.clique.is_none());
        listed.truncate(SUMMARY_PAIRS);
    }
    for pr in &listed {
        let mut row = vec![
            pr.a.to_string(),
            pr.b.to_string(),
            match pr.nvlink {
                Some(n) => format!("NV{n} ({})", pr.path),
                None => pr.path.to_string(),
            },
            pr.clique.map_or("-".to_string(), |c| c.to_string()),
            pr.verdict.to_string(),
        ];
        if details {
            row.push(acs_path(pr));
        }
        pairs.add_row(row);
    }
    let mut out = if listed.is_empty() {
        String::new()
    } else {
        format!("{pairs}\n")
    };
    let width = vfio_p2p_style::output_width();
    let hidden = p.pairs.len() - near;
    if near > listed.len() {
        out += &vfio_p2p_style::wrap(&format!(
            "{} more pair(s) not listed: a summary lists at most {SUMMARY_PAIRS} (those sharing a clique first); --details or --format json lists every pair",
            near - listed.len()
        ), width);
    }
    if p.pairs_left_out > 0 {
        out += &vfio_p2p_style::wrap(&format!(
            "{} pair(s) across switch trees without NVLink not listed: a plan of more than {} GPUs lists only the pairs inside a switch tree and the NVLink pairs",
            p.pairs_left_out,
            vfio_p2p_decide::clique_plan::PAIR_LIST_MAX_GPUS
        ), width);
    }
    if hidden > 0 {
        out += &vfio_p2p_style::wrap(&format!(
            "{hidden} pair(s) across host bridges or sockets, with no clique, not listed; --details lists every pair with the ACS control on its path"
        ), width);
    }
    let mut seen = Vec::new();
    for pr in &listed {
        if !seen.contains(&pr.verdict) {
            seen.push(pr.verdict);
            out += &vfio_p2p_style::wrap(&format!("{}: {}", pr.verdict, pr.explanation), width);
        }
    }
    out
}

/// The bridges on the pair's path with their ACS control bits, one per line; the same
/// words as `topo` (`no ACS`).
fn acs_path(pr: &Pair) -> String {
    pr.acs
        .iter()
        .map(|b| match (b.control, b.state) {
            (Some(c), _) => format!("{} {}", b.bridge, c.names().join(" ")),
            (None, AcsState::Absent) => format!("{} no ACS", b.bridge),
            (None, AcsState::Unknown) => format!("{} ACS unknown", b.bridge),
            (None, AcsState::Present) => format!("{} ACS", b.bridge),
        })
        .collect::<Vec<_>>()
        .join("\n")
}
