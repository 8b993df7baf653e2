//! A Grace guest (GH200, GB200, GB300 hosts): an aarch64 `virt` machine whose GPUs keep
//! the NUMA shape they have on the host.
//!
//! - **Nodes.** The CPU nodes first (one per host node the chosen GPUs hang off), then per
//!   GPU, in PCI order, [`GI_NODES_PER_GPU`] nodes without CPUs or memory: its memory node
//!   and its 7 companions, each standing for the host node it mirrors. QEMU ties them to
//!   the GPU with one `acpi-generic-initiator` each (SRAT Generic Initiator Affinity), as
//!   the host's firmware does (the GPU's `nvidia,gpu-mem-pxm-start`/`-count` range, read by
//!   Linux's nvgrace-gpu driver).
//! - **Distances** are the host's (`nodeN/distance`) between the nodes each guest node
//!   stands for; where the host does not say them, none are written and the guest sees
//!   QEMU's (10 local, 20 otherwise).
//! - **vSMMU.** One `pxb-pcie` with its own `arm-smmuv3` per physical SMMU behind the chosen
//!   GPUs (GPUs that share one SMMU share one vSMMU), one root port per GPU below it; the
//!   older form (see [`gates`]) is one SMMUv3 for the machine and root ports on `pcie.0`.
//! - **MMIO window** (`highmem-mmio-size`): a power of two holding the GPUs' 64-bit BARs,
//!   at least `virt`'s 512 GiB default, which QEMU refuses to go below.
//! - **Memory**: 512 MiB huge pages where the host kernel offers them (a 64 KiB-page arm64
//!   kernel, NVIDIA's recommended one for Grace), each CPU node's share a multiple of them.

mod gates;
#[cfg(test)]
mod tests;

pub use gates::{qemu_pieces, QemuPieces, SmmuForm};

use std::collections::BTreeMap;

use pci_config::Bdf;
use serde::Serialize;

use crate::guest_layout::{
    GuestBridge, GuestBridgeKind, GuestLayout, GuestNumaNode, EXPANDER_BUS_STRIDE,
    EXPANDER_FIRST_SLOT, MAX_EXPANDERS, ROOT_BUS,
};
use vfio_p2p_model::grace::c2c_gpus;
use vfio_p2p_model::vmm::QemuVersion;
use vfio_p2p_model::{HostBridgeId, Topology};

/// Guest NUMA nodes per Grace GPU: its memory node and 7 generic-initiator companions.
pub const GI_NODES_PER_GPU: usize = 8;
/// `virt`'s high PCIe MMIO window when `highmem-mmio-size` is not given; QEMU refuses a
/// smaller value (hw/arm/virt.c, `DEFAULT_HIGH_PCIE_MMIO_SIZE`).
pub const HIGHMEM_MMIO_DEFAULT: u64 = 512 << 30;
/// The huge page of a 64 KiB-page arm64 kernel (a PMD), KiB.
pub const HUGEPAGE_64K_KERNEL_KIB: u64 = 512 * 1024;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum GraceError {
    #[error("the Grace guest needs QEMU >= {needed} for {what}; the QEMU given is {found}: install a newer QEMU (Debian trixie-backports and sid have 11.1) and point gen --qemu at it")]
    QemuTooOld {
        found: QemuVersion,
        needed: QemuVersion,
        what: &'static str,
    },
    #[error("{gpu}: the host shows {found} NUMA node(s) for this Grace GPU ({nodes}); a Grace GPU has {GI_NODES_PER_GPU} (its memory node and 7 generic-initiator companions): generate on the host itself or from its `vfio-p2p snapshot`, where `vfio-p2p topo` lists them")]
    MissingNodes {
        gpu: Bdf,
        found: usize,
        nodes: String,
    },
    #[error("memory_mib {memory_mib}: the guest's {cpu_nodes} CPU node(s) get {share} MiB each, not a multiple of the host's 512 MiB huge pages (a 64 KiB-page kernel); make memory_mib a multiple of {multiple}")]
    HugepageFit {
        memory_mib: u64,
        cpu_nodes: u64,
        share: u64,
        multiple: u64,
    },
    #[error("the chosen GPUs sit behind {0} SMMUs; a guest holds at most {MAX_EXPANDERS} pxb-pcie buses with a vSMMU each: choose GPUs behind fewer SMMUs")]
    TooManySmmus(usize),
}

/// A guest node without CPUs or memory and the host node it stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct GraceNode {
    pub id: u32,
    pub host_node: u32,
}

/// A GPU's guest NUMA nodes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GraceGpuNodes {
    /// The GPU's QEMU device id (`gpuN`).
    pub gpu: String,
    pub host: Bdf,
    /// Its memory node first, then its companions.
    pub nodes: Vec<GraceNode>,
}

