//! `vfio-p2p topo` output: the `nvidia-smi topo -m` style matrix with its legend,
//! the PCIe tree above the GPUs (ACS per bridge, IOMMU group per GPU), and the same
//! facts as JSON/YAML ([`HostTopoReport`]) or Graphviz (`topo_dot::render_dot`).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use comfy_table::{presets, Cell, CellAlignment, ContentArrangement, Table};
use pci_config::Bdf;
use serde::Serialize;

use vfio_p2p_model::fabric::Fabric;

use pci_config::PathKind;
use vfio_p2p_model::HostBridgeId;
use vfio_p2p_model::{BridgeRole, Device, DeviceKind, Link, Topology};

/// The data form of `topo` (`--format json|yaml`). `gpus` is in BDF order and
/// `matrix[i][j]` is the `nvidia-smi topo -m` label between `gpus[i]` and `gpus[j]`.
#[derive(Debug, Serialize)]
pub struct HostTopoReport {
    pub source: String,
    pub gpus: Vec<GpuEntry>,
    pub matrix: Vec<Vec<String>>,
    /// The PCIe path label alone (what matters for the clique), even where NVLink is shown.
    pub pcie_matrix: Vec<Vec<String>>,
    pub nics: Vec<NicEntry>,
    pub host_bridges: Vec<HostBridgeEntry>,
    /// NUMA node → CPU list.
    pub numa_nodes: BTreeMap<u32, String>,
    /// False when only 64 bytes of config space were readable (not root).
    pub config_complete: bool,
    pub warnings: Vec<String>,
    /// Fabric Manager's partitions and the model planning follows, on a board where they
    /// are known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fabric: Option<Fabric>,
    /// Why `matrix`, `pcie_matrix` and the NICs' paths are empty: more GPUs and NICs than
    /// [`MATRIX_MAX_DEVICES`] (the matrix grows with their square).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub matrix_left_out: Option<String>,
}

/// The most GPUs and NICs whose path matrix `topo` shows: 65,536 cells. A host has at most
/// a few dozen; past this the matrix (n² cells) is left out and the rest stays linear.
pub const MATRIX_MAX_DEVICES: usize = 256;

#[derive(Debug, Serialize)]
pub struct GpuEntry {
    pub index: usize,
    pub bdf: Bdf,
    pub vendor: String,
    pub device: String,
    pub class: String,
    pub nvidia: bool,
    pub numa_node: Option<u32>,
    pub cpu_affinity: Option<String>,
    pub iommu_group: Option<u32>,
    /// Every device in the GPU's IOMMU group (all of them go to vfio-pci together).
    pub iommu_group_members: Vec<Bdf>,
    pub driver: Option<String>,
    pub host_bridge: HostBridgeId,
    pub link: Link,
    pub bars: Vec<vfio_p2p_model::Bar>,
    /// Sum of the 64-bit BARs: what the guest's 64-bit MMIO window must hold.
    pub bar64_total: u64,
    /// Bridges from the host bridge down to the GPU.
    pub upstream: Vec<BridgeEntry>,
    /// `C2C` for a Grace superchip's GPU (NVLink-C2C to its CPU); absent for PCIe alone.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_link: Option<String>,
    /// The first NUMA node of the GPU's own memory (Grace superchips): nvidia-smi's
    /// "GPU NUMA ID".
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_numa_id: Option<u32>,
    /// The generic-initiator nodes that come with that memory node (no CPUs, no memory).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub gpu_numa_companions: Vec<u32>,
    /// The IOMMU the GPU sits behind (an Arm SMMUv3's name), where the host shows it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub iommu_unit: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct BridgeEntry {
    pub bdf: Bdf,
    pub role: Option<BridgeRole>,
    /// ACS control as `lspci` prints it; `None` without an ACS capability or when
    /// config space was not readable (see `acs_known`).
    pub acs: Option<String>,
    pub acs_known: bool,
}

