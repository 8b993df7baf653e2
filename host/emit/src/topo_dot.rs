//! `topo --format dot`: Graphviz of the PCIe tree above the GPUs and NICs, one cluster per
//! NUMA node. P2P beside the tree: a dashed edge per GPU pair on a shared switch (PIX/PXB)
//! labelled with its path; NVLink as one edge per pair with its label, or, where every pair
//! of a set of GPUs has the same NVLink (an NVSwitch board), one node for that fabric with
//! an edge from each GPU (28 labelled edges among 8 GPUs drew an unreadable band).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use pci_config::PathKind;
use vfio_p2p_model::{Device, DeviceKind, Topology};

use super::topo_report::{acs_text, link_text, role_name, GpuTree, HostTopoReport};

/// Graphviz of the GPU and NIC tree with the P2P edges between GPUs.
pub fn render_dot(topo: &Topology, report: &HostTopoReport) -> String {
    let tree = GpuTree::with_nics(topo, true);
    let mut out = String::from(
        "digraph pcie {\n  rankdir=TB;\n  node [shape=box, fontname=\"monospace\", fontsize=10];\n",
    );
    let mut by_numa: BTreeMap<Option<u32>, Vec<&vfio_p2p_model::HostBridge>> = BTreeMap::new();
    for hb in tree.host_bridges() {
        by_numa.entry(hb.numa_node).or_default().push(hb);
    }
    for (numa, hbs) in &by_numa {
        let indent = if numa.is_some() { "    " } else { "  " };
        if let Some(n) = numa {
            let _ = writeln!(out, "  subgraph \"cluster_numa{n}\" {{\n    label=\"NUMA node {n}\";\n    style=rounded;");
        }
        for hb in hbs {
            render_host_bridge(&mut out, &tree, hb, indent);
        }
        if numa.is_some() {
            out.push_str("  }\n");
        }
    }
    // the P2P edges come from the matrix, which a huge host leaves out
    if report.matrix.len() == report.gpus.len() {
        render_p2p(&mut out, topo, report);
    }
    out.push_str("}\n");
    out
}

fn render_host_bridge(
    out: &mut String,
    tree: &GpuTree<'_>,
    hb: &vfio_p2p_model::HostBridge,
    indent: &str,
) {
    let _ = writeln!(
        out,
        "{indent}{} [label=\"{}\\nhost bridge\", shape=house];",
        quote(&hb.id.to_string()),
        hb.id
    );
    let mut stack = vec![None];
    while let Some(parent) = stack.pop() {
        for d in tree.children(hb.id, parent) {
            let style = if tree.gpu_index.contains_key(&d.bdf) {
                ", style=filled, fillcolor=\"#c8e6c9\""
            } else if d.kind == DeviceKind::Nic {
                ", style=filled, fillcolor=\"#bbdefb\""
            } else {
                ""
            };
            let id = quote(&d.bdf.to_string());
            let _ = writeln!(out, "{indent}{id} [label=\"{}\"{style}];", label(tree, d));
            let from = parent.map_or(hb.id.to_string(), |p| p.to_string());
            let _ = writeln!(out, "{indent}{} -> {id};", quote(&from));
            stack.push(Some(d.bdf));
        }
    }
}

/// The P2P edges: NVLink sets whose every pair has one label as a fabric node, the other
/// NVLink pairs and the PCIe switch pairs as labelled dashed edges. `xlabel`: a label
/// placed after layout, which the spline router need not make room for (with `label`,
/// edges between NUMA clusters made Graphviz warn).
fn render_p2p(out: &mut String, topo: &Topology, report: &HostTopoReport) {
    let mut nvlink: BTreeMap<&str, Vec<(usize, usize)>> = BTreeMap::new();
    let mut pcie = Vec::new();
    for (i, a) in report.gpus.iter().enumerate() {
        for (j, b) in report.gpus.iter().enumerate().skip(i + 1) {
            let path = topo.path(&a.bdf, &b.bdf);
            if path.nvlink.is_some() {
                nvlink.entry(&report.matrix[i][j]).or_default().push((i, j));
            } else if path.kind <= PathKind::Pxb {
                pcie.push((i, j));
            }
        }
    }
    let bdf = |i: usize| quote(&report.gpus[i].bdf.to_string());
    for (n, (label, pairs)) in nvlink.iter().enumerate() {
        let gpus: BTreeSet<usize> = pairs.iter().flat_map(|&(i, j)| [i, j]).collect();
        let complete = gpus.len() >= 3 && pairs.len() == gpus.len() * (gpus.len() - 1) / 2;
        if complete {
            let names: Vec<String> = gpus.iter().map(|i| format!("GPU{i}")).collect();
            let _ = writeln!(
                out,
                "  \"nvlink{n}\" [label=\"NVLink {label}\\nbetween every pair of\\n{}\", shape=ellipse, style=filled, fillcolor=\"#fff9c4\"];",
                names.join(" ")
            );
            for &g in &gpus {
                let _ = writeln!(
                    out,
                    "  {} -> \"nvlink{n}\" [dir=none, color=darkgreen, penwidth=2, constraint=false];",
                    bdf(g)
                );
            }
            continue;
        }
        for &(i, j) in pairs {
            let _ = writeln!(
                out,
                "  {} -> {} [dir=none, color=darkgreen, penwidth=2, constraint=false, xlabel=\"{label}\"];",
                bdf(i),
                bdf(j)
            );
        }
    }
    for (i, j) in pcie {
        let _ = writeln!(
            out,
            "  {} -> {} [dir=none, style=dashed, color=blue, constraint=false, xlabel=\"{}\"];",
            bdf(i),
            bdf(j),
            report.matrix[i][j]
        );
    }
}

fn label(tree: &GpuTree<'_>, d: &Device) -> String {
    let mut lines = vec![];
    let driver = d.driver.as_deref().unwrap_or("no driver");
    let group = d
        .iommu_group
        .map_or("no IOMMU group".into(), |g| format!("IOMMU group {g}"));
    if let Some(i) = tree.gpu_index.get(&d.bdf) {
        lines.push(format!("GPU{i} {}", d.bdf));
        lines.push(format!("{:04x}:{:04x} {driver}", d.vendor, d.device));
        lines.push(group);
    } else if d.kind == DeviceKind::Nic {
        lines.push(format!("NIC {}", d.bdf));
        lines.push(format!("{:04x}:{:04x} {driver}", d.vendor, d.device));
        lines.push(group);
    } else {
        lines.push(d.bdf.to_string());
        lines.push(role_name(d).to_string());
        lines.push(acs_text(d));
    }
    if let Some(l) = link_text(&d.link) {
        lines.push(l);
    }
    lines
        .iter()
        .map(|l| l.replace('\\', "\\\\").replace('"', "\\\""))
        .collect::<Vec<_>>()
        .join("\\n")
}

fn quote(id: &str) -> String {
    format!("\"{}\"", id.replace('\\', "\\\\").replace('"', "\\\""))
}
