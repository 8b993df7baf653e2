//! Fabric Manager's live partition list, through its C API (`fm_api`): the supported
//! partitions (with their GPUs' physical ids, PCI addresses and NVLinks), the unsupported
//! ones and the GPUs with failed NVLinks, read once per run, as a [`FabricState`].

use pci_config::Bdf;

use crate::fm_api::{FmError, FmPartition, FmSession, FmUnsupported};
use vfio_p2p_model::fabric_state::{FabricPartition, FabricState, PartitionGpu};

/// Everything FM answered, as it answered it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FmReport {
    pub partitions: Vec<FmPartition>,
    pub unsupported: Vec<FmUnsupported>,
    /// PCI bus ids (FM's text) of GPUs with failed NVLinks.
    pub nvlink_failed: Vec<String>,
}

/// Queries FM's three lists over `session`.
pub fn read_fabric_manager(session: &FmSession) -> Result<FmReport, FmError> {
    Ok(FmReport {
        partitions: session.supported_partitions()?,
        unsupported: session.unsupported_partitions()?,
        nvlink_failed: session.nvlink_failed_gpus()?,
    })
}

/// FM's PCI bus id text as an address; FM leaves it empty on H100 and later boards.
fn address(text: &str) -> Option<Bdf> {
    text.trim().parse().ok()
}

impl From<&FmReport> for FabricState {
    fn from(r: &FmReport) -> FabricState {
        FabricState {
            fm_version: None,
            partitions: r
                .partitions
                .iter()
                .map(|p| FabricPartition {
                    id: p.id,
                    active: p.active,
                    gpus: p
                        .gpus
                        .iter()
                        .map(|g| PartitionGpu {
                            module_id: g.physical_id,
                            bdf: address(&g.pci_bus_id),
                            nvlinks_available: g.nvlinks_available,
                            nvlinks_max: g.nvlinks_max,
                        })
                        .collect(),
                })
                .collect(),
            unsupported: r.unsupported.iter().map(|u| u.id).collect(),
            nvlink_failed_gpus: r.nvlink_failed.iter().filter_map(|t| address(t)).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fm_api::FmGpu;

    #[test]
    fn fm_bus_ids_become_addresses_and_empty_ones_none() {
        let gpu = |id, pci: &str| FmGpu {
            physical_id: id,
            pci_bus_id: pci.into(),
            nvlinks_available: 18,
            nvlinks_max: 18,
        };
        let r = FmReport {
            partitions: vec![FmPartition {
                id: 3,
                active: true,
                gpus: vec![gpu(1, "00000000:13:00.0"), gpu(3, "")],
            }],
            unsupported: vec![FmUnsupported {
                id: 9,
                physical_ids: vec![1, 2],
            }],
            nvlink_failed: vec!["00000000:14:00.0".into()],
        };
        let s = FabricState::from(&r);
        let p = &s.partitions[0];
        assert_eq!((p.id, p.active), (3, true));
        assert_eq!(p.gpus[0].bdf, Some("0000:13:00.0".parse().unwrap()));
        assert_eq!(p.gpus[1].bdf, None);
        assert_eq!(p.gpus[1].module_id, 3);
        assert_eq!(s.unsupported, vec![9]);
        assert_eq!(s.nvlink_failed_gpus, vec!["0000:14:00.0".parse().unwrap()]);
    }
}