/// A virtual SMMUv3 standing for one physical SMMU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GuestSmmu {
    /// QEMU device id (`smmuv3.N`).
    pub id: String,
    /// The `pxb-pcie` bus it translates for (`pcie.N`).
    pub primary_bus: String,
    /// The host SMMU it stands for (its `iommu` link's name), or `None` where the host
    /// shows none (then the GPU gets a vSMMU of its own).
    pub host_unit: Option<String>,
}

/// Everything a Grace guest needs beyond its PCIe tree (which is in the [`GuestLayout`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GraceGuest {
    pub gpus: Vec<GraceGpuNodes>,
    pub smmu_form: SmmuForm,
    /// One per physical SMMU in the per-physical form; empty in the machine-wide form.
    pub smmus: Vec<GuestSmmu>,
    /// Guest nodes in all: the layout's CPU nodes, then the GPUs'.
    pub node_count: u32,
    /// `distances[i][j]` between guest nodes, as the guest will list them.
    pub distances: Vec<Vec<u32>>,
    /// Whether the distances are the host's (written as `-numa dist`), else QEMU's default.
    pub distances_from_host: bool,
    /// `highmem-mmio-size`, bytes; `None` where the QEMU cannot take it (the window then
    /// stays 512 GiB, which holds the BARs).
    pub highmem_mmio_size: Option<u64>,
    /// Huge page size backing guest RAM, KiB.
    pub hugepage_kib: Option<u64>,
}

impl GraceGuest {
    /// Every node in guest id order with the host node it stands for.
    pub fn all_nodes<'a>(
        &'a self,
        layout: &'a GuestLayout,
    ) -> impl Iterator<Item = (u32, u32)> + 'a {
        layout.numa_nodes.iter().map(|n| (n.id, n.host_node)).chain(
            self.gpus
                .iter()
                .flat_map(|g| g.nodes.iter().map(|n| (n.id, n.host_node))),
        )
    }
}

/// Whether `gpus` on `topo` make a Grace guest: an aarch64 host with a superchip GPU among them.
pub fn is_grace(topo: &Topology, gpus: &[Bdf]) -> bool {
    topo.is_arm64() && c2c_gpus(topo).keys().any(|b| gpus.contains(b))
}

/// The high MMIO window the GPUs of `layout` need: a power of two holding their 64-bit
/// BARs, at least `virt`'s default.
pub fn window(topo: &Topology, layout: &GuestLayout) -> u64 {
    let devices: Vec<_> = layout
        .passed()
        .filter_map(|g| topo.device(&g.host))
        .collect();
    highmem_mmio_size(crate::mmio::hole64_size(&devices))
}

/// `virt`'s high PCIe MMIO window for BARs that need `need` bytes ([`crate::mmio::hole64_size`]):
/// a power of two (QEMU refuses another `highmem-mmio-size`), at least the default.
pub fn highmem_mmio_size(need: u64) -> u64 {
    need.next_power_of_two().max(HIGHMEM_MMIO_DEFAULT)
}

/// The Grace guest for the GPUs of `flat` (a flat layout: one root port per GPU on
/// `pcie.0`), with `memory_mib` of RAM, in the forms `pieces` says the VMM takes (see
/// [`qemu_pieces`]): the layout rewritten (CPU nodes; a `pxb-pcie` per physical SMMU in
/// the per-physical form), the Grace pieces, and the warnings to say.
pub fn decide(
    topo: &Topology,
    mut flat: GuestLayout,
    memory_mib: u64,
    pieces: QemuPieces,
) -> Result<(GuestLayout, GraceGuest, Vec<String>), GraceError> {
    flat.numa_nodes = cpu_nodes(topo, &flat);
    let window = window(topo, &flat);
    let mut warnings = Vec::new();
    let gpus = gpu_nodes(topo, &flat)?;
    let smmus = match pieces.smmu_form {
        SmmuForm::PerPhysical => per_smmu_buses(topo, &mut flat, &mut warnings)?,
        SmmuForm::MachineWide => Vec::new(),
    };
    let node_count =
        flat.numa_nodes.len() as u32 + gpus.iter().map(|g| g.nodes.len() as u32).sum::<u32>();
    warnings.extend(node_limit_warning(node_count));
    let mut guest = GraceGuest {
        gpus,
        smmu_form: pieces.smmu_form,
        smmus,
        node_count,
        distances: Vec::new(),
        distances_from_host: false,
        highmem_mmio_size: pieces.highmem_mmio_size.then_some(window),
        hugepage_kib: topo
            .hugepage_sizes_kib
            .contains(&HUGEPAGE_64K_KERNEL_KIB)
            .then_some(HUGEPAGE_64K_KERNEL_KIB),
    };
    let hosts: Vec<u32> = guest.all_nodes(&flat).map(|(_, h)| h).collect();
    match host_distances(topo, &hosts) {
        Some(d) => (guest.distances, guest.distances_from_host) = (d, true),
        None => {
            warnings.push(format!(
                "{} does not show the NUMA distances of nodes {hosts:?} (nodeN/distance): the guest gets the default ones, 10 local and 20 between nodes",
                topo.source
            ));
            guest.distances = default_distances(hosts.len());
        }
    }
    if guest.hugepage_kib.is_some() {
        hugepages_fit(memory_mib, flat.numa_nodes.len() as u64)?;
    }
    Ok((flat, guest, warnings))
}

