//! Grace superchips (GH200, GB200, GB300): each GPU is joined to its Grace CPU by
//! NVLink-C2C, and its memory is onlined as NUMA nodes of its own, without CPUs.
//!
//! PCI sysfs says neither: the C2C link follows from the part (an aarch64 host and a GPU
//! device ID of a superchip, [`nvidia_parts::c2c_superchip`]), the GPU memory nodes from
//! `sys/devices/system/node` (nodes with an empty CPU list). The firmware hands each GPU a
//! contiguous range of proximity domains, in PCI order (NVIDIA's `nvgrace-gpu` driver
//! reads the range from the GPU's ACPI properties `nvidia,gpu-mem-pxm-start`/`-count`), so
//! the memory-only nodes are shared out in that order, as `nvidia-smi topo -m` prints the
//! first of them as the GPU's "GPU NUMA ID".

use std::collections::BTreeMap;

use pci_config::Bdf;

use crate::Topology;
use vfio_p2p_contract::nvidia_parts;

/// A GPU with an NVLink-C2C link to its CPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct C2cGpu {
    /// The superchip's name (`GH200`, `GB200`, `GB300`).
    pub superchip: &'static str,
    /// The NUMA nodes of its memory (empty when the host shows none): the memory node
    /// (nvidia-smi's "GPU NUMA ID") first, then its generic-initiator companions.
    pub memory_nodes: Vec<u32>,
}

impl C2cGpu {
    /// The node the GPU's memory is onlined into.
    pub fn memory_node(&self) -> Option<u32> {
        self.memory_nodes.first().copied()
    }

    /// The CPU-less, memory-less nodes that come with it (MIG slices).
    pub fn companions(&self) -> &[u32] {
        self.memory_nodes.get(1..).unwrap_or(&[])
    }
}

/// The host's C2C-attached GPUs, by BDF; empty on a host that is not aarch64.
pub fn c2c_gpus(topo: &Topology) -> BTreeMap<Bdf, C2cGpu> {
    if !topo.is_arm64() {
        return BTreeMap::new();
    }
    let gpus: Vec<(Bdf, &'static str)> = topo
        .gpus()
        .filter(|g| g.is_nvidia_gpu())
        .filter_map(|g| nvidia_parts::c2c_superchip(g.device).map(|s| (g.bdf, s)))
        .collect();
    let memory_only: Vec<u32> = topo
        .numa_nodes
        .iter()
        .filter(|(_, cpus)| cpus.trim().is_empty())
        .map(|(id, _)| *id)
        .collect();
    // Only an even share is certain; otherwise no GPU is given nodes it may not own.
    let share = match gpus.len() {
        0 => 0,
        n if memory_only.len().is_multiple_of(n) => memory_only.len() / n,
        _ => 0,
    };
    gpus.iter()
        .enumerate()
        .map(|(i, (bdf, superchip))| {
            let memory_nodes = memory_only.iter().skip(i * share).take(share).copied();
            (
                *bdf,
                C2cGpu {
                    superchip,
                    memory_nodes: memory_nodes.collect(),
                },
            )
        })
        .collect()
}
