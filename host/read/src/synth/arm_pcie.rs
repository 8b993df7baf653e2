//! `--example altra-pcie`: an aarch64 server whose GPUs are plain PCIe cards, from public
//! facts.
//!
//! - The CPU: an Ampere Altra Max (M128-30), 128 Arm Neoverse N1 cores, aarch64, one
//!   socket, one NUMA node in its default (monolithic) mode; `/proc/cpuinfo` on arm64
//!   names no vendor.
//! - Its PCIe root ports: `[1def:e101]` "Altra PCI Express Root Port a0" and `[1def:e111]`
//!   "Altra PCI Express Root Port b0" (pci.ids, Ampere Computing), one per root complex,
//!   each root complex a PCI segment of its own.
//! - Below each root port a Broadcom PEX890xx switch (`[1000:c030]`, as in `hgx-h100`)
//!   with 2 GPUs, `[10de:2331]` (pci.ids `GH100 [H100 PCIe]`).
//!
//! Not from a capture, and said so: the segment numbers (0x000c, 0x000d), the BAR sizes
//! (those of the H100 SXM in `hgx-h100`: 16 MiB, 128 GiB, 32 MiB) and the NUMA layout.

use super::{Attach, EndpointSpec, HostBuilder, ACS_ISOLATING};
use vfio_p2p_model::HostRecord;

const H100_PCIE: (u16, u16) = (0x10de, 0x2331);
const ALTRA_ROOT_PORTS: [(u16, u16, u16); 2] = [(0x000c, 0x1def, 0xe101), (0x000d, 0x1def, 0xe111)];

pub(super) fn altra_pcie() -> HostRecord {
    let mut b = HostBuilder::new("example altra-pcie");
    b.numa_node(0, "0-127");
    b.arm64_server();
    for (segment, vendor, device) in ALTRA_ROOT_PORTS {
        let hb = b.host_bridge(segment, 0x00);
        let rp = b.bridge(
            Attach::HostBridge(hb),
            0x4,
            vendor,
            device,
            Some(ACS_ISOLATING),
            Some(0),
        );
        let (_, dsps) = b.switch(rp, 2, Some(ACS_ISOLATING));
        let mut gpu = EndpointSpec::gpu(H100_PCIE.0, H100_PCIE.1, 128);
        // Altra Max is PCIe Gen 4: the Gen 5 card trains at 16 GT/s
        gpu.link = (4, 16);
        for d in dsps {
            b.endpoint(Attach::Below(d), 0, &gpu, None);
        }
    }
    b.build()
}