#[derive(Debug, Serialize)]
pub struct NicEntry {
    pub index: usize,
    pub bdf: Bdf,
    pub vendor: String,
    pub device: String,
    pub numa_node: Option<u32>,
    pub driver: Option<String>,
    /// Path label from this NIC to each GPU, in `gpus` order.
    pub gpu_paths: Vec<String>,
    /// Path label from this NIC to each NIC, in `nics` order.
    pub nic_paths: Vec<String>,
}

#[derive(Debug, Serialize)]
pub struct HostBridgeEntry {
    pub id: HostBridgeId,
    pub numa_node: Option<u32>,
}

impl HostTopoReport {
    pub fn new(topo: &Topology) -> HostTopoReport {
        let gpus: Vec<&Device> = topo.gpus().collect();
        let nics: Vec<&Device> = nics(topo).collect();
        let label = |a: &Device, b: &Device| topo.path(&a.bdf, &b.bdf).label();
        let with_matrix = gpus.len() + nics.len() <= MATRIX_MAX_DEVICES;
        let matrix_left_out = (!with_matrix).then(|| {
            format!(
                "the path matrix is left out: {} GPUs and {} NICs are more than {MATRIX_MAX_DEVICES}; \
                 `vfio-p2p plan --gpus BDF,…` shows the paths between the GPUs of one VM",
                gpus.len(),
                nics.len()
            )
        });
        let matrix_of = |pcie: bool| -> Vec<Vec<String>> {
            if !with_matrix {
                return Vec::new();
            }
            gpus.iter()
                .map(|a| {
                    gpus.iter()
                        .map(|b| match pcie {
                            true => topo.path(&a.bdf, &b.bdf).kind.label().to_string(),
                            false => label(a, b),
                        })
                        .collect()
                })
                .collect()
        };
        let c2c = vfio_p2p_model::grace::c2c_gpus(topo);
        let paths_to = |n: &Device, to: &[&Device]| -> Vec<String> {
            match with_matrix {
                true => to.iter().map(|m| label(n, m)).collect(),
                false => Vec::new(),
            }
        };
        HostTopoReport {
            source: topo.source.clone(),
            gpus: gpus
                .iter()
                .enumerate()
                .map(|(index, g)| GpuEntry {
                    index,
                    bdf: g.bdf,
                    vendor: format!("{:#06x}", g.vendor),
                    device: format!("{:#06x}", g.device),
                    class: format!("{:#08x}", g.class),
                    nvidia: g.is_nvidia_gpu(),
                    numa_node: g.numa_node,
                    cpu_affinity: g.local_cpulist.clone(),
                    iommu_group: g.iommu_group,
                    iommu_group_members: topo.group_members(&g.bdf),
                    driver: g.driver.clone(),
                    host_bridge: g.host_bridge,
                    link: g.link,
                    bars: g.bars.clone(),
                    bar64_total: g.bar64_total(),
                    upstream: topo
                        .ancestors(&g.bdf)
                        .into_iter()
                        .map(|b| BridgeEntry {
                            bdf: b.bdf,
                            role: b.bridge_role(),
                            acs: b.acs.map(|a| a.control.to_string()),
                            acs_known: b.acs_unknown().is_none(),
                        })
                        .collect(),
                    cpu_link: c2c.get(&g.bdf).map(|_| "C2C".to_string()),
                    gpu_numa_id: c2c.get(&g.bdf).and_then(|c| c.memory_node()),
                    gpu_numa_companions: c2c
                        .get(&g.bdf)
                        .map(|c| c.companions().to_vec())
                        .unwrap_or_default(),
                    iommu_unit: topo.iommu_units.get(&g.bdf).cloned(),
                })
                .collect(),
            matrix: matrix_of(false),
            pcie_matrix: matrix_of(true),
            nics: nics
                .iter()
                .enumerate()
                .map(|(index, n)| NicEntry {
                    index,
                    bdf: n.bdf,
                    vendor: format!("{:#06x}", n.vendor),
                    device: format!("{:#06x}", n.device),
                    numa_node: n.numa_node,
                    driver: n.driver.clone(),
                    gpu_paths: paths_to(n, &gpus),
                    nic_paths: paths_to(n, &nics),
                })
                .collect(),
            host_bridges: topo
                .host_bridges
                .iter()
                .map(|h| HostBridgeEntry {
                    id: h.id,
                    numa_node: h.numa_node,
                })
                .collect(),
            numa_nodes: topo.numa_nodes.clone(),
            config_complete: !partial_config(topo),
            fabric: None,
            warnings: topo.warnings.iter().map(|w| w.to_string()).collect(),
            matrix_left_out,
        }
    }
}

