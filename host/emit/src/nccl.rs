//! NCCL topology XML for the guest (`NCCL_TOPO_FILE`).
//!
//! Inside a VM NCCL sees the guest's PCIe tree: GPUs on separate root ports look `PHB`
//! apart, so NCCL skips P2P even where the clique makes the driver allow it. This file
//! tells NCCL the truth: one `<cpu>` per guest NUMA node, the emulated switches of a
//! mirrored layout as nested `<pci>` bridges, and GPUs of one clique that the guest tree
//! does not already join below a switch grouped under a made-up bridge (domain `ffff`,
//! as cloud providers do), so NCCL finds them `PIX`/`PXB` apart and uses P2P.
//!
//! Attributes follow NCCL 2.28.9's own dump (`NCCL_TOPO_DUMP_FILE`; NVIDIA/nccl
//! src/graph/xml.cc `ncclTopoGetXmlFromCpu`, `ncclTopoGetXmlFromGpu`, read back by
//! src/graph/topo.cc `ncclTopoAddCpu`, `ncclTopoAddNvLinks`), in its order:
//! - `<cpu>`: `numaid`, `affinity`, `arch`, `vendor`, `familyid`, `modelid` (NCCL 2.28.9
//!   refuses a file without `arch`); `host_hash` is left to NCCL (its hash of the running
//!   host, 0 when absent, which only matters across hosts);
//! - GPU `<pci>`: `busid`, `class`, `vendor`, `device`, `link_speed`, `link_width`,
//!   `subsystem_vendor`, `subsystem_device`;
//! - `<nvlink>` as NVML reports the far end: on an NVSwitch board one element to the
//!   switch fabric (`target="fffffff:ff:ff.0"`, NVML's address for a switch the guest
//!   cannot see, `tclass="0x068000"`, `count` = the GPU's links; NCCL joins every switch
//!   into one node), else one per peer GPU (`tclass` = the peer's class).
//!
//! - NICs passed with the GPUs (`--nics`): `<pci>` at the NIC's guest address, inside
//!   the guest switch that holds it, with `busid`, `class`, `vendor`, `device`,
//!   `subsystem_vendor`, `subsystem_device`, `link_speed`, `link_width` (the order of
//!   xml.cc `ncclTopoGetXmlFromSys`, which fills the `<pci>` above a NIC), holding
//!   `<nic><net name=".." dev=".."/></nic>` (xml.cc `ncclTopoFillNet`).
//!
//! Left to NCCL, which fills them on every run: `<gpu>`'s `dev`, `sm`, `rank`, `gdr`
//! (its device index, compute capability, rank in the communicator), and `<net>`'s
//! `latency`, `speed`, `port`, `guid`, `maxconn`, `gdr`: NCCL 2.28.9 (topo.cc
//! `ncclTopoPopulateNics`) finds the `<net>` whose `name` its network plugin reports,
//! sets `dev` to its own index and adds each of those attributes only where the file has
//! none (`xmlInitAttrInt`), so a value the host cannot know (the port's GUID and link
//! speed live in the NIC's firmware and the fabric; GPUDirect RDMA support in the guest's
//! nvidia-peermem/dma-buf) would override the device's truth if written here; they are
//! left out. `name` is the RDMA device name the guest's driver will give: the host
//! name's prefix (`mlx5_` of `mlx5_3`; `mlx5_` for any Mellanox NIC) numbered in guest
//! address order, as mlx5 and other RDMA drivers number devices in probe order. A name
//! the guest does not have is dropped by NCCL (no `keep`, `ncclTopoTrimXml`), which then
//! places that NIC from the guest's sysfs itself: mirror puts it where the host has it.

use std::collections::BTreeMap;
use std::fmt::Write;

use pci_config::{Bdf, LinkSpeed};

