//! Which GPUs are NVLink peers when no capture says so: on an NVSwitch board, every
//! GPU of a known SXM part (captured `nvidia-smi` text is read by `read::nvidia_smi`
//! and recorded by `Topology::add_nvlinks`).
//!
//! NVLink peers do P2P without the clique capability (the driver prefers NVLink and,
//! on NVSwitch boards, refuses PCIe fallback), so the planner needs to know them.

use pci_config::Bdf;

use vfio_p2p_contract::nvidia_parts::{gpu_part, Boards};
use vfio_p2p_model::Topology;

/// NVLinks per GPU of an NVSwitch board for GPU device `device`, if known.
pub fn nvswitch_links(device: u16) -> Option<u8> {
    gpu_part(device).and_then(|p| p.links)
}

/// With NVSwitches on the PCI tree, all NVIDIA GPUs of known SXM parts are NVLink peers
/// (one board-wide fabric). Records them and returns warnings for GPUs it cannot place.
pub fn apply_nvswitch_fabric(topo: &mut Topology) -> Vec<String> {
    if topo.nvswitches().next().is_none() {
        return vec![];
    }
    let mut warnings = Vec::new();
    let mut known = Vec::new();
    for g in topo.gpus().filter(|d| d.is_nvidia_gpu()) {
        let why = match gpu_part(g.device) {
            Some(p) if p.boards == Boards::Direct => Err(format!(
                "{} ({:#06x}) is wired GPU to GPU, not to NVSwitches",
                p.name, g.device
            )),
            Some(p) => p.links.ok_or(format!(
                "the NVLink count per GPU of {} ({:#06x}) is not certain (no public figure)",
                p.name, g.device
            )),
            None => Err(format!(
                "the NVLink count of GPU device {:#06x} is unknown",
                g.device
            )),
        };
        match why {
            Ok(n) => known.push((g.bdf, n)),
            Err(why) => warnings.push(format!(
                "{}: NVSwitches are present but {why}; not treated as an NVLink peer \
                 (pass --nvlink with `nvidia-smi topo -m` output)",
                g.bdf
            )),
        }
    }
    for (i, (a, n)) in known.iter().enumerate() {
        for (b, m) in &known[i + 1..] {
            topo.set_nvlink(*a, *b, (*n).min(*m));
        }
    }
    warnings
}

/// Where a GPU's NVLinks lead, as NCCL's topology file records them (one `<nvlink>`
/// element each).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NvlinkTarget {
    /// The NVSwitch fabric: all of the GPU's links, one element whatever the peers.
    Fabric { links: u8 },
    /// Another GPU, over `links` direct links (a 4-GPU board, an NVLink bridge).
    Gpu { peer: Bdf, links: u8 },
}