/// Virtio network devices are VM plumbing, never GPUDirect RDMA peers.
const VENDOR_VIRTIO: u16 = 0x1af4;

/// NICs that can be GPUDirect RDMA peers, one per port's first function.
fn nics(topo: &Topology) -> impl Iterator<Item = &Device> {
    topo.devices
        .values()
        .filter(|d| d.kind == DeviceKind::Nic && d.bdf.function == 0 && d.vendor != VENDOR_VIRTIO)
}

/// Whether some device's config space stopped at the unprivileged 64 bytes.
fn partial_config(topo: &Topology) -> bool {
    topo.devices
        .values()
        .any(|d| !d.config.is_empty() && !d.config_complete())
}

/// The legend, in `nvidia-smi topo -m`'s order and words (C2C where a GPU has it).
fn legend(c2c: bool) -> String {
    let mut out = String::from("Legend:\n\n");
    for k in [
        PathKind::X,
        PathKind::Sys,
        PathKind::Node,
        PathKind::Phb,
        PathKind::Pxb,
        PathKind::Pix,
    ] {
        // wrapped to the width, continuation lines under the meaning
        let width = vfio_p2p_style::output_width().saturating_sub(9).max(20);
        let wrapped = vfio_p2p_style::wrap(k.meaning(), width);
        for (i, line) in wrapped.lines().enumerate() {
            let _ = match i {
                0 => writeln!(out, "  {:<4} = {line}", k.label()),
                _ => writeln!(out, "         {}", line.trim_start()),
            };
        }
    }
    out.push_str("  NV#  = Connection traversing a bonded set of # NVLinks\n");
    if c2c {
        out.push_str("  C2C  = NVLink-C2C between the GPU and its Grace CPU (CPU Link column)\n");
    }
    out
}

/// The full text report: matrix, legend, NIC legend, PCIe tree.
pub fn render_table(topo: &Topology, report: &HostTopoReport) -> String {
    let mut out = String::new();
    if report.gpus.is_empty() {
        let _ = writeln!(
            out,
            "No GPUs (PCI display or 3D controllers) found in {}.",
            report.source
        );
    } else {
        match &report.matrix_left_out {
            Some(why) => out.push_str(&vfio_p2p_style::wrap(
                &format!("Note: {why}."),
                vfio_p2p_style::output_width(),
            )),
            None => out.push_str(&matrix_table(report)),
        }
        out.push_str("\n\n");
        out.push_str(&legend(report.gpus.iter().any(|g| g.cpu_link.is_some())));
        if !report.nics.is_empty() {
            out.push_str("\nNIC Legend:\n\n");
            for n in &report.nics {
                let drv = n.driver.as_deref().unwrap_or("no driver");
                let _ = writeln!(out, "  NIC{}: {} ({drv})", n.index, n.bdf);
            }
        }
        out.push_str("\nPCIe tree of the GPUs:\n\n");
        out.push_str(&render_tree(topo));
        if let Some(f) = &report.fabric {
            let gpus: Vec<(usize, Bdf)> = report.gpus.iter().map(|g| (g.index, g.bdf)).collect();
            out.push_str(&super::fabric_list::topo_section(&gpus, f));
        }
    }
    if !report.config_complete {
        out.push_str(
            "\nNote: only the first 64 bytes of PCI config space were readable (not running as root): \
             bridge roles are inferred from the tree, ACS and other capabilities are unknown (ACS ?). \
             Run as root for the full picture.\n",
        );
    }
    out
}