use super::vm::VmDefinition;
use vfio_p2p_decide::guest_layout::guest_rdma_names;
use vfio_p2p_decide::guest_layout::{GuestBridgeKind, GuestGpu};
use vfio_p2p_decide::nvlink::{nvlink_targets, NvlinkTarget};
use vfio_p2p_model::{CpuArch, CpuIdentity, Topology};

/// Domain of the made-up bridges: never a real guest PCI domain.
const FAKE_DOMAIN: u16 = 0xffff;
const CLASS_BRIDGE: &str = "0x060400";
/// NVML's PCI address of an NVLink's far end that is an NVSwitch outside the VM, as
/// NCCL 2.28.9 writes it in its dump.
const SWITCH_FABRIC_TARGET: &str = "fffffff:ff:ff.0";
const CLASS_NVSWITCH: &str = "0x068000";

#[derive(Debug, Clone)]
enum Node {
    Bridge {
        busid: Bdf,
        children: Vec<Node>,
    },
    Gpu(usize),
    /// A NIC passed with the GPUs (index into the layout's `nics`).
    Nic(usize),
}

impl Node {
    fn cliques(&self, gpus: &[GuestGpu], out: &mut Vec<u8>) {
        match self {
            Node::Gpu(i) => out.extend(gpus[*i].clique),
            Node::Nic(_) => {}
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
    let gpus = l.gpus.iter().enumerate().map(|(i, g)| (g, Node::Gpu(i)));
    let nics = l.nics.iter().enumerate().map(|(i, n)| (n, Node::Nic(i)));
    for (d, leaf) in gpus.chain(nics) {
        let switches: Vec<Bdf> = l
            .ancestors(d)
            .into_iter()
            .filter(|b| b.kind == GuestBridgeKind::SwitchUpstream)
            .map(|b| {
                let parent_bus = l.bridge(&b.parent).map_or(0, |p| p.bus);
                Bdf::new(0, parent_bus, b.slot, 0)
            })
            .collect();
        let top = per_node.entry(d.numa_node.unwrap_or(0)).or_default();
        insert(top, &switches, leaf);
    }
    let mut fake = 0u8;
    let nic_names = guest_rdma_names(&vm.layout.nics, topo);
    let mut x = String::from("<system version=\"1\">\n");
    for (numa, mut top) in per_node {
        top = group_cliques(top, &l.gpus, &mut fake);
        let affinity = l
            .numa_nodes
            .iter()
            .position(|n| n.id == numa)
            .map(|i| cpumask(vm.numa_share(i).0))
            .or_else(|| machine_affinity(vm, topo, numa))
            .map(|mask| format!(" affinity=\"{mask}\""))
            .unwrap_or_default();
        let cpu = topo.cpu.as_ref().map(cpu_attrs).unwrap_or_default();
        let _ = writeln!(x, "  <cpu numaid=\"{numa}\"{affinity}{cpu}>");
        for n in &top {
            write_node(&mut x, n, vm, topo, &nic_names, 2);
        }
        let _ = writeln!(x, "  </cpu>");
    }
    x.push_str("</system>\n");
    x
}

fn insert(nodes: &mut Vec<Node>, switches: &[Bdf], leaf: Node) {
    let Some((first, rest)) = switches.split_first() else {
        nodes.push(leaf);
        return;
    };
    for n in nodes.iter_mut() {
        if let Node::Bridge { busid, children } = n {
            if busid == first {
                insert(children, rest, leaf);
                return;
            }
        }
    }
    let mut children = Vec::new();
    insert(&mut children, rest, leaf);
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

/// The first device below `n` (a GPU, else a NIC): whose link a bridge reports.
fn first_device<'a>(n: &Node, vm: &'a VmDefinition) -> Option<&'a GuestGpu> {
    match n {
        Node::Gpu(i) => vm.layout.gpus.get(*i),
        Node::Nic(i) => vm.layout.nics.get(*i),
        Node::Bridge { children, .. } => children.iter().find_map(|c| first_device(c, vm)),
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

/// Writes `n` and what is below it; `nic_names` are the passed NICs' `<net>` names.
fn write_node(
    x: &mut String,
    n: &Node,
    vm: &VmDefinition,
    topo: &Topology,
    nic_names: &[String],
    depth: usize,
) {
    let pad = "  ".repeat(depth);
    let gpus = &vm.layout.gpus;
    match n {
        Node::Bridge { busid, children } => {
            let _ = writeln!(
                x,
                "{pad}<pci busid=\"{busid}\" class=\"{CLASS_BRIDGE}\"{}>",
                link_attrs(first_device(n, vm), topo)
            );
            for c in children {
                write_node(x, c, vm, topo, nic_names, depth + 1);
            }
            let _ = writeln!(x, "{pad}</pci>");
        }
        Node::Nic(i) => write_nic(x, *i, vm, topo, &nic_names[*i], &pad),
        Node::Gpu(i) => {
            let g = &gpus[*i];
            let subsystem = subsystem_attrs(topo, &g.host);
            let attrs = format!(
                "busid=\"{}\" class=\"{:#08x}\" vendor=\"{:#06x}\" device=\"{:#06x}\"{}{subsystem}",
                g.guest,
                g.class,
                g.vendor,
                g.device,
                link_attrs(Some(g), topo)
            );
            let peers: Vec<Bdf> = gpus.iter().map(|p| p.host).collect();
            let links = nvlink_targets(topo, &g.host, &peers);
            if links.is_empty() {
                let _ = writeln!(x, "{pad}<pci {attrs}/>");
                return;
            }
            let _ = writeln!(x, "{pad}<pci {attrs}>\n{pad}  <gpu>");
            for link in links {
                let (target, count, tclass) = match link {
                    NvlinkTarget::Fabric { links } => (
                        SWITCH_FABRIC_TARGET.to_string(),
                        links,
                        CLASS_NVSWITCH.to_string(),
                    ),
                    NvlinkTarget::Gpu { peer, links } => {
                        let Some(p) = gpus.iter().find(|p| p.host == peer) else {
                            continue;
                        };
                        (p.guest.to_string(), links, format!("{:#08x}", p.class))
                    }
                };
                let _ = writeln!(
                    x,
                    "{pad}    <nvlink target=\"{target}\" count=\"{count}\" tclass=\"{tclass}\"/>"
                );
            }
            let _ = writeln!(x, "{pad}  </gpu>\n{pad}</pci>");
        }
    }
}

/// The `subsystem_vendor`/`subsystem_device` attributes of a host device, if known.
fn subsystem_attrs(topo: &Topology, host: &Bdf) -> String {
    topo.device(host)
        .and_then(|d| d.subsystem)
        .map(|(v, d)| format!(" subsystem_vendor=\"{v:#06x}\" subsystem_device=\"{d:#06x}\""))
        .unwrap_or_default()
}

/// The `<pci>` of the `i`-th passed NIC with its `<nic><net>`.
fn write_nic(x: &mut String, i: usize, vm: &VmDefinition, topo: &Topology, name: &str, pad: &str) {
    let n = &vm.layout.nics[i];
    let _ = writeln!(
        x,
        "{pad}<pci busid=\"{}\" class=\"{:#08x}\" vendor=\"{:#06x}\" device=\"{:#06x}\"{}{}>",
        n.guest,
        n.class,
        n.vendor,
        n.device,
        subsystem_attrs(topo, &n.host),
        link_attrs(Some(n), topo)
    );
    let _ = writeln!(
        x,
        "{pad}  <nic>\n{pad}    <net name=\"{}\" dev=\"{i}\"/>\n{pad}  </nic>\n{pad}</pci>",
        name
    );
}

/// The CPU's `arch`, `vendor`, `familyid`, `modelid` as NCCL writes them.
fn cpu_attrs(cpu: &CpuIdentity) -> String {
    let mut s = format!(" arch=\"{}\"", cpu.arch.nccl_name());
    // NCCL reads vendor, family and model on x86 only.
    if cpu.arch != CpuArch::X86_64 {
        return s;
    }
    if let Some(v) = &cpu.vendor {
        let _ = write!(s, " vendor=\"{v}\"");
    }
    if let (Some(f), Some(m)) = (cpu.family, cpu.model) {
        let _ = write!(s, " familyid=\"{}\" modelid=\"{m}\"", nccl_family_id(f));
    }
    s
}

/// NCCL's `familyid` from Linux's `cpu family`. Both start from CPUID leaf 1, but Linux
/// adds the extended family when the base family is 0xf (arch/x86/lib/cpu.c
/// `x86_family`), while NCCL shifts it left by 4 and adds it always (xml.cc
/// `familyId = cpuid1.familyId + (cpuid1.extFamilyId << 4)`): the same 6 for Intel, 175
/// instead of 25 for AMD Zen 3/4. The model agrees: both add extended model << 4
/// (Linux from family 6 on; below that the extended model is 0).
fn nccl_family_id(linux_family: u32) -> u32 {
    if linux_family >= 0xf {
        0xf + ((linux_family - 0xf) << 4)
    } else {
        linux_family
    }
}

/// `--as-is` (every GPU at its host address, no guest NUMA nodes): the CPUs of NUMA
/// node `numa` on the machine read, else those local to its GPUs (a VM whose GPUs have
/// no NUMA node: NCCL then writes node 0 with all CPUs, as in its dump).
fn machine_affinity(vm: &VmDefinition, topo: &Topology, numa: u32) -> Option<String> {
    let l = vm.layout;
    if !l.numa_nodes.is_empty() || l.gpus.iter().any(|g| g.guest != g.host) {
        return None;
    }
    let list = topo.numa_nodes.get(&numa).cloned().or_else(|| {
        l.gpus
            .iter()
            .filter(|g| g.numa_node.unwrap_or(0) == numa)
            .find_map(|g| topo.device(&g.host)?.local_cpulist.clone())
    })?;
    cpulist_cpus(&list).map(cpumask)
}

/// The CPUs of a kernel cpulist (`0-31,64-95`), at most 65,536.
fn cpulist_cpus(list: &str) -> Option<Vec<u32>> {
    let mut cpus = Vec::new();
    for part in list.trim().split(',') {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        let (a, b): (u32, u32) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
        if a > b || b >= 1 << 16 {
            return None;
        }
        cpus.extend(a..=b);
    }
    Some(cpus)
}

/// A CPU set as the kernel prints `cpumap`: 32-bit hex words, most significant first.
fn cpumask(cpus: impl IntoIterator<Item = u32>) -> String {
    let cpus: Vec<u32> = cpus.into_iter().collect();
    let words = (cpus.iter().max().map_or(1, |m| m + 1) as usize).div_ceil(32);
    let mut w = vec![0u32; words];
    for c in cpus {
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
    fn nccl_family_ids() {
        assert_eq!(nccl_family_id(6), 6);
        assert_eq!(nccl_family_id(0xf), 0xf);
        // AMD Zen 3/4: base 0xf + extended 0xa → Linux 25, NCCL 15 + 160.
        assert_eq!(nccl_family_id(25), 175);
        // Zen 5: extended 0xb.
        assert_eq!(nccl_family_id(26), 191);
    }

    #[test]
    fn cpumask_words() {
        assert_eq!(cpumask(0..4), "0000000f");
        assert_eq!(cpumask(32..40), "000000ff,00000000");
        assert_eq!(cpumask(30..34), "00000003,c0000000");
        assert_eq!(cpumask(cpulist_cpus("0-31").unwrap()), "ffffffff");
        assert_eq!(
            cpumask(cpulist_cpus("0-1,64").unwrap()),
            "00000001,00000000,00000003"
        );
        assert_eq!(cpulist_cpus("3-1"), None);
        assert_eq!(cpulist_cpus("x"), None);
    }
}
