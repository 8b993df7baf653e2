//! The guest's NUMA nodes against the host's plan where GPU memory is a NUMA node (Grace, #38).
//!
//! The host gives each GPU a memory node and its companions, tied to the GPU by ACPI
//! generic-initiator affinity structures (SRAT), each without CPUs and without memory
//! until the guest driver onlines the GPU memory. What Linux shows of that, all under
//! `sys/devices/system/node/` (drivers/base/node.c):
//! - `nodeN/` for every online node, with `cpulist`, `meminfo` (`Node N MemTotal: … kB`)
//!   and `distance` (the SLIT row);
//! - `has_generic_initiator`, the nodes SRAT gave a generic initiator
//!   (`N_GENERIC_INITIATOR`, set by drivers/acpi/numa/srat.c `acpi_parse_gi_affinity`;
//!   Linux ≥ 5.10 on x86 and arm64).
//!
//! Which PCI device a generic initiator names is in no sysfs file: the kernel reads the
//! SRAT's device handle (segment and BDF) only to log the entry at boot, so the agent checks
//! the node side (each GPU's nodes are generic-initiator nodes) and the device side (the
//! GPU is at its guest address) separately, as `expect` already does for the latter.

use serde::{Deserialize, Serialize};
use vfio_p2p_contract::{ExpectedGpu, ExpectedNuma};

use crate::sysfs::numa::NumaScan;

/// The NUMA check of `expect`: what was planned, what was found, what differs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NumaReport {
    pub planned_nodes: u32,
    pub found: NumaScan,
    /// What differs from the plan, one sentence each naming the GPU where a GPU's node
    /// is concerned (empty: as planned).
    pub problems: Vec<String>,
}

impl NumaReport {
    pub fn mismatches(&self) -> usize {
        self.problems.len()
    }
}

/// The GPU a guest node belongs to, in words (`GPU 0009:01:00.0 (host 0009:01:00.0)`).
fn owner(gpus: &[ExpectedGpu], node: u32) -> Option<String> {
    gpus.iter()
        .find(|g| g.numa_nodes.contains(&node))
        .map(|g| format!("GPU {} (host {})", g.guest_bdf, g.host_bdf))
}

/// Judges `found` against the plan: the node count, each GPU's nodes present, without
/// CPUs, without memory and with a generic initiator, and every node's distances.
pub fn judge(plan: &ExpectedNuma, gpus: &[ExpectedGpu], found: NumaScan) -> NumaReport {
    let mut problems = Vec::new();
    let ids: Vec<u32> = found.nodes.iter().map(|n| n.id).collect();
    if ids != (0..plan.nodes).collect::<Vec<_>>() {
        problems.push(format!(
            "the guest has NUMA nodes {ids:?}, planned 0..{} ({} nodes): start the VM with \
             the arguments `vfio-p2p gen` wrote, on a guest kernel that takes {} nodes \
             (CONFIG_NODES_SHIFT; Debian's arm64 kernel takes 16, and drops SRAT past that)",
            plan.nodes, plan.nodes, plan.nodes
        ));
    }
    for g in gpus {
        let who = format!("GPU {} (host {})", g.guest_bdf, g.host_bdf);
        for &id in &g.numa_nodes {
            let Some(n) = found.node(id) else {
                problems.push(format!("{who}: its NUMA node {id} is not in this guest"));
                continue;
            };
            if !n.cpulist.is_empty() {
                problems.push(format!(
                    "{who}: its NUMA node {id} has CPUs {}, planned none",
                    n.cpulist
                ));
            }
            match n.mem_total_kib {
                Some(0) => {}
                Some(kib) => problems.push(format!(
                    "{who}: its NUMA node {id} has {kib} kB of memory, planned none before \
                     the GPU driver onlines the GPU memory"
                )),
                None => problems.push(format!(
                    "{who}: node{id}/meminfo has no MemTotal: its memory is unknown"
                )),
            }
            if let Some(gi) = &found.generic_initiators {
                if !gi.contains(&id) {
                    problems.push(format!(
                        "{who}: its NUMA node {id} has no generic initiator \
                         (has_generic_initiator: {gi:?}); QEMU needs \
                         `-object acpi-generic-initiator,pci-dev=…,node={id}`"
                    ));
                }
            }
        }
    }
    for (i, row) in plan.distances.iter().enumerate() {
        let id = i as u32;
        let Some(n) = found.node(id) else { continue };
        if n.distances.as_ref() != Some(row) {
            let whose = owner(gpus, id).map_or_else(String::new, |o| format!(" ({o})"));
            problems.push(format!(
                "node {id}{whose}: distances {}, planned {row:?}",
                n.distances
                    .as_ref()
                    .map_or_else(|| "unreadable".into(), |d| format!("{d:?}"))
            ));
        }
    }
    NumaReport {
        planned_nodes: plan.nodes,
        found,
        problems,
    }
}