/// The matrix in `nvidia-smi topo -m`'s look, fitted to the output width: when the columns
/// cannot all stand side by side, the ones that do not fit (NICs, affinities) are printed in
/// further blocks below, each with the row names again; no label is ever cut.
fn matrix_table(report: &HostTopoReport) -> String {
    matrix_table_at(report, usize::from(vfio_p2p_style::output_width()))
}

fn matrix_table_at(report: &HostTopoReport, width: usize) -> String {
    let names: Vec<String> = report
        .gpus
        .iter()
        .map(|g| format!("GPU{}", g.index))
        .chain(report.nics.iter().map(|n| format!("NIC{}", n.index)))
        .collect();
    let mut header = vec![String::new()];
    header.extend(names.iter().cloned());
    header.push("CPU Affinity".into());
    header.push("NUMA Affinity".into());
    // Grace superchips: the GPU's link to its CPU and its memory's own NUMA node
    let c2c = report.gpus.iter().any(|g| g.cpu_link.is_some());
    if c2c {
        header.push("CPU Link".into());
        header.push("GPU NUMA ID".into());
        header.push("Companion Nodes".into());
    }
    let n_gpus = report.gpus.len();
    let label = |i: usize, j: usize| -> String {
        match (i < n_gpus, j < n_gpus) {
            (true, true) => report.matrix[i][j].clone(),
            (true, false) => report.nics[j - n_gpus].gpu_paths[i].clone(),
            (false, true) => report.nics[i - n_gpus].gpu_paths[j].clone(),
            (false, false) => report.nics[i - n_gpus].nic_paths[j - n_gpus].clone(),
        }
    };
    let rows: Vec<Vec<String>> = names
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let mut row = vec![name.clone()];
            row.extend((0..names.len()).map(|j| label(i, j)));
            if let Some(g) = report.gpus.get(i) {
                row.push(
                    g.cpu_affinity
                        .clone()
                        .filter(|c| !c.is_empty())
                        .unwrap_or_else(|| "N/A".into()),
                );
                row.push(g.numa_node.map_or("N/A".into(), |n| n.to_string()));
                if c2c {
                    row.push(g.cpu_link.clone().unwrap_or_else(|| "PCIe".into()));
                    row.push(g.gpu_numa_id.map_or("N/A".into(), |n| n.to_string()));
                    row.push(crate::node_ranges::node_list(&g.gpu_numa_companions));
                }
            }
            row
        })
        .collect();
    // Each column as wide as its widest cell, two spaces after it (the last one's trimmed).
    let widths: Vec<usize> = (0..header.len())
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .chain([&header[c]])
                .map(|t| t.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let blocks: Vec<String> = vfio_p2p_style::column_groups(&widths, 1, 0, 2, width + 2)
        .into_iter()
        .map(|group| matrix_block(&header, &rows, &group))
        .collect();
    blocks.join("\n\n")
}

/// The matrix's columns `group`, without borders.
fn matrix_block(header: &[String], rows: &[Vec<String>], group: &[usize]) -> String {
    let mut table = Table::new();
    table
        .load_preset(presets::NOTHING)
        .set_content_arrangement(ContentArrangement::Disabled);
    table.set_header(
        group
            .iter()
            .map(|&c| Cell::new(&header[c]))
            .collect::<Vec<_>>(),
    );
    for r in rows {
        let cells = group.iter().map(|&c| {
            let cell = Cell::new(r.get(c).map_or("", String::as_str));
            // the labels centred, as nvidia-smi has them; names and affinities to the left
            if c > 0 && c < header.len() - 2 {
                cell.set_alignment(CellAlignment::Center)
            } else {
                cell
            }
        });
        table.add_row(cells.collect::<Vec<_>>());
    }
    for column in table.column_iter_mut() {
        column.set_padding((0, 2));
    }
    table
        .lines()
        .map(|l| l.trim_end().to_string())
        .collect::<Vec<_>>()
        .join("\n")
}

