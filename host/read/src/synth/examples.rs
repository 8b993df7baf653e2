//! Topologies embedded in the binary, for `--example NAME`: what the tool shows on
//! a machine without GPUs, and the hosts the tests and benchmarks run on.

use super::{Attach, EndpointSpec, HostBuilder, ACS_ISOLATING};
use crate::flat_json;
use vfio_p2p_model::HostRecord;

/// (name, description) of every embedded example.
pub const EXAMPLES: &[(&str, &str)] = &[
    ("hgx-h100", "8× H100 SXM HGX board: 2 sockets, 4 PCIe switches (2 GPUs + 2 NICs each), 4 NVSwitches"),
    ("dual-socket-pcie", "dual-socket server, 8× L40S PCIe: per socket a top switch with two leaf switches of 2 GPUs"),
    ("lab", "the nested-VM lab's level A (tests/lab): a switch with 2 bochs-display stand-ins, one on its own root port, one behind a pxb-pcie host bridge on NUMA node 1"),
    ("gh200", "GH200 Grace Hopper superchip: an aarch64 Grace CPU and an H100 joined by NVLink-C2C, the GPU's memory a NUMA node of its own with 7 generic-initiator companions"),
    ("gb200", "GB200 compute tray: 2 aarch64 Grace CPUs and 4 Blackwell GPUs (NVLink-C2C to their CPU, NVLink-5 between them), 34 NUMA nodes, one SMMU per GPU"),
    ("altra-pcie", "Ampere Altra Max server (aarch64, one socket) with 4× H100 PCIe: 2 root complexes, each a PCIe switch with 2 GPUs"),
    ("flat-vm", "the real sysfs of a VM with 2 passed-through H200s on a flat root bus (no IOMMU), with its nvidia-smi capture: NV18 between them"),
];

/// `--example list`: one line per example, name and description.
pub fn example_list() -> String {
    let width = EXAMPLES.iter().map(|(n, _)| n.len()).max().unwrap_or(0);
    EXAMPLES
        .iter()
        .map(|(n, d)| format!("{n:<width$}  {d}\n"))
        .collect()
}

const H200X2_VM_SYSFS: &str = include_str!("../../../../tests/fixtures/sysfs/h200x2-vm-sysfs.json");
/// `nvidia-smi topo -m` (and the index → bus id map) captured in that VM.
const H200X2_VM_TOPO_M: &str =
    include_str!("../../../../tests/fixtures/nvidia-smi/h200x2-topo-m.txt");

/// The NVLink capture recorded with an example, and its name for messages.
pub fn example_nvlink_capture(name: &str) -> Option<(&'static str, &'static str)> {
    match name {
        "flat-vm" => Some((H200X2_VM_TOPO_M, "example flat-vm (h200x2-topo-m.txt)")),
        "gb200" => Some((super::grace::GB200_TOPO_M, "example gb200 (its NVLink-5)")),
        _ => None,
    }
}

