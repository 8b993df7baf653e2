//! NCCL topology XML for the guest (`NCCL_TOPO_FILE`).
//!
//! Inside a VM NCCL sees the guest's PCIe tree: GPUs on separate root ports look `PHB`
//! apart, so NCCL skips P2P even where the clique makes the driver allow it. This file
//! tells NCCL the truth: one `<cpu>` per guest NUMA node, the emulated switches of a
//! mirrored layout as nested `<pci>` bridges, and GPUs of one clique that the guest tree
//! does not already join below a switch grouped under a made-up bridge (domain `ffff`,
//! as cloud providers do), so NCCL finds them `PIX`/`PXB` apart and uses P2P.
//! Attributes left out (`<gpu>` details, CPU vendor/model) are filled by NCCL from the
//! guest; `<nvlink>` entries are written only where NVLink is known.

use std::collections::BTreeMap;
use std::fmt::Write;

use pci_config::{Bdf, LinkSpeed};

use super::vm::VmDefinition;
use crate::decide::guest_layout::{GuestBridgeKind, GuestGpu};
use crate::model::Topology;

/// Domain of the made-up bridges: never a real guest PCI domain.
const FAKE_DOMAIN: u16 = 0xffff;
const CLASS_BRIDGE: &str = "0x060400";

#[derive(Debug, Clone)]
enum Node {
    Bridge { busid: Bdf, children: Vec<Node> },
    Gpu(usize),
}

impl Node {
    fn cliques(&self, gpus: &[GuestGpu], out: &mut Vec<u8>) {
        match self {
            Node::Gpu(i) => out.extend(gpus[*i].clique),
            Node::Bridge { children, .. } => {
                for c in children {
                    c.cliques(gpus, out);
                }
            }
        }
    }
}

/// The topology XML.
pub fn topology_xml(vm: &VmDefinition, topo: &Topology) -> String {
    let l = vm.layout;
    // Top-level nodes per guest NUMA node, built from each GPU's guest switches.
    let mut per_node: BTreeMap<u32, Vec<Node>> = BTreeMap::new();
    for (i, g) in l.gpus.iter().enumerate() {
        let switches: Vec<Bdf> = l
            .ancestors(g)
            .into_iter()
            .filter(|b| b.kind == GuestBridgeKind::SwitchUpstream)
            .map(|b| {
                let parent_bus = l.bridge(&b.parent).map_or(0, |p| p.bus);
                Bdf::new(0, parent_bus, b.slot, 0)
            })
            .collect();
        let top = per_node.entry(g.numa_node.unwrap_or(0)).or_default();
        insert(top, &switches, i);
    }
    let mut fake = 0u8;
    let mut x = String::from("<system version=\"1\">\n");
    for (numa, mut top) in per_node {
        top = group_cliques(top, &l.gpus, &mut fake);
        let affinity = l
            .numa_nodes
            .iter()
            .position(|n| n.id == numa)
            .map(|i| format!(" affinity=\"{}\"", cpumask(&vm.numa_share(i).0)))
            .unwrap_or_default();
        let _ = writeln!(x, "  <cpu numaid=\"{numa}\"{affinity}>");
        for n in &top {
            write_node(&mut x, n, vm, topo, 2);
        }
        let _ = writeln!(x, "  </cpu>");
    }
    x.push_str("</system>\n");
    x
}

fn insert(nodes: &mut Vec<Node>, switches: &[Bdf], gpu: usize) {
    let Some((first, rest)) = switches.split_first() else {
        nodes.push(Node::Gpu(gpu));
        return;
    };
    for n in nodes.iter_mut() {
        if let Node::Bridge { busid, children } = n {
            if busid == first {
                insert(children, rest, gpu);
                return;
            }
        }
    }
    let mut children = Vec::new();
    insert(&mut children, rest, gpu);
    nodes.push(Node::Bridge {
        busid: *first,
        children,
    });
}

