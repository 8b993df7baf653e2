//! Which GPUs are NVLink peers when no capture says so: on an NVSwitch board, every
//! GPU of a known SXM part (captured `nvidia-smi` text is read by `read::nvidia_smi`
//! and recorded by `Topology::add_nvlinks`).
//!
//! NVLink peers do P2P without the clique capability (the driver prefers NVLink and,
//! on NVSwitch boards, refuses PCIe fallback), so the planner needs to know them.

use crate::model::Topology;

/// Bonded NVLinks between two GPUs of an NVSwitch board, by PCI device ID (SXM parts).
const LINKS_BY_DEVICE: &[(u16, u8, &str)] = &[
    (0x20b0, 12, "A100-SXM4-40GB"),
    (0x20b2, 12, "A100-SXM4-80GB"),
    (0x20b5, 12, "A100-SXM4-80GB"),
    (0x2324, 8, "H800-SXM5"),
    (0x2330, 18, "H100-SXM5-80GB"),
    (0x2335, 18, "H200-SXM-141GB"),
];

/// NVLink count per GPU pair of an NVSwitch board for GPU device `device`, if known.
pub fn nvswitch_links(device: u16) -> Option<u8> {
    LINKS_BY_DEVICE
        .iter()
        .find(|(d, _, _)| *d == device)
        .map(|(_, n, _)| *n)
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
        match nvswitch_links(g.device) {
            Some(n) => known.push((g.bdf, n)),
            None => warnings.push(format!(
                "{}: NVSwitches are present but the NVLink count of GPU device {:#06x} is unknown; \
                 not treated as an NVLink peer (pass --nvlink with `nvidia-smi topo -m` output)",
                g.bdf, g.device
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synth;
    use pci_config::Bdf;

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
}