/// The embedded example `name`, or an error listing the names.
pub fn example(name: &str) -> Result<HostRecord, String> {
    match name {
        "hgx-h100" => Ok(hgx_h100()),
        "dual-socket-pcie" => Ok(dual_socket_pcie()),
        "lab" => Ok(lab()),
        "gh200" => Ok(super::grace::gh200()),
        "gb200" => Ok(super::grace::gb200()),
        "altra-pcie" => Ok(super::arm_pcie::altra_pcie()),
        "flat-vm" => {
            let mut host =
                flat_json::parse(H200X2_VM_SYSFS, "example flat-vm (h200x2-vm-sysfs.json)")?;
            // The VM's CPU as NCCL 2.28.9 recorded it there (tests/fixtures/nccl/h200x2-nccl-dump.xml:
            // GenuineIntel, family 6, model 207, an Emerald Rapids Xeon).
            host.cpu = Some(super::x86_cpu("GenuineIntel", 6, 207));
            Ok(host)
        }
        _ => Err(format!(
            "no example named '{name}'; available: {}",
            EXAMPLES
                .iter()
                .map(|(n, _)| *n)
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

pub(crate) const H100_SXM: (u16, u16) = (0x10de, 0x2330);
const NVSWITCH_GEN3: (u16, u16) = (0x10de, 0x22a3);
const CX7: (u16, u16) = (0x15b3, 0x1021);
const L40S: (u16, u16) = (0x10de, 0x26b9);

fn hgx_h100() -> HostRecord {
    let mut b = HostBuilder::new("example hgx-h100");
    b.numa_node(0, "0-55,112-167")
        .numa_node(1, "56-111,168-223");
    // Sapphire Rapids Xeon (family 6, model 143), as on HGX H100 servers: 46 bits physical.
    b.x86_cpu("GenuineIntel", 6, 143).address_bits(46);
    b.kernel_cmdline("BOOT_IMAGE=/vmlinuz root=/dev/nvme0n1p2 intel_iommu=on iommu=pt");
    let nvsw_hb = b.host_bridge(0, 0x00);
    let rp = b.root_port(nvsw_hb, Some(0), Some(ACS_ISOLATING));
    let (_, dsps) = b.switch(rp, 4, Some(ACS_ISOLATING));
    let mut nvswitch = EndpointSpec::gpu(NVSWITCH_GEN3.0, NVSWITCH_GEN3.1, 0);
    nvswitch.class = 0x068000;
    nvswitch.bars = vec![(32 << 20, false)];
    nvswitch.link = (4, 2);
    nvswitch.driver = Some("nvidia-nvswitch".into());
    for d in dsps {
        b.endpoint(Attach::Below(d), 0, &nvswitch, None);
    }
    let mut rdma = 0;
    for (bus, numa) in [(0x15u8, 0u32), (0x37, 0), (0x9a, 1), (0xb8, 1)] {
        let hb = b.host_bridge(0, bus);
        let rp = b.root_port(hb, Some(numa), Some(ACS_ISOLATING));
        let (_, dsps) = b.switch(rp, 4, Some(ACS_ISOLATING));
        let gpu = EndpointSpec::gpu(H100_SXM.0, H100_SXM.1, 128);
        b.endpoint(Attach::Below(dsps[0]), 0, &gpu, None);
        b.endpoint(Attach::Below(dsps[1]), 0, &gpu, None);
        for port in [dsps[2], dsps[3]] {
            let nic = b.endpoint(
                Attach::Below(port),
                0,
                &EndpointSpec::nic(CX7.0, CX7.1),
                None,
            );
            // As mlx5 names them: the interface by its slot, RDMA devices in probe order.
            let net = format!("ibp{}s0", nic.bus);
            b.nic_names(nic, &net, &format!("mlx5_{rdma}"));
            rdma += 1;
        }
    }
    b.build()
}

fn dual_socket_pcie() -> HostRecord {
    let mut b = HostBuilder::new("example dual-socket-pcie");
    b.numa_node(0, "0-31,64-95").numa_node(1, "32-63,96-127");
    // EPYC Genoa (family 25, model 17): 52 bits physical (SME off; on, it says fewer).
    b.x86_cpu("AuthenticAMD", 25, 17).address_bits(52);
    b.kernel_cmdline("BOOT_IMAGE=/vmlinuz root=/dev/sda2 intel_iommu=on iommu=pt");
    for (bus, numa) in [(0x00u8, 0u32), (0x80, 1)] {
        let hb = b.host_bridge(0, bus);
        let rp = b.root_port(hb, Some(numa), Some(ACS_ISOLATING));
        // Depth first, as the kernel numbers buses: each top port's bus range holds its leaf.
        let top_usp = b.switch_upstream(rp);
        for _ in 0..2 {
            let leaf_port = b.downstream_port(top_usp, Some(ACS_ISOLATING));
            let (_, leaf) = b.switch(leaf_port, 2, Some(ACS_ISOLATING));
            let mut gpu = EndpointSpec::gpu(L40S.0, L40S.1, 64);
            gpu.link = (4, 16);
            gpu.msix_at_c8 = false;
            for d in leaf {
                b.endpoint(Attach::Below(d), 0, &gpu, None);
                let audio = EndpointSpec {
                    class: 0x040300,
                    bars: vec![(16 << 10, false)],
                    driver: Some("snd_hda_intel".into()),
                    ..gpu.clone()
                };
                b.endpoint(Attach::Below(d), 1, &audio, None);
            }
        }
        let nic_port = b.downstream_port(top_usp, Some(ACS_ISOLATING));
        let nic = b.endpoint(
            Attach::Below(nic_port),
            0,
            &EndpointSpec::nic(CX7.0, CX7.1),
            None,
        );
        b.nic_names(
            nic,
            &format!("ens{}f0np0", nic.bus),
            &format!("mlx5_{}", bus >> 7),
        );
    }
    b.build()
}

/// QEMU's emulated parts in tests/lab level A.
const QEMU_ROOT_PORT: (u16, u16) = (0x1b36, 0x000c);
const QEMU_SWITCH_UP: (u16, u16) = (0x104c, 0x8232);
const QEMU_SWITCH_DOWN: (u16, u16) = (0x104c, 0x8233);
/// bochs-display: the lab's GPU stand-in (display class 0x0380, any vendor counts as a GPU).
const BOCHS_DISPLAY: (u16, u16) = (0x1234, 0x1111);

/// tests/lab level A: `00:10.0` root port → switch → `03:00.0`, `04:00.0`; `00:11.0` root
/// port → `05:00.0`; pxb-pcie host bridge `pci0000:80` (NUMA node 1) → root port → `81:00.0`;
/// `edu` at `00:14.0`. pcie.0 has no NUMA node (`-1`), as in the lab.
fn lab() -> HostRecord {
    let mut b = HostBuilder::new("example lab");
    b.numa_node(0, "0").numa_node(1, "1");
    b.kernel_cmdline("console=ttyS0 intel_iommu=on kvm_amd.npt=0");
    let standin = EndpointSpec {
        vendor: BOCHS_DISPLAY.0,
        device: BOCHS_DISPLAY.1,
        class: 0x038000,
        bars: vec![(4 << 20, false), (4 << 10, false)],
        driver: Some("bochs-drm".into()),
        link: (1, 1),
        msix_at_c8: false,
        acs: None,
    };
    let hb0 = b.host_bridge(0, 0x00);
    let host_bridge = EndpointSpec {
        vendor: 0x8086,
        device: 0x29c0,
        class: 0x060000,
        bars: vec![],
        driver: None,
        ..standin.clone()
    };
    b.endpoint(Attach::HostBridge(hb0), 0, &host_bridge, None);
    let pxb = EndpointSpec {
        vendor: 0x1b36,
        device: 0x000b,
        ..host_bridge.clone()
    };
    b.endpoint(Attach::HostBridge(hb0), 0, &pxb, None);
    let root_port = |b: &mut HostBuilder, hb, numa| {
        b.bridge(
            Attach::HostBridge(hb),
            0x4,
            QEMU_ROOT_PORT.0,
            QEMU_ROOT_PORT.1,
            Some(ACS_ISOLATING),
            numa,
        )
    };
    b.next_slot(0, 0x00, 0x10);
    let rp1 = root_port(&mut b, hb0, None);
    let (up, down) = (QEMU_SWITCH_UP, QEMU_SWITCH_DOWN);
    let usp = b.bridge(Attach::Below(rp1), 0x5, up.0, up.1, None, None);
    for _ in 0..2 {
        let dsp = b.bridge(Attach::Below(usp), 0x6, down.0, down.1, None, None);
        b.endpoint(Attach::Below(dsp), 0, &standin, None);
    }
    let rp2 = root_port(&mut b, hb0, None);
    b.endpoint(Attach::Below(rp2), 0, &standin, None);
    b.next_slot(0, 0x00, 0x14);
    let edu = EndpointSpec {
        vendor: 0x1234,
        device: 0x11e8,
        class: 0x00ff00,
        bars: vec![(1 << 20, false)],
        driver: None,
        ..standin.clone()
    };
    b.endpoint(Attach::HostBridge(hb0), 0, &edu, None);
    let hb1 = b.host_bridge(0, 0x80);
    let rp3 = root_port(&mut b, hb1, Some(1));
    b.endpoint(Attach::Below(rp3), 0, &standin, None);
    b.build()
}

#[cfg(test)]
mod bus_range_tests {
    use std::collections::BTreeMap;

    use super::*;

    /// Every device's bus lies in each ancestor bridge's [secondary, subordinate], and
    /// the ranges of bridges on one bus do not overlap: the tree a kernel would number.
    #[test]
    fn every_example_has_real_bus_ranges() {
        for (name, _) in EXAMPLES {
            let host = example(name).unwrap();
            let range = |bdf: &pci_config::Bdf| -> Option<(u8, u8)> {
                let d = host.devices.iter().find(|d| d.bdf == *bdf)?;
                Some((*d.config.get(0x19)?, *d.config.get(0x1a)?))
            };
            for d in &host.devices {
                for a in &d.ancestors {
                    if let Some((sec, sub)) = range(a) {
                        assert!(
                            (sec..=sub).contains(&d.bdf.bus),
                            "{name}: {} outside {a}'s buses {sec:02x}..{sub:02x}",
                            d.bdf
                        );
                    }
                }
            }
            let mut by_bus: BTreeMap<(u16, u8), Vec<(u8, u8)>> = BTreeMap::new();
            for d in host.devices.iter().filter(|d| d.class >> 8 == 0x0604) {
                if let Some(r) = range(&d.bdf) {
                    by_bus.entry((d.bdf.domain, d.bdf.bus)).or_default().push(r);
                }
            }
            for ranges in by_bus.values_mut() {
                ranges.sort();
                for w in ranges.windows(2) {
                    assert!(w[0].1 < w[1].0, "{name}: bus ranges {w:?} overlap");
                }
            }
        }
    }
}
