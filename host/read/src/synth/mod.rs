//! Synthetic hosts: a compact way to describe a PCIe tree and get the
//! [`HostRecord`] the sysfs reader would have produced for it, with correct config
//! headers, PCIe/ACS capabilities and Linux's IOMMU grouping.
//!
//! Used for the embedded `--example` topologies, test fixtures and benchmarks.

mod arm_pcie;
mod examples;
mod fabric_tables;
mod grace;
pub mod tree;

use std::collections::BTreeMap;

use pci_config::{AcsFlags, Bdf};

use vfio_p2p_model::DeviceRecord;
use vfio_p2p_model::HostBridgeId;
use vfio_p2p_model::HostRecord;
use vfio_p2p_model::Resource;

pub use examples::{example, example_list, example_nvlink_capture, EXAMPLES};
pub use fabric_tables::example_fabric;

/// ACS control bits Linux requires for isolation (`REQ_ACS_FLAGS`): SV RR CR UF.
pub const ACS_ISOLATING: u16 = AcsFlags::SV | AcsFlags::RR | AcsFlags::CR | AcsFlags::UF;

/// What to put in an endpoint.
#[derive(Debug, Clone)]
pub struct EndpointSpec {
    pub vendor: u16,
    pub device: u16,
    pub class: u32,
    /// (size, 64-bit prefetchable?) per BAR, in BAR order.
    pub bars: Vec<(u64, bool)>,
    pub driver: Option<String>,
    /// Link (GT/s generation 1..=6, width).
    pub link: (u8, u8),
    /// Put an MSI-X capability at 0xC8 (Turing+/A100-like layout).
    pub msix_at_c8: bool,
    /// Put an ACS capability with these control bits on the endpoint (multi-function isolation).
    pub acs: Option<u16>,
}

impl EndpointSpec {
    pub fn gpu(vendor: u16, device: u16, vram_gib: u64) -> Self {
        EndpointSpec {
            vendor,
            device,
            class: 0x030200,
            bars: vec![(16 << 20, false), (vram_gib << 30, true), (32 << 20, true)],
            driver: Some("nvidia".into()),
            link: (5, 16),
            msix_at_c8: false,
            acs: None,
        }
    }
    pub fn nic(vendor: u16, device: u16) -> Self {
        EndpointSpec {
            vendor,
            device,
            class: 0x020000,
            bars: vec![(32 << 20, true)],
            driver: Some("mlx5_core".into()),
            link: (5, 16),
            msix_at_c8: false,
            acs: None,
        }
    }
    pub fn with_driver(mut self, d: Option<&str>) -> Self {
        self.driver = d.map(str::to_string);
        self
    }
}

/// An x86-64 CPU as `/proc/cpuinfo` prints it (`cpu family`, `model`).
pub fn x86_cpu(vendor: &str, family: u32, model: u32) -> vfio_p2p_model::CpuIdentity {
    vfio_p2p_model::CpuIdentity {
        arch: vfio_p2p_model::CpuArch::X86_64,
        vendor: Some(vendor.to_string()),
        family: Some(family),
        model: Some(model),
        phys_bits: None,
    }
}

/// Builds a [`HostRecord`] one bridge and endpoint at a time.
#[derive(Debug)]
pub struct HostBuilder {
    host: HostRecord,
    acs_ctl: BTreeMap<Bdf, Option<u16>>,
    next_bus: BTreeMap<HostBridgeId, u16>,
    next_slot: BTreeMap<(u16, u8), u8>,
}

/// Where a new device goes: a host bridge's root bus, or below a bridge.
#[derive(Debug, Clone, Copy)]
pub enum Attach {
    HostBridge(HostBridgeId),
    Below(Bdf),
}

impl HostBuilder {
    pub fn new(source: &str) -> Self {
        HostBuilder {
            host: HostRecord {
                source: source.to_string(),
                ..Default::default()
            },
            acs_ctl: BTreeMap::new(),
            next_bus: BTreeMap::new(),
            next_slot: BTreeMap::new(),
        }
    }

