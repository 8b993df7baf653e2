//! Which `pxb-pcie` expander each host root complex gets in a `mirror` guest: its own while
//! the guest's root bus has room, else its NUMA node's first (see `guest_layout`).

use std::collections::{BTreeMap, BTreeSet};

use super::types::{LayoutError, EXPANDER_BUS_STRIDE, EXPANDER_FIRST_SLOT, ROOT_PORT_FIRST_SLOT};
use vfio_p2p_model::{Device, HostBridgeId, Topology};

/// Expander buses the root bus holds: its slots below the root ports, and bus ranges.
pub const MAX_EXPANDERS: usize = {
    let slots = (ROOT_PORT_FIRST_SLOT - EXPANDER_FIRST_SLOT) as usize;
    let ranges = (u8::MAX / EXPANDER_BUS_STRIDE) as usize - 1;
    if slots < ranges {
        slots
    } else {
        ranges
    }
};

/// The NUMA node of a GPU's root complex (what the path labels compare), else its own.
pub(super) fn root_node(topo: &Topology, gpu: &Device) -> Option<u32> {
    topo.host_bridge_numa(gpu.host_bridge).or(gpu.numa_node)
}

/// The expander each chosen GPU's host root complex goes to: its own while the root bus
/// has room ([`MAX_EXPANDERS`]); past that, the first expander of its NUMA node (pairs
/// between the two complexes then read PHB in the guest instead of NODE).
pub(super) fn expander_assignment(
    topo: &Topology,
    chosen: &[&Device],
) -> Result<BTreeMap<HostBridgeId, (HostBridgeId, Option<u32>)>, LayoutError> {
    let roots: BTreeMap<HostBridgeId, Option<u32>> = chosen
        .iter()
        .map(|d| (d.host_bridge, root_node(topo, d)))
        .collect();
    let nodes: BTreeSet<Option<u32>> = roots.values().copied().collect();
    if nodes.len() > MAX_EXPANDERS {
        return Err(LayoutError::TooManyExpanders {
            count: nodes.len(),
            max: MAX_EXPANDERS,
        });
    }
    let mut spare = MAX_EXPANDERS - nodes.len();
    let mut first_of_node: BTreeMap<Option<u32>, HostBridgeId> = BTreeMap::new();
    let mut out = BTreeMap::new();
    for (hb, node) in roots {
        let target = match first_of_node.get(&node) {
            None => {
                first_of_node.insert(node, hb);
                hb
            }
            Some(_) if spare > 0 => {
                spare -= 1;
                hb
            }
            Some(first) => *first,
        };
        out.insert(hb, (target, node));
    }
    Ok(out)
}