/// The nodes a guest kernel takes: 2^CONFIG_NODES_SHIFT. Debian's arm64 kernel takes 16 (the
/// aarch64 lab booted a gb200 guest of 34 nodes on it: "SRAT: Too many proximity domains",
/// nodes 16-33 gone; tests/fixtures/grace/lab-gb200), so any guest of two GPUs or more needs
/// a kernel built for more.
const DEBIAN_ARM64_NODES: u32 = 16;

/// A warning when the guest has more NUMA nodes than Debian's arm64 kernel takes, naming the
/// CONFIG_NODES_SHIFT that holds them all.
fn node_limit_warning(node_count: u32) -> Option<String> {
    (node_count > DEBIAN_ARM64_NODES).then(|| {
        let shift = node_count.next_power_of_two().trailing_zeros();
        format!(
            "the guest has {node_count} NUMA nodes: its kernel must be built with CONFIG_NODES_SHIFT={shift} or more (Debian's arm64 kernel takes {DEBIAN_ARM64_NODES} and drops the GPU nodes past them, so the agent's expect fails)"
        )
    })
}

/// One guest CPU node per host node the chosen GPUs hang off (their device's node, else
/// their root complex's), in host node order; the host's first CPU node where none says.
fn cpu_nodes(topo: &Topology, layout: &GuestLayout) -> Vec<GuestNumaNode> {
    let mut hosts: Vec<u32> = layout
        .passed()
        .filter_map(|g| topo.device(&g.host))
        .filter_map(|d| d.numa_node.or_else(|| topo.host_bridge_numa(d.host_bridge)))
        .collect();
    hosts.sort_unstable();
    hosts.dedup();
    if hosts.is_empty() {
        let first = topo.numa_nodes.iter().find(|(_, c)| !c.trim().is_empty());
        hosts.extend(first.map(|(n, _)| *n).or(Some(0)));
    }
    hosts
        .iter()
        .enumerate()
        .map(|(i, h)| GuestNumaNode {
            id: i as u32,
            host_node: *h,
            host_cpus: topo.numa_nodes.get(h).filter(|c| !c.is_empty()).cloned(),
        })
        .collect()
}

/// Each superchip GPU's guest nodes, numbered after the CPU nodes in GPU order.
fn gpu_nodes(topo: &Topology, layout: &GuestLayout) -> Result<Vec<GraceGpuNodes>, GraceError> {
    let c2c = c2c_gpus(topo);
    let mut next = layout.numa_nodes.len() as u32;
    let mut out = Vec::new();
    for g in &layout.gpus {
        let Some(c) = c2c.get(&g.host) else { continue };
        if c.memory_nodes.len() != GI_NODES_PER_GPU {
            return Err(GraceError::MissingNodes {
                gpu: g.host,
                found: c.memory_nodes.len(),
                nodes: format!("{:?}", c.memory_nodes),
            });
        }
        let nodes = c
            .memory_nodes
            .iter()
            .enumerate()
            .map(|(j, h)| GraceNode {
                id: next + j as u32,
                host_node: *h,
            })
            .collect();
        next += GI_NODES_PER_GPU as u32;
        out.push(GraceGpuNodes {
            gpu: g.id.clone(),
            host: g.host,
            nodes,
        });
    }
    Ok(out)
}