    /// The names host drivers give the network function `bdf`.
    pub fn nic_names(&mut self, bdf: Bdf, net: &str, rdma: &str) -> &mut Self {
        let names = vfio_p2p_model::record::NicNames {
            net: vec![net.to_string()],
            rdma: vec![rdma.to_string()],
        };
        self.host.nic_names.insert(bdf, names);
        self
    }

    pub fn numa_node(&mut self, id: u32, cpulist: &str) -> &mut Self {
        self.host.numa_nodes.insert(id, cpulist.to_string());
        self
    }

    /// The NUMA distance rows (`nodeN/distance`) of the nodes given so far, from `distance(a, b)`.
    pub fn numa_distances(&mut self, distance: impl Fn(u32, u32) -> u32) -> &mut Self {
        let nodes: Vec<u32> = self.host.numa_nodes.keys().copied().collect();
        for a in &nodes {
            let row = nodes.iter().map(|b| distance(*a, *b)).collect();
            self.host.numa_distances.insert(*a, row);
        }
        self
    }

    /// The IOMMU unit `bdf` sits behind (the name its `iommu` link points at).
    pub fn iommu_unit(&mut self, bdf: Bdf, unit: &str) -> &mut Self {
        self.host.iommu_units.insert(bdf, unit.to_string());
        self
    }

    /// The huge page sizes the kernel offers, KiB.
    pub fn hugepage_sizes(&mut self, kib: &[u64]) -> &mut Self {
        self.host.hugepage_sizes_kib = kib.to_vec();
        self
    }

    /// An x86-64 CPU as `/proc/cpuinfo` prints it.
    pub fn x86_cpu(&mut self, vendor: &str, family: u32, model: u32) -> &mut Self {
        self.host.cpu = Some(x86_cpu(vendor, family, model));
        self
    }

    /// The CPU's physical address width (`address sizes : N bits physical`).
    pub fn address_bits(&mut self, bits: u8) -> &mut Self {
        if let Some(c) = self.host.cpu.as_mut() {
            c.phys_bits = Some(bits);
        }
        self
    }

    /// The CPU as `/proc/cpuinfo` describes it (an arm64 host's, which names no vendor).
    pub fn cpu(&mut self, cpu: vfio_p2p_model::CpuIdentity) -> &mut Self {
        self.host.cpu = Some(cpu);
        self
    }

    pub fn kernel_cmdline(&mut self, c: &str) -> &mut Self {
        self.host.kernel_cmdline = Some(c.to_string());
        self
    }

    /// An arm64 server's CPU (`/proc/cpuinfo` on arm64 names no vendor, family or model)
    /// booted with the IOMMU in passthrough for the host's own devices, as the Arm examples
    /// (Grace, Altra) are.
    pub fn arm64_server(&mut self) -> &mut Self {
        self.cpu(vfio_p2p_model::CpuIdentity {
            arch: vfio_p2p_model::CpuArch::Arm64,
            vendor: None,
            family: None,
            model: None,
            phys_bits: None,
        });
        self.kernel_cmdline("BOOT_IMAGE=/vmlinuz root=/dev/nvme0n1p2 iommu.passthrough=1")
    }

    /// A host bridge whose root bus is `bus`; buses below it are numbered from `bus + 1`.
    pub fn host_bridge(&mut self, domain: u16, bus: u8) -> HostBridgeId {
        let id = HostBridgeId { domain, bus };
        self.next_bus.entry(id).or_insert(bus as u16 + 1);
        id
    }

    /// The next device added to bus `bus` of `domain` gets device number `device`
    /// (to mirror a real or QEMU layout with fixed addresses).
    pub fn next_slot(&mut self, domain: u16, bus: u8, device: u8) -> &mut Self {
        self.next_slot.insert((domain, bus), device);
        self
    }

    fn record(&self, bdf: &Bdf) -> &DeviceRecord {
        self.host
            .devices
            .iter()
            .find(|d| d.bdf == *bdf)
            .expect("attach point was built by this builder")
    }

