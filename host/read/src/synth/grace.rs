//! `--example gh200`: one NVIDIA GH200 Grace Hopper superchip, from public facts.
//!
//! - The Grace CPU: 72 Arm Neoverse V2 cores, aarch64 (NVIDIA Grace CPU Superchip
//!   datasheet; `/proc/cpuinfo` names no vendor on arm64), its LPDDR5X memory NUMA node 0.
//! - The GPU: `0009:01:00.0 3D controller [0302]: NVIDIA Corporation GH100 [GH200 480GB]
//!   [10de:2342]` as `lspci -nn` prints it on a GH200 (a public test fixture of such a host's
//!   lspci; pci.ids names 2342 `GH100 [GH200 120GB / 480GB]`), alone on PCI segment 9
//!   behind a Grace root port at `0009:00:00.0` (10de:22b1, as a GB200 host's lspci lists
//!   its Grace root ports: `0018:00:00.0 PCI bridge [0604]: NVIDIA Corporation Device
//!   [10de:22b1]`).
//! - CPU and GPU are joined by NVLink-C2C (900 GB/s, NVIDIA GH200 product page and the
//!   Grace Hopper Superchip Architecture whitepaper); the GPU's HBM is onlined as a NUMA
//!   node without CPUs, node 1 (hwloc 2.10's change "don't hide the NVIDIA GPU node on
//!   non-POWER platforms": "a single CPU node and 1 single GPU node per GPU slice").
//! - The BAR sizes are those of the H100 SXM in `hgx-h100` (16 MiB, 128 GiB, 32 MiB), not
//!   a GH200 capture's.

use super::{Attach, EndpointSpec, HostBuilder, ACS_ISOLATING};
use vfio_p2p_model::{CpuArch, CpuIdentity, HostRecord};

const GH200_GPU: (u16, u16) = (0x10de, 0x2342);
const GRACE_ROOT_PORT: (u16, u16) = (0x10de, 0x22b1);

pub(super) fn gh200() -> HostRecord {
    let mut b = HostBuilder::new("example gh200");
    b.numa_node(0, "0-71").numa_node(1, "");
    b.cpu(CpuIdentity {
        arch: CpuArch::Arm64,
        vendor: None,
        family: None,
        model: None,
        phys_bits: None,
    });
    b.kernel_cmdline("BOOT_IMAGE=/vmlinuz root=/dev/nvme0n1p2 iommu.passthrough=1");
    let hb = b.host_bridge(9, 0x00);
    let (vendor, device) = GRACE_ROOT_PORT;
    let rp = b.bridge(
        Attach::HostBridge(hb),
        0x4,
        vendor,
        device,
        Some(ACS_ISOLATING),
        Some(0),
    );
    let gpu = EndpointSpec::gpu(GH200_GPU.0, GH200_GPU.1, 128);
    b.endpoint(Attach::Below(rp), 0, &gpu, None);
    b.build()
}
