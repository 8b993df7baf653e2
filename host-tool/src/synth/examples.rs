//! Topologies embedded in the binary, for `--example NAME`: what the tool shows on
//! a machine without GPUs, and the hosts the tests and benchmarks run on.

use super::{Attach, EndpointSpec, HostBuilder, ACS_ISOLATING};
use crate::read::{flat_json, HostRecord};

/// (name, description) of every embedded example.
pub const EXAMPLES: &[(&str, &str)] = &[
    ("hgx-h100", "8× H100 SXM HGX board: 2 sockets, 4 PCIe switches (2 GPUs + 2 NICs each), 4 NVSwitches"),
    ("dual-socket-pcie", "dual-socket server, 8× L40S PCIe: per socket a top switch with two leaf switches of 2 GPUs"),
    ("flat-vm", "the real sysfs of a VM with 2 passed-through NVLink H200s on a flat root bus (no IOMMU)"),
];

const H200X2_VM_SYSFS: &str = include_str!("../../../tests/fixtures/sysfs/h200x2-vm-sysfs.json");

/// The embedded example `name`, or an error listing the names.
pub fn example(name: &str) -> Result<HostRecord, String> {
    match name {
        "hgx-h100" => Ok(hgx_h100()),
        "dual-socket-pcie" => Ok(dual_socket_pcie()),
        "flat-vm" => flat_json::parse(H200X2_VM_SYSFS, "example flat-vm (h200x2-vm-sysfs.json)"),
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
    for (bus, numa) in [(0x15u8, 0u32), (0x37, 0), (0x9a, 1), (0xb8, 1)] {
        let hb = b.host_bridge(0, bus);
        let rp = b.root_port(hb, Some(numa), Some(ACS_ISOLATING));
        let (_, dsps) = b.switch(rp, 4, Some(ACS_ISOLATING));
        let gpu = EndpointSpec::gpu(H100_SXM.0, H100_SXM.1, 128);
        b.endpoint(Attach::Below(dsps[0]), 0, &gpu, None);
        b.endpoint(Attach::Below(dsps[1]), 0, &gpu, None);
        b.endpoint(
            Attach::Below(dsps[2]),
            0,
            &EndpointSpec::nic(CX7.0, CX7.1),
            None,
        );
        b.endpoint(
            Attach::Below(dsps[3]),
            0,
            &EndpointSpec::nic(CX7.0, CX7.1),
            None,
        );
    }
    b.build()
}

fn dual_socket_pcie() -> HostRecord {
    let mut b = HostBuilder::new("example dual-socket-pcie");
    b.numa_node(0, "0-31,64-95").numa_node(1, "32-63,96-127");
    b.kernel_cmdline("BOOT_IMAGE=/vmlinuz root=/dev/sda2 amd_iommu=on iommu=pt");
    for (bus, numa) in [(0x00u8, 0u32), (0x80, 1)] {
        let hb = b.host_bridge(0, bus);
        let rp = b.root_port(hb, Some(numa), Some(ACS_ISOLATING));
        let (_, top) = b.switch(rp, 3, Some(ACS_ISOLATING));
        for leaf_port in &top[..2] {
            let (_, leaf) = b.switch(*leaf_port, 2, Some(ACS_ISOLATING));
            let mut gpu = EndpointSpec::gpu(L40S.0, L40S.1, 64);
            gpu.link = (4, 16);
            gpu.msix_at_c8 = false;
            for d in leaf {
                let g = b.endpoint(Attach::Below(d), 0, &gpu, None);
                let audio = EndpointSpec {
                    class: 0x040300,
                    bars: vec![(16 << 10, false)],
                    driver: Some("snd_hda_intel".into()),
                    ..gpu.clone()
                };
                b.endpoint(Attach::Below(d), 1, &audio, None);
                let _ = g;
            }
        }
        b.endpoint(
            Attach::Below(top[2]),
            0,
            &EndpointSpec::nic(CX7.0, CX7.1),
            None,
        );
    }
    b.build()
}