    /// The next free BDF at an attach point (and the new record's host bridge and ancestors).
    fn place(&mut self, at: Attach, function: u8) -> (Bdf, HostBridgeId, Vec<Bdf>, Option<u32>) {
        let (hb, bus, ancestors, numa) = match at {
            Attach::HostBridge(hb) => (hb, hb.bus, vec![], None),
            Attach::Below(bridge) => {
                let r = self.record(&bridge);
                let mut anc = r.ancestors.clone();
                anc.push(bridge);
                (r.host_bridge, r.config[0x19], anc, r.numa_node)
            }
        };
        let slot = self.next_slot.entry((hb.domain, bus)).or_insert(0);
        let dev = *slot;
        if function == 0 {
            *slot += 1;
        }
        let dev = if function == 0 {
            dev
        } else {
            dev.saturating_sub(1)
        };
        (Bdf::new(hb.domain, bus, dev, function), hb, ancestors, numa)
    }

    fn push(&mut self, r: DeviceRecord, acs: Option<u16>) -> Bdf {
        let bdf = r.bdf;
        self.acs_ctl.insert(bdf, acs);
        self.host.devices.push(r);
        bdf
    }

    /// A bridge of the given PCIe port type with ACS control `acs` (None: no ACS capability).
    pub fn bridge(
        &mut self,
        at: Attach,
        port_type: u8,
        vendor: u16,
        device: u16,
        acs: Option<u16>,
        numa: Option<u32>,
    ) -> Bdf {
        let (bdf, hb, ancestors, parent_numa) = self.place(at, 0);
        let sec = {
            let nb = self.next_bus.entry(hb).or_insert(hb.bus as u16 + 1);
            let s = *nb;
            *nb += 1;
            u8::try_from(s).expect("synthetic host ran out of bus numbers")
        };
        let config = config_space(
            vendor,
            device,
            0x060400,
            1,
            port_type,
            (5, 16),
            false,
            acs,
            Some((bdf.bus, sec)),
        );
        let r = DeviceRecord {
            bdf,
            host_bridge: hb,
            ancestors,
            vendor,
            device,
            class: 0x060400,
            // Bridges without an SSVID capability show 0 (drivers/pci/probe.c).
            subsystem_vendor: Some(0),
            subsystem_device: Some(0),
            config,
            numa_node: numa.or(parent_numa),
            local_cpulist: None,
            iommu_group: None,
            driver: Some("pcieport".into()),
            driver_override: None,
            resources: vec![],
            current_link_speed: Some(speed_text(5)),
            current_link_width: Some(16),
            max_link_speed: Some(speed_text(5)),
            max_link_width: Some(16),
            reset_method: None,
        };
        self.push(r, acs)
    }

    pub fn root_port(&mut self, hb: HostBridgeId, numa: Option<u32>, acs: Option<u16>) -> Bdf {
        self.bridge(Attach::HostBridge(hb), 0x4, 0x8086, 0x347a, acs, numa)
    }

    /// A PCIe switch below `port`: its upstream port and `downstream` downstream ports.
    /// Their buses are numbered now: to nest switches with bus ranges a kernel would give
    /// (depth first), add the downstream ports one by one with [`Self::downstream_port`].
    pub fn switch(&mut self, port: Bdf, downstream: usize, acs: Option<u16>) -> (Bdf, Vec<Bdf>) {
        let usp = self.switch_upstream(port);
        let dsps = (0..downstream)
            .map(|_| self.downstream_port(usp, acs))
            .collect();
        (usp, dsps)
    }

    /// A switch's upstream port below `port`, without downstream ports yet.
    pub fn switch_upstream(&mut self, port: Bdf) -> Bdf {
        self.bridge(Attach::Below(port), 0x5, 0x1000, 0xc030, None, None)
    }

    /// One more downstream port of the switch whose upstream port is `usp`.
    pub fn downstream_port(&mut self, usp: Bdf, acs: Option<u16>) -> Bdf {
        self.bridge(Attach::Below(usp), 0x6, 0x1000, 0xc030, acs, None)
    }

