//! Where the VMM writes each GPU's clique capability, decided once over
//! [`pci_config::clique::placement`]: `check` judges it, `gen cloud-hypervisor` refuses a
//! GPU it would corrupt, and the emitters only render what is decided here.

use pci_config::clique::{placement, PlacementRefused, Placer, OFFSET_FALLBACK, OFFSET_PRIMARY};
use pci_config::Bdf;

use crate::guest_layout::GuestLayout;
use vfio_p2p_model::vmm::QemuVersion;
use vfio_p2p_model::Topology;

/// How this QEMU places the capability: 0xC8 then 0xD4 from 8.1 (and 7.2 with our
/// backport), always 0xC8 before.
pub fn qemu_placer(version: &QemuVersion) -> Placer {
    if version.has_clique_fallback() {
        Placer::WithFallback
    } else {
        Placer::Fixed(OFFSET_PRIMARY)
    }
}

/// A GPU whose clique would overlay a capability.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{gpu}: a capability already starts at {offset:#x}, where Cloud Hypervisor puts the clique; it would corrupt the GPU's capability list. Use QEMU >= 8.1 (it moves the clique) or leave this GPU without a clique (no --p2p-level for it)")]
pub struct CapabilityTaken {
    pub gpu: Bdf,
    pub offset: u8,
}

/// Cloud Hypervisor's placement for every passed GPU with a clique: refused where its
/// offset is taken; a warning per GPU whose config space could not be read.
pub fn cloud_hypervisor(
    topo: &Topology,
    layout: &GuestLayout,
) -> Result<Vec<String>, CapabilityTaken> {
    let mut warnings = Vec::new();
    for g in layout.passed() {
        let Some(clique) = g.clique else { continue };
        match topo.device(&g.host) {
            Some(d) if d.config_complete() => {
                if let Err(refused) = placement(&d.config(), Placer::CLOUD_HYPERVISOR) {
                    let offset = match refused {
                        PlacementRefused::Taken(at) => at,
                        PlacementRefused::NoRoom => OFFSET_FALLBACK,
                    };
                    return Err(CapabilityTaken {
                        gpu: g.host,
                        offset,
                    });
                }
            }
            _ => warnings.push(format!(
                "{}: config space not readable (run as root): could not check that {OFFSET_FALLBACK:#x} is free for clique {clique}",
                g.host
            )),
        }
    }
    Ok(warnings)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guest_layout::{decide, LayoutOptions};
    use vfio_p2p_config::vm::GuestTopology;
    use vfio_p2p_read::synth;

    /// Cloud Hypervisor refuses a GPU with a capability at 0xD4 when it has a clique, and
    /// only then; a GPU whose config space is short is a warning.
    #[test]
    fn cloud_hypervisor_refuses_a_taken_d4_for_a_gpu_with_a_clique() {
        let mut rec = synth::example("dual-socket-pcie").unwrap();
        let first = rec
            .devices
            .iter()
            .position(|d| d.class >> 16 == 0x03)
            .unwrap();
        let gpu = rec.devices[first].bdf;
        let placed = |rec: &vfio_p2p_model::HostRecord, clique: Option<u8>| {
            let topo = Topology::from_record(rec);
            let cliques = [(gpu, clique)].into();
            let opts = LayoutOptions {
                topology: GuestTopology::Flat,
                guest_numa: false,
            };
            cloud_hypervisor(&topo, &decide(&topo, &[gpu], &cliques, opts).unwrap())
        };
        assert_eq!(placed(&rec, Some(0)), Ok(Vec::new()));
        // Link a capability at 0xD4 after the first one.
        let cfg = &mut rec.devices[first].config;
        let first_cap = cfg[0x34] as usize;
        cfg[first_cap + 1] = 0xd4;
        cfg[0xd4] = pci_config::CAP_ID_MSI;
        cfg[0xd5] = 0;
        assert_eq!(
            placed(&rec, Some(0)),
            Err(CapabilityTaken {
                gpu,
                offset: OFFSET_FALLBACK
            })
        );
        assert_eq!(placed(&rec, None), Ok(Vec::new()));
        rec.devices[first].config.truncate(64);
        let warned = placed(&rec, Some(0)).unwrap();
        assert!(
            warned[0].contains("could not check that 0xd4 is free"),
            "{warned:?}"
        );
    }
}