pub(crate) fn role_name(d: &Device) -> &'static str {
    match d.kind {
        DeviceKind::Bridge(BridgeRole::RootPort) => "root port",
        DeviceKind::Bridge(BridgeRole::UpstreamPort) => "switch upstream port",
        DeviceKind::Bridge(BridgeRole::DownstreamPort) => "switch downstream port",
        DeviceKind::Bridge(BridgeRole::PciBridge) => "PCI bridge",
        DeviceKind::Gpu { .. } => "GPU",
        DeviceKind::NvSwitch => "NVSwitch",
        DeviceKind::Nic => "NIC",
        DeviceKind::Other => "device",
    }
}

pub(crate) fn acs_text(d: &Device) -> String {
    match (&d.acs, d.acs_unknown()) {
        (Some(a), _) => format!("ACS {}", a.control),
        (None, None) => "no ACS".into(),
        (None, Some(_)) => "ACS ?".into(),
    }
}

pub(crate) fn link_text(l: &Link) -> Option<String> {
    let cur = match (l.current_speed, l.current_width) {
        (Some(s), Some(w)) => format!("{s} x{w}"),
        (Some(s), None) => s.to_string(),
        (None, Some(w)) => format!("x{w}"),
        (None, None) => return None,
    };
    match (l.max_speed, l.max_width) {
        (ms, mw) if ms == l.current_speed && mw == l.current_width => Some(cur),
        (Some(s), Some(w)) => Some(format!("{cur} (max {s} x{w})")),
        _ => Some(cur),
    }
}

fn gib(bytes: u64) -> String {
    if bytes >= 1 << 30 {
        format!("{} GiB", bytes >> 30)
    } else {
        format!("{} MiB", bytes >> 20)
    }
}

/// GPUs and every bridge above them, by host bridge then parent.
pub(crate) struct GpuTree<'a> {
    topo: &'a Topology,
    /// The shown devices under each (host bridge, parent), in BDF order: one lookup per
    /// node, so the tree of 10,000 GPUs is drawn in n log n.
    children: BTreeMap<(HostBridgeId, Option<Bdf>), Vec<&'a Device>>,
    pub(crate) gpu_index: BTreeMap<Bdf, usize>,
    c2c: BTreeMap<Bdf, vfio_p2p_model::grace::C2cGpu>,
}

impl<'a> GpuTree<'a> {
    fn new(topo: &'a Topology) -> Self {
        Self::with_nics(topo, false)
    }

    /// The GPUs and the bridges above them; with `nics`, the NICs and theirs too.
    pub(crate) fn with_nics(topo: &'a Topology, nics: bool) -> Self {
        let mut shown = BTreeSet::new();
        let mut gpu_index = BTreeMap::new();
        for (i, g) in topo.gpus().enumerate() {
            gpu_index.insert(g.bdf, i);
            shown.insert(g.bdf);
            shown.extend(topo.ancestors(&g.bdf).iter().map(|d| d.bdf));
        }
        let nic_devices = topo
            .devices
            .values()
            .filter(|d| nics && d.kind == DeviceKind::Nic);
        for n in nic_devices {
            shown.insert(n.bdf);
            shown.extend(topo.ancestors(&n.bdf).iter().map(|d| d.bdf));
        }
        let mut children: BTreeMap<(HostBridgeId, Option<Bdf>), Vec<&'a Device>> = BTreeMap::new();
        for d in shown.iter().filter_map(|b| topo.device(b)) {
            children
                .entry((d.host_bridge, d.parent))
                .or_default()
                .push(d);
        }
        GpuTree {
            topo,
            children,
            gpu_index,
            c2c: vfio_p2p_model::grace::c2c_gpus(topo),
        }
    }

    pub(crate) fn host_bridges(&self) -> impl Iterator<Item = &vfio_p2p_model::HostBridge> {
        self.topo
            .host_bridges
            .iter()
            .filter(|h| self.children(h.id, None).next().is_some())
    }

    pub(crate) fn children(
        &self,
        hb: HostBridgeId,
        parent: Option<Bdf>,
    ) -> impl Iterator<Item = &'a Device> + '_ {
        self.children
            .get(&(hb, parent))
            .into_iter()
            .flatten()
            .copied()
    }