    /// An endpoint (function `function` of the next slot, or of the last slot if > 0).
    pub fn endpoint(
        &mut self,
        at: Attach,
        function: u8,
        spec: &EndpointSpec,
        numa: Option<u32>,
    ) -> Bdf {
        let (bdf, hb, ancestors, parent_numa) = self.place(at, function);
        let port_type = if ancestors.is_empty() { 0x9 } else { 0x0 };
        let (subsystem_vendor, subsystem_device) = (spec.vendor, 0x16c1u16);
        let mut config = config_space(
            spec.vendor,
            spec.device,
            spec.class,
            0,
            port_type,
            spec.link,
            spec.msix_at_c8,
            spec.acs,
            None,
        );
        config[0x2c..0x2e].copy_from_slice(&subsystem_vendor.to_le_bytes());
        config[0x2e..0x30].copy_from_slice(&subsystem_device.to_le_bytes());
        let mut resources = Vec::new();
        let mut addr: u64 = 0x3800_0000_0000 + ((bdf.bus as u64) << 36);
        for &(size, is64) in &spec.bars {
            let flags = if is64 {
                Resource::MEM64_PREFETCH
            } else {
                Resource::MEM32
            };
            resources.push(Resource {
                start: addr,
                end: addr + size - 1,
                flags,
            });
            addr += size.next_power_of_two();
            if is64 {
                resources.push(Resource {
                    start: 0,
                    end: 0,
                    flags: 0,
                });
            }
        }
        let numa_node = numa.or(parent_numa);
        let r = DeviceRecord {
            bdf,
            host_bridge: hb,
            ancestors,
            vendor: spec.vendor,
            device: spec.device,
            class: spec.class,
            subsystem_vendor: Some(subsystem_vendor),
            subsystem_device: Some(subsystem_device),
            config,
            numa_node,
            local_cpulist: numa_node.and_then(|n| self.host.numa_nodes.get(&n).cloned()),
            iommu_group: None,
            driver: spec.driver.clone(),
            driver_override: None,
            resources,
            current_link_speed: Some(speed_text(spec.link.0)),
            current_link_width: Some(spec.link.1),
            max_link_speed: Some(speed_text(spec.link.0)),
            max_link_width: Some(spec.link.1),
            reset_method: Some(vec!["flr".into(), "bus".into()]),
        };
        self.push(r, spec.acs)
    }

    /// Function 0 of every slot that has more than one function.
    fn multifunction_slots(&self) -> Vec<Bdf> {
        let mut slots: Vec<Bdf> = self
            .host
            .devices
            .iter()
            .filter(|d| d.bdf.function > 0)
            .map(|d| d.bdf.with_function(0))
            .collect();
        slots.dedup();
        slots
    }

    /// Marks function 0 of a slot as multi-function (call after adding function 1+).
    fn fix_multifunction(&mut self) {
        let slots = self.multifunction_slots();
        for d in &mut self.host.devices {
            if slots.contains(&d.bdf.with_function(0)) && d.config.len() > 0x0e {
                d.config[0x0e] |= 0x80;
            }
        }
    }

    /// Linux's grouping (drivers/iommu/iommu.c `pci_device_group`): a device joins the
    /// group of the first bridge above it whose path to the root lacks ACS isolation;
    /// functions of a multi-function device without ACS share one group.
    fn assign_iommu_groups(&mut self) {
        let by_bdf: BTreeMap<Bdf, (Option<Bdf>, u8)> = self
            .host
            .devices
            .iter()
            .map(|d| {
                (
                    d.bdf,
                    (
                        d.ancestors.last().copied(),
                        d.config.get(0x42).map(|v| (v >> 4) & 0xf).unwrap_or(0),
                    ),
                )
            })
            .collect();
        let multifunction = self.multifunction_slots();
        let acs_enabled = |b: &Bdf| -> bool {
            let port_type = by_bdf.get(b).map(|x| x.1).unwrap_or(0);
            let ctl = self.acs_ctl.get(b).copied().flatten();
            let isolating = ctl.is_some_and(|c| c & ACS_ISOLATING == ACS_ISOLATING);
            match port_type {
                0x4 | 0x6 => isolating,
                _ if multifunction.contains(&b.with_function(0)) => isolating,
                _ => true,
            }
        };
        let path_enabled = |mut b: Bdf| -> bool {
            loop {
                if !acs_enabled(&b) {
                    return false;
                }
                match by_bdf.get(&b).and_then(|x| x.0) {
                    Some(p) => b = p,
                    None => return true,
                }
            }
        };
        let mut representative: BTreeMap<Bdf, Bdf> = BTreeMap::new();
        for &bdf in by_bdf.keys() {
            let mut cur = bdf;
            if multifunction.contains(&cur.with_function(0)) && !acs_enabled(&cur) {
                cur = cur.with_function(0);
            }
            while let Some(parent) = by_bdf.get(&cur).and_then(|x| x.0) {
                if path_enabled(parent) {
                    break;
                }
                cur = parent;
            }
            representative.insert(bdf, cur);
        }
        let mut ids: BTreeMap<Bdf, u32> = BTreeMap::new();
        for rep in representative.values() {
            let n = ids.len() as u32;
            ids.entry(*rep).or_insert(n);
        }
        for d in &mut self.host.devices {
            d.iommu_group = Some(ids[&representative[&d.bdf]]);
        }
    }