/// Puts top-level nodes that share a clique under one made-up bridge.
fn group_cliques(top: Vec<Node>, gpus: &[GuestGpu], fake: &mut u8) -> Vec<Node> {
    let mut groups: Vec<(Vec<u8>, Vec<Node>)> = Vec::new();
    for n in top {
        let mut c = Vec::new();
        n.cliques(gpus, &mut c);
        let hits: Vec<usize> = groups
            .iter()
            .enumerate()
            .filter(|(_, (gc, _))| gc.iter().any(|x| c.contains(x)))
            .map(|(i, _)| i)
            .collect();
        let mut merged = (c, vec![n]);
        for i in hits.into_iter().rev() {
            let (gc, gn) = groups.remove(i);
            merged.0.extend(gc);
            let mut nodes = gn;
            nodes.append(&mut merged.1);
            merged.1 = nodes;
        }
        groups.push(merged);
    }
    groups
        .into_iter()
        .map(|(_, mut nodes)| {
            if nodes.len() == 1 {
                nodes.remove(0)
            } else {
                let busid = Bdf::new(FAKE_DOMAIN, 0xff, *fake, 0);
                *fake = fake.wrapping_add(1);
                Node::Bridge {
                    busid,
                    children: nodes,
                }
            }
        })
        .collect()
}

fn first_gpu<'a>(n: &Node, gpus: &'a [GuestGpu]) -> Option<&'a GuestGpu> {
    match n {
        Node::Gpu(i) => gpus.get(*i),
        Node::Bridge { children, .. } => children.iter().find_map(|c| first_gpu(c, gpus)),
    }
}

/// The host link of a GPU as NCCL writes sysfs values: `"32.0 GT/s PCIe"`, `"16"`.
fn link_attrs(gpu: Option<&GuestGpu>, topo: &Topology) -> String {
    let link = gpu.and_then(|g| topo.device(&g.host)).map(|d| d.link);
    let speed = link
        .and_then(|l| l.max_speed.or(l.current_speed))
        .and_then(|s: LinkSpeed| s.gts());
    let width = link.and_then(|l| l.max_width.or(l.current_width));
    let mut s = String::new();
    if let Some(gts) = speed {
        let _ = write!(s, " link_speed=\"{gts:.1} GT/s PCIe\"");
    }
    if let Some(w) = width {
        let _ = write!(s, " link_width=\"{w}\"");
    }
    s
}

fn write_node(x: &mut String, n: &Node, vm: &VmDefinition, topo: &Topology, depth: usize) {
    let pad = "  ".repeat(depth);
    let gpus = &vm.layout.gpus;
    match n {
        Node::Bridge { busid, children } => {
            let _ = writeln!(
                x,
                "{pad}<pci busid=\"{busid}\" class=\"{CLASS_BRIDGE}\"{}>",
                link_attrs(first_gpu(n, gpus), topo)
            );
            for c in children {
                write_node(x, c, vm, topo, depth + 1);
            }
            let _ = writeln!(x, "{pad}</pci>");
        }
        Node::Gpu(i) => {
            let g = &gpus[*i];
            let attrs = format!(
                "busid=\"{}\" class=\"{:#08x}\" vendor=\"{:#06x}\" device=\"{:#06x}\"{}",
                g.guest,
                g.class,
                g.vendor,
                g.device,
                link_attrs(Some(g), topo)
            );
            let links: Vec<(Bdf, u8)> = gpus
                .iter()
                .filter(|p| p.host != g.host)
                .filter_map(|p| topo.nvlink(&g.host, &p.host).map(|n| (p.guest, n)))
                .collect();
            if links.is_empty() {
                let _ = writeln!(x, "{pad}<pci {attrs}/>");
            } else {
                let _ = writeln!(x, "{pad}<pci {attrs}>\n{pad}  <gpu>");
                for (target, count) in links {
                    let _ = writeln!(
                        x,
                        "{pad}    <nvlink target=\"{target}\" count=\"{count}\" tclass=\"{:#08x}\"/>",
                        g.class
                    );
                }
                let _ = writeln!(x, "{pad}  </gpu>\n{pad}</pci>");
            }
        }
    }
}

/// A CPU set as the kernel prints `cpumap`: 32-bit hex words, most significant first.
fn cpumask(cpus: &std::ops::Range<u32>) -> String {
    let words = (cpus.end.max(1) as usize).div_ceil(32);
    let mut w = vec![0u32; words];
    for c in cpus.clone() {
        w[(c / 32) as usize] |= 1 << (c % 32);
    }
    w.iter()
        .rev()
        .map(|x| format!("{x:08x}"))
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpumask_words() {
        assert_eq!(cpumask(&(0..4)), "0000000f");
        assert_eq!(cpumask(&(32..40)), "000000ff,00000000");
        assert_eq!(cpumask(&(30..34)), "00000003,c0000000");
    }
}