    fn describe(&self, d: &Device) -> String {
        let mut s = format!("{}  ", d.bdf);
        if let Some(i) = self.gpu_index.get(&d.bdf) {
            let _ = write!(s, "GPU{i} [{:04x}:{:04x}]", d.vendor, d.device);
            match d.iommu_group {
                Some(g) => {
                    let _ = write!(s, "  group {g}");
                    let members = self.topo.group_members(&d.bdf).len();
                    if members > 1 {
                        let _ = write!(s, " ({members} devices)");
                    }
                }
                None => s.push_str("  no IOMMU group"),
            }
            let _ = write!(s, "  driver {}", d.driver.as_deref().unwrap_or("none"));
            if let Some(l) = link_text(&d.link) {
                let _ = write!(s, "  {l}");
            }
            let bar64 = d.bar64_total();
            if bar64 > 0 {
                let _ = write!(s, "  64-bit BARs {}", gib(bar64));
            }
            if let Some(c) = self.c2c.get(&d.bdf) {
                let memory = c.memory_node().map_or("N/A".into(), |n| n.to_string());
                let companions = crate::node_ranges::node_list(c.companions());
                let _ = write!(s, "  memory node {memory}, companion nodes {companions}");
            }
            if let Some(unit) = self.topo.iommu_units.get(&d.bdf) {
                let _ = write!(s, "  behind {unit}");
            }
        } else {
            let _ = write!(
                s,
                "{} [{:04x}:{:04x}]  {}",
                role_name(d),
                d.vendor,
                d.device,
                acs_text(d)
            );
            if let Some(l) = link_text(&d.link) {
                let _ = write!(s, "  {l}");
            }
        }
        s
    }

    /// Each device's line, its fields (two spaces apart) wrapped at `width` onto lines
    /// below it that keep the tree's lines going.
    fn render_below(
        &self,
        out: &mut String,
        at: (HostBridgeId, Option<Bdf>),
        prefix: &str,
        width: usize,
    ) {
        let kids: Vec<&Device> = self.children(at.0, at.1).collect();
        for (i, d) in kids.iter().enumerate() {
            let last = i + 1 == kids.len();
            let deeper = format!("{prefix}{}", if last { "   " } else { "│  " });
            let has_kids = self.children(at.0, Some(d.bdf)).next().is_some();
            let more = format!("{deeper}{}", if has_kids { "│  " } else { "   " });
            let first = format!("{prefix}{}", if last { "└─ " } else { "├─ " });
            wrap_fields(out, &self.describe(d), (&first, &more), width);
            self.render_below(out, (at.0, Some(d.bdf)), &deeper, width);
        }
    }
}

/// `text`'s fields (separated by two spaces) after `lead.0`, as many per line as fit in
/// `width` columns, the rest on lines after `lead.1`; a field wider than a line stays whole.
fn wrap_fields(out: &mut String, text: &str, lead: (&str, &str), width: usize) {
    let mut line = lead.0.to_string();
    let mut fresh = true;
    for field in text.split("  ") {
        let fits = line.chars().count() + 2 + field.chars().count() <= width;
        if !fresh && !fits {
            let _ = writeln!(out, "{line}");
            line = lead.1.to_string();
            fresh = true;
        }
        if !fresh {
            line.push_str("  ");
        }
        line.push_str(field);
        fresh = false;
    }
    let _ = writeln!(out, "{line}");
}

impl GpuTree<'_> {}

fn numa_text(n: Option<u32>) -> String {
    n.map_or("NUMA node unknown".into(), |n| format!("NUMA node {n}"))
}

/// The PCIe tree of the GPUs: host bridge → root port → switch ports → GPU.
pub fn render_tree(topo: &Topology) -> String {
    render_tree_at(topo, usize::from(vfio_p2p_style::output_width()))
}

fn render_tree_at(topo: &Topology, width: usize) -> String {
    let tree = GpuTree::new(topo);
    let mut out = String::new();
    for hb in tree.host_bridges() {
        let _ = writeln!(out, "{}  host bridge, {}", hb.id, numa_text(hb.numa_node));
        tree.render_below(&mut out, (hb.id, None), "", width);
    }
    out
}
