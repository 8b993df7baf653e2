//! Which host devices a guest layout passes: the chosen GPUs with their other functions,
//! and the NICs passed with them, grouped by host slot (see `guest_layout`).

use std::collections::BTreeMap;

use pci_config::Bdf;

use super::types::{GuestGpu, LayoutError};
use vfio_p2p_model::{Device, DeviceKind, Topology};

/// The host GPUs, sorted and once each; anything else is an error.
pub(super) fn chosen_gpus<'t>(
    topo: &'t Topology,
    gpus: &[Bdf],
) -> Result<Vec<&'t Device>, LayoutError> {
    if gpus.is_empty() {
        return Err(LayoutError::NoGpus);
    }
    let mut chosen: Vec<&Device> = Vec::new();
    for bdf in gpus {
        match topo.device(bdf) {
            Some(d) if d.is_gpu() => chosen.push(d),
            _ => return Err(LayoutError::NotAGpu(*bdf)),
        }
    }
    chosen.sort_by_key(|d| d.bdf);
    chosen.dedup_by_key(|d| d.bdf);
    Ok(chosen)
}

/// The named host NICs, sorted and once each, grouped by host slot: named functions of
/// one host slot (two ports of one card, a PF and its VFs at the same device number)
/// share one guest slot at their host function numbers, the lowest first. A device
/// that is not a network controller, or is a chosen GPU's own function, is an error.
pub(super) fn chosen_nics<'t>(
    topo: &'t Topology,
    nics: &[Bdf],
    gpus: &[&Device],
) -> Result<Vec<(&'t Device, Vec<&'t Device>)>, LayoutError> {
    let gpu_slots: BTreeMap<Bdf, Bdf> = gpus
        .iter()
        .map(|g| (g.bdf.with_function(0), g.bdf))
        .collect();
    let mut named: Vec<&Device> = Vec::new();
    for bdf in nics {
        match topo.device(bdf) {
            // NVSwitches go in as NICs do, with a full-passthrough VM's whole baseboard.
            Some(d) if matches!(d.kind, DeviceKind::Nic | DeviceKind::NvSwitch) => named.push(d),
            _ => return Err(LayoutError::NotANic(*bdf)),
        }
        if let Some(g) = gpu_slots.get(&bdf.with_function(0)) {
            return Err(LayoutError::NicInGpuSlot(*bdf, *g));
        }
    }
    named.sort_by_key(|d| d.bdf);
    named.dedup_by_key(|d| d.bdf);
    let mut out: Vec<(&Device, Vec<&Device>)> = Vec::new();
    for d in named {
        match out.last_mut() {
            Some((first, others)) if first.bdf.with_function(0) == d.bdf.with_function(0) => {
                others.push(d)
            }
            _ => out.push((d, Vec::new())),
        }
    }
    Ok(out)
}

/// The GPU's other functions (audio, USB-C…), which go to the same guest slot.
pub(super) fn other_functions<'t>(topo: &'t Topology, gpu: &Device) -> Vec<&'t Device> {
    let mut functions: Vec<&Device> = topo
        .sibling_functions(&gpu.bdf)
        .into_iter()
        .filter(|d| d.bridge_role().is_none())
        .collect();
    functions.sort_by_key(|d| d.bdf);
    functions
}

const VENDOR_MELLANOX: u16 = 0x15b3;

/// The RDMA device name the guest's driver gives each passed NIC (in `nics`' order; the
/// emitters write it, e.g. `gen nccl`'s `<net name>`):
/// the host name's prefix (trailing digits dropped; `mlx5_` for a Mellanox NIC without
/// one), numbered among the passed NICs of that prefix in guest address order (probe
/// order); a NIC with no RDMA device gets its host interface name (what NCCL's socket
/// transport reports).
pub fn guest_rdma_names(nics: &[GuestGpu], topo: &Topology) -> Vec<String> {
    let prefix = |n: &GuestGpu| -> Option<String> {
        let host = topo.nic_names.get(&n.host).and_then(|x| x.rdma.first());
        match host {
            Some(h) => Some(h.trim_end_matches(|c: char| c.is_ascii_digit()).to_string()),
            None => (n.vendor == VENDOR_MELLANOX).then(|| "mlx5_".to_string()),
        }
    };
    let mut order: Vec<usize> = (0..nics.len()).collect();
    order.sort_by_key(|&i| nics[i].guest);
    let mut next: BTreeMap<String, usize> = BTreeMap::new();
    let mut names = vec![String::new(); nics.len()];
    for i in order {
        names[i] = match prefix(&nics[i]) {
            Some(p) => {
                let k = next.entry(p.clone()).or_insert(0);
                *k += 1;
                format!("{p}{}", *k - 1)
            }
            None => {
                let net = topo
                    .nic_names
                    .get(&nics[i].host)
                    .and_then(|x| x.net.first());
                net.cloned().unwrap_or_else(|| nics[i].id.clone())
            }
        };
    }
    names
}
