//! `--example gh200` and `--example gb200`: NVIDIA Grace superchips, from public facts.
//!
//! GH200 (one Grace Hopper superchip):
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
//! - Each GPU owns 8 proximity domains, its memory node and 7 generic-initiator companions
//!   without CPUs or memory (the MIG slices): NVIDIA's `nvgrace-gpu` driver reads the range
//!   from the GPU's ACPI properties `nvidia,gpu-mem-pxm-start`/`-count`, and QEMU's
//!   documented Grace passthrough ties each GPU to 8 `acpi-generic-initiator` nodes
//!   (qemu-options.hx, `acpi-generic-initiator`; the accelerated SMMUv3 series' command
//!   lines on a Grace host). So a GH200 shows nodes 0–8.
//! - The BAR sizes are those of the H100 SXM in `hgx-h100` (16 MiB, 128 GiB, 32 MiB), not
//!   a GH200 capture's.
//!
//! GB200 (one compute tray of an NVL72 rack): 2 Grace CPUs and 4 Blackwell GPUs, two
//! superchips of 1 Grace + 2 B200 each (NVIDIA GB200 NVL72 product page), the GPUs joined to
//! each other by NVLink-5, 18 links per GPU (Blackwell architecture whitepaper); GPUs
//! `[10de:2941]` (pci.ids `GB100 [HGX GB200]`) each alone on its segment behind a 22b1 root
//! port. 2 CPU nodes + 4 × 8 GPU nodes = the tray's 34 NUMA nodes.
//!
//! Not from a capture, and said so: the segment numbers of the GB200 GPUs (8, 9, 0x18,
//! 0x19, after the GH200 above and the accelerated-SMMUv3 series' `0018:06:00.0`/
//! `0019:06:00.0`), the SMMU names (one SMMUv3 per GPU's root complex, as Grace has one per
//! PCIe segment), the 256 GiB BAR of a Blackwell GPU (a power of two above its 186 GB), and
//! the NUMA distances (10 local; 20 within a superchip; 40 across the two superchips of a
//! tray): no public `nodeN/distance` of these hosts was found.

use super::{Attach, EndpointSpec, HostBuilder, ACS_ISOLATING};
use vfio_p2p_model::HostRecord;

const GH200_GPU: (u16, u16) = (0x10de, 0x2342);
const GB200_GPU: (u16, u16) = (0x10de, 0x2941);
const GRACE_ROOT_PORT: (u16, u16) = (0x10de, 0x22b1);
/// NUMA nodes per Grace GPU: its memory node and 7 companions.
const NODES_PER_GPU: u32 = 8;
/// Huge page sizes of an arm64 kernel with 64 KiB pages (NVIDIA's recommended Grace
/// kernel): 2 MiB (contiguous PTEs), 512 MiB (a PMD), 16 GiB (contiguous PMDs).
const HUGEPAGES_64K_KERNEL: [u64; 3] = [2048, 524288, 16777216];

fn grace_cpu(b: &mut HostBuilder) {
    b.arm64_server().hugepage_sizes(&HUGEPAGES_64K_KERNEL);
}

/// A Grace GPU alone on PCI segment `segment`, behind a Grace root port, near CPU node `node`,
/// behind SMMU `smmu`.
fn grace_gpu(
    b: &mut HostBuilder,
    segment: u16,
    gpu: (u16, u16),
    vram_gib: u64,
    node: u32,
    smmu: &str,
) {
    let hb = b.host_bridge(segment, 0x00);
    let (vendor, device) = GRACE_ROOT_PORT;
    let rp = b.bridge(
        Attach::HostBridge(hb),
        0x4,
        vendor,
        device,
        Some(ACS_ISOLATING),
        Some(node),
    );
    let spec = EndpointSpec::gpu(gpu.0, gpu.1, vram_gib);
    let bdf = b.endpoint(Attach::Below(rp), 0, &spec, None);
    b.iommu_unit(bdf, smmu);
}

/// The superchip a node belongs to: CPU node `c` is superchip `c`; GPU nodes follow the CPU
/// nodes, `NODES_PER_GPU` per GPU, `gpus_per_cpu` GPUs per superchip.
fn superchip_of(node: u32, cpus: u32, gpus_per_cpu: u32) -> u32 {
    if node < cpus {
        node
    } else {
        (node - cpus) / NODES_PER_GPU / gpus_per_cpu
    }
}

fn distances(b: &mut HostBuilder, cpus: u32, gpus_per_cpu: u32) {
    b.numa_distances(|x, y| match x == y {
        true => 10,
        false if superchip_of(x, cpus, gpus_per_cpu) == superchip_of(y, cpus, gpus_per_cpu) => 20,
        false => 40,
    });
}

pub(super) fn gh200() -> HostRecord {
    let mut b = HostBuilder::new("example gh200");
    b.numa_node(0, "0-71");
    for n in 1..=NODES_PER_GPU {
        b.numa_node(n, "");
    }
    distances(&mut b, 1, 1);
    grace_cpu(&mut b);
    grace_gpu(&mut b, 9, GH200_GPU, 128, 0, "smmu3.0x0000000016000000");
    b.build()
}

pub(super) fn gb200() -> HostRecord {
    let mut b = HostBuilder::new("example gb200");
    b.numa_node(0, "0-71").numa_node(1, "72-143");
    for n in 2..2 + 4 * NODES_PER_GPU {
        b.numa_node(n, "");
    }
    distances(&mut b, 2, 2);
    grace_cpu(&mut b);
    let gpus = [
        (0x0008, 0, "smmu3.0x0000000011000000"),
        (0x0009, 0, "smmu3.0x0000000012000000"),
        (0x0018, 1, "smmu3.0x0000100011000000"),
        (0x0019, 1, "smmu3.0x0000100012000000"),
    ];
    for (segment, node, smmu) in gpus {
        grace_gpu(&mut b, segment, GB200_GPU, 256, node, smmu);
    }
    b.build()
}

/// `nvidia-smi topo -m` for the gb200 example, written for it from the tray's NVLink-5
/// (18 links between each pair of its GPUs), in the tool's own format.
pub(super) const GB200_TOPO_M: &str =
    "\tGPU0\tGPU1\tGPU2\tGPU3\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID
GPU0\t X \tNV18\tNV18\tNV18\t0-71\t0\t2
GPU1\tNV18\t X \tNV18\tNV18\t0-71\t0\t10
GPU2\tNV18\tNV18\t X \tNV18\t72-143\t1\t18
GPU3\tNV18\tNV18\tNV18\t X \t72-143\t1\t26

Legend:

  X    = Self
  NV#  = Connection traversing a bonded set of # NVLinks
index, pci.bus_id
0, 00000008:01:00.0
1, 00000009:01:00.0
2, 00000018:01:00.0
3, 00000019:01:00.0
";