    pub fn build(mut self) -> HostRecord {
        self.fix_multifunction();
        self.fix_subordinate_buses();
        self.host.devices.sort_by_key(|d| d.bdf);
        self.assign_iommu_groups();
        self.host
    }
}

impl HostBuilder {
    /// Each bridge's subordinate bus (config 0x1a): the highest bus below it, as the kernel
    /// programs it, so nested switches have real bus ranges.
    fn fix_subordinate_buses(&mut self) {
        let mut highest: BTreeMap<Bdf, u8> = BTreeMap::new();
        for d in &self.host.devices {
            for a in &d.ancestors {
                let h = highest.entry(*a).or_insert(0);
                *h = (*h).max(d.bdf.bus);
            }
        }
        for d in &mut self.host.devices {
            if let (Some(h), Some(sub)) = (highest.get(&d.bdf), d.config.get_mut(0x1a)) {
                *sub = (*sub).max(*h);
            }
        }
    }
}

fn speed_text(gen: u8) -> String {
    crate::attr::link_speed_text(gen.clamp(1, 6)).unwrap_or_default()
}

/// A 4 KiB config space with a PCIe capability at 0x40, optional MSI-X at 0xC8
/// (linked after PCIe), and an ACS extended capability at 0x148 behind AER at 0x100.
#[allow(clippy::too_many_arguments)]
fn config_space(
    vendor: u16,
    device: u16,
    class: u32,
    header: u8,
    port_type: u8,
    link: (u8, u8),
    msix_at_c8: bool,
    acs_ctl: Option<u16>,
    buses: Option<(u8, u8)>,
) -> Vec<u8> {
    let mut c = vec![0u8; pci_config::CONFIG_SPACE_EXTENDED];
    c[0..2].copy_from_slice(&vendor.to_le_bytes());
    c[2..4].copy_from_slice(&device.to_le_bytes());
    c[0x06] = 0x10;
    c[0x08..0x0c].copy_from_slice(&(class << 8).to_le_bytes());
    c[0x0e] = header;
    c[0x34] = 0x40;
    if let Some((primary, secondary)) = buses {
        c[0x18] = primary;
        c[0x19] = secondary;
        c[0x1a] = secondary;
    }
    c[0x40] = pci_config::CAP_ID_PCIE;
    c[0x41] = if msix_at_c8 { 0xc8 } else { 0 };
    c[0x42] = 0x02 | (port_type << 4);
    let link_cap = u32::from(link.0) | (u32::from(link.1) << 4);
    c[0x4c..0x50].copy_from_slice(&link_cap.to_le_bytes());
    c[0x52..0x54].copy_from_slice(&(link_cap as u16).to_le_bytes());
    if msix_at_c8 {
        c[0xc8] = pci_config::CAP_ID_MSIX;
        c[0xc9] = 0;
    }
    let aer = u32::from(pci_config::EXT_CAP_ID_AER) | (1 << 16);
    if let Some(ctl) = acs_ctl {
        c[0x100..0x104].copy_from_slice(&(aer | (0x148 << 20)).to_le_bytes());
        let acs = u32::from(pci_config::EXT_CAP_ID_ACS) | (1 << 16);
        c[0x148..0x14c].copy_from_slice(&acs.to_le_bytes());
        c[0x14c..0x14e].copy_from_slice(&0x005fu16.to_le_bytes());
        c[0x14e..0x150].copy_from_slice(&ctl.to_le_bytes());
    } else {
        c[0x100..0x104].copy_from_slice(&aer.to_le_bytes());
    }
    c
}