/// `gpu`'s NVLinks to the GPUs of `peers` (those of the same VM), as NCCL would see them.
/// The links go to the switch fabric when NVSwitches are on the PCI tree, or when the GPU
/// is an SXM part sold on NVSwitch boards and every peer has all of its links (a direct
/// link cannot give all of a GPU's links to each of its peers); otherwise GPU to GPU.
pub fn nvlink_targets(topo: &Topology, gpu: &Bdf, peers: &[Bdf]) -> Vec<NvlinkTarget> {
    let links: Vec<(Bdf, u8)> = peers
        .iter()
        .filter(|p| *p != gpu)
        .filter_map(|p| topo.nvlink(gpu, p).map(|n| (*p, n)))
        .collect();
    let Some(most) = links.iter().map(|(_, n)| *n).max() else {
        return vec![];
    };
    let part = topo.device(gpu).and_then(|d| gpu_part(d.device));
    let per_gpu = part.and_then(|p| p.links);
    let switch_board = part.is_some_and(|p| p.boards != Boards::Direct);
    let all_links_to_each = per_gpu.is_some_and(|l| links.iter().all(|(_, n)| *n == l));
    if topo.nvswitches().next().is_some() || (switch_board && all_links_to_each) {
        return vec![NvlinkTarget::Fabric {
            links: per_gpu.unwrap_or(most),
        }];
    }
    links
        .into_iter()
        .map(|(peer, links)| NvlinkTarget::Gpu { peer, links })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use pci_config::Bdf;
    use vfio_p2p_read::synth;

    #[test]
    fn nvswitch_board_makes_all_h100_peers() {
        let mut topo = Topology::from_record(&synth::example("hgx-h100").unwrap());
        let warnings = apply_nvswitch_fabric(&mut topo);
        assert!(warnings.is_empty());
        let gpus: Vec<Bdf> = topo.gpus().map(|d| d.bdf).collect();
        assert_eq!(topo.nvlinks.len(), 8 * 7 / 2);
        assert_eq!(topo.path(&gpus[0], &gpus[7]).label(), "NV18");
    }

    #[test]
    fn unknown_gpu_on_nvswitch_board_is_said() {
        let mut host = synth::example("hgx-h100").unwrap();
        for d in host.devices.iter_mut().filter(|d| d.device == 0x2330) {
            d.device = 0x9999;
        }
        let mut topo = Topology::from_record(&host);
        let warnings = apply_nvswitch_fabric(&mut topo);
        assert_eq!(warnings.len(), 8);
        assert!(warnings[0].contains("0x9999"));
        assert!(topo.nvlinks.is_empty());
    }

    fn hgx_with(device: u16) -> (Topology, Vec<String>) {
        let mut host = synth::example("hgx-h100").unwrap();
        for d in host.devices.iter_mut().filter(|d| d.device == 0x2330) {
            d.device = device;
        }
        let mut topo = Topology::from_record(&host);
        let warnings = apply_nvswitch_fabric(&mut topo);
        (topo, warnings)
    }

    #[test]
    fn uncertain_link_counts_are_said_not_guessed() {
        let (topo, warnings) = hgx_with(0x230c);
        assert_eq!(warnings.len(), 8);
        assert!(warnings[0].contains("H20-NVL16") && warnings[0].contains("not certain"));
        assert!(topo.nvlinks.is_empty());
        let (topo, warnings) = hgx_with(0x2901);
        assert!(warnings.is_empty());
        assert_eq!(topo.nvlinks.values().max(), Some(&18));
        let (_, warnings) = hgx_with(0x1db1);
        assert!(warnings[0].contains("GPU to GPU"), "{warnings:?}");
    }

    #[test]
    fn nccl_targets_switch_fabric_or_gpu_to_gpu() {
        let mut topo = Topology::from_record(&synth::example("hgx-h100").unwrap());
        apply_nvswitch_fabric(&mut topo);
        let gpus: Vec<Bdf> = topo.gpus().map(|d| d.bdf).collect();
        assert_eq!(
            nvlink_targets(&topo, &gpus[0], &gpus),
            [NvlinkTarget::Fabric { links: 18 }]
        );
        // Without switches on the tree (a VM): all 18 links to the one peer → the fabric;
        // 6 to each of three peers (a 4-GPU HGX board) → GPU to GPU.
        let mut host = synth::example("hgx-h100").unwrap();
        host.devices.retain(|d| d.device != 0x22a3);
        let mut topo = Topology::from_record(&host);
        let g: Vec<Bdf> = topo.gpus().map(|d| d.bdf).collect();
        topo.set_nvlink(g[0], g[1], 18);
        assert_eq!(
            nvlink_targets(&topo, &g[0], &g[..2]),
            [NvlinkTarget::Fabric { links: 18 }]
        );
        for p in &g[1..4] {
            topo.set_nvlink(g[0], *p, 6);
        }
        assert_eq!(
            nvlink_targets(&topo, &g[0], &g[..4]),
            [1, 2, 3].map(|i| NvlinkTarget::Gpu {
                peer: g[i],
                links: 6
            })
        );
        assert_eq!(nvlink_targets(&topo, &g[4], &g), []);
    }
}