/// Moves each GPU's root port onto a `pxb-pcie` of its physical SMMU (one per SMMU, in the
/// order the GPUs come) and renumbers what stays on `pcie.0`; returns the vSMMUs.
fn per_smmu_buses(
    topo: &Topology,
    layout: &mut GuestLayout,
    warnings: &mut Vec<String>,
) -> Result<Vec<GuestSmmu>, GraceError> {
    let mut groups: Vec<(Option<String>, Vec<usize>)> = Vec::new();
    for (i, g) in layout.gpus.iter().enumerate() {
        let unit = topo.iommu_units.get(&g.host).cloned();
        if unit.is_none() {
            warnings.push(format!(
                "{}: the host shows no SMMU for it (no iommu link in sysfs): it gets a vSMMU of its own",
                g.host
            ));
        }
        match groups
            .iter_mut()
            .find(|(u, _)| unit.is_some() && *u == unit)
        {
            Some((_, members)) => members.push(i),
            None => groups.push((unit, vec![i])),
        }
    }
    if groups.len() > MAX_EXPANDERS {
        return Err(GraceError::TooManySmmus(groups.len()));
    }
    let node_of: BTreeMap<u32, u32> = layout
        .numa_nodes
        .iter()
        .map(|n| (n.host_node, n.id))
        .collect();
    let mut expanders = Vec::new();
    let mut smmus = Vec::new();
    for (k, (unit, members)) in groups.into_iter().enumerate() {
        let id = format!("pcie.{}", k + 1);
        let bus = (k as u8 + 1) * EXPANDER_BUS_STRIDE;
        let lead = layout.gpus[members[0]].host;
        let first = topo.device(&lead);
        let host_node = first.and_then(|d| d.numa_node);
        let numa_node = host_node.and_then(|h| node_of.get(&h).copied());
        expanders.push(GuestBridge {
            id: id.clone(),
            kind: GuestBridgeKind::Expander {
                host_bridge: first.map_or(
                    HostBridgeId {
                        domain: lead.domain,
                        bus: 0,
                    },
                    |d| d.host_bridge,
                ),
                host_node,
                numa_node,
            },
            parent: ROOT_BUS.to_string(),
            slot: EXPANDER_FIRST_SLOT + k as u8,
            bus,
            host: None,
        });
        for (j, i) in members.into_iter().enumerate() {
            let port = layout.gpus[i].parent.clone();
            let port_bus = bus + 1 + j as u8;
            if let Some(b) = layout.bridges.iter_mut().find(|b| b.id == port) {
                (b.parent, b.slot, b.bus) = (id.clone(), j as u8, port_bus);
            }
            move_device(&mut layout.gpus[i], port_bus, numa_node);
        }
        smmus.push(GuestSmmu {
            id: format!("smmuv3.{k}"),
            primary_bus: id,
            host_unit: unit,
        });
    }
    renumber_root_ports(layout);
    expanders.append(&mut layout.bridges);
    layout.bridges = expanders;
    Ok(smmus)
}

fn move_device(d: &mut crate::guest_layout::GuestDevice, bus: u8, numa_node: Option<u32>) {
    d.guest = Bdf::new(d.guest.domain, bus, d.guest.device, d.guest.function);
    for f in &mut d.other_functions {
        f.guest = Bdf::new(f.guest.domain, bus, f.guest.device, f.guest.function);
    }
    d.numa_node = numa_node;
}

/// The root ports left on `pcie.0` (the NICs') numbered 1, 2, … in slot order, as the
/// firmware numbers them once the GPUs' ports moved to the expanders.
fn renumber_root_ports(layout: &mut GuestLayout) {
    let mut ports: Vec<(u8, String)> = layout
        .bridges
        .iter()
        .filter(|b| b.parent == ROOT_BUS)
        .map(|b| (b.slot, b.id.clone()))
        .collect();
    ports.sort();
    for (n, (_, id)) in ports.iter().enumerate() {
        let bus = n as u8 + 1;
        if let Some(b) = layout.bridges.iter_mut().find(|b| b.id == *id) {
            b.bus = bus;
        }
        for d in layout.gpus.iter_mut().chain(&mut layout.nics) {
            if d.parent == *id {
                let numa = d.numa_node;
                move_device(d, bus, numa);
            }
        }
    }
}

/// The host's distances between the nodes the guest nodes stand for, or `None` where the
/// host does not say one of them.
fn host_distances(topo: &Topology, hosts: &[u32]) -> Option<Vec<Vec<u32>>> {
    hosts
        .iter()
        .map(|a| hosts.iter().map(|b| topo.numa_distance(*a, *b)).collect())
        .collect()
}

/// ACPI's default: 10 to itself, 20 to every other node.
fn default_distances(n: usize) -> Vec<Vec<u32>> {
    (0..n)
        .map(|i| (0..n).map(|j| if i == j { 10 } else { 20 }).collect())
        .collect()
}

/// Each CPU node's share of RAM (the first takes the remainder) must be whole huge pages.
fn hugepages_fit(memory_mib: u64, cpu_nodes: u64) -> Result<(), GraceError> {
    let page_mib = HUGEPAGE_64K_KERNEL_KIB / 1024;
    let n = cpu_nodes.max(1);
    let per = memory_mib / n;
    let first = memory_mib - per * (n - 1);
    match (per.is_multiple_of(page_mib), first.is_multiple_of(page_mib)) {
        (true, true) => Ok(()),
        (per_fits, _) => Err(GraceError::HugepageFit {
            memory_mib,
            cpu_nodes: n,
            share: if per_fits { first } else { per },
            multiple: n * page_mib,
        }),
    }
}
