//! Fabric Manager's live partition list, through its C API (`fm_api`): the supported
//! partitions (with their GPUs' physical ids, PCI addresses and NVLinks), the unsupported
//! ones and the GPUs with failed NVLinks, read once per run, as a [`FabricState`].

use pci_config::Bdf;

use crate::fm_api::FmSession;
use vfio_p2p_fm_ffi::{FmError, FmPartition, FmUnsupported};
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

/// FM's PCI bus id text as an address: `Ok(None)` where FM leaves it empty (H100 and later
/// boards), `Err` for text that is no PCI address.
fn address(text: &str) -> Result<Option<Bdf>, String> {
    let t = text.trim();
    if t.is_empty() {
        return Ok(None);
    }
    t.parse()
        .map(Some)
        .map_err(|e| format!("PCI bus id {t:?} is not a PCI address ({e})"))
}

/// FM's answer in the model, checked as every FM source is ([`FabricState::check`]): a bus
/// id that is no address, a GPU with failed NVLinks FM names by no address (which GPU failed
/// cannot be told), a partition id twice, more partitions than FM has, one GPU under two
/// module ids are errors, not answers.
pub fn fabric_state(r: &FmReport) -> Result<FabricState, String> {
    let mut partitions = Vec::with_capacity(r.partitions.len());
    for p in &r.partitions {
        let mut gpus = Vec::with_capacity(p.gpus.len());
        for g in &p.gpus {
            gpus.push(PartitionGpu {
                module_id: g.physical_id,
                bdf: address(&g.pci_bus_id)
                    .map_err(|e| format!("partition {}: module {}: {e}", p.id, g.physical_id))?,
                nvlinks_available: g.nvlinks_available,
                nvlinks_max: g.nvlinks_max,
            });
        }
        partitions.push(FabricPartition {
            id: p.id,
            active: p.active,
            gpus,
        });
    }
    let mut nvlink_failed_gpus = Vec::with_capacity(r.nvlink_failed.len());
    for t in &r.nvlink_failed {
        match address(t) {
            Ok(Some(bdf)) => nvlink_failed_gpus.push(bdf),
            Ok(None) => return Err("a GPU with failed NVLinks is listed without a PCI bus id: which GPU cannot be told, so no partition is trusted".into()),
            Err(e) => return Err(format!("a GPU with failed NVLinks: {e}")),
        }
    }
    let state = FabricState {
        fm_version: None,
        partitions,
        unsupported: r.unsupported.iter().map(|u| u.id).collect(),
        nvlink_failed_gpus,
    };
    state.check()?;
    Ok(state)
}

#[cfg(test)]
mod tests {
    use super::*;
    use vfio_p2p_fm_ffi::FmGpu;

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
        let s = fabric_state(&r).unwrap();
        let p = &s.partitions[0];
        assert_eq!((p.id, p.active), (3, true));
        assert_eq!(p.gpus[0].bdf, Some("0000:13:00.0".parse().unwrap()));
        assert_eq!(p.gpus[1].bdf, None);
        assert_eq!(p.gpus[1].module_id, 3);
        assert_eq!(s.unsupported, vec![9]);
        assert_eq!(s.nvlink_failed_gpus, vec!["0000:14:00.0".parse().unwrap()]);
        let mut bad = r.clone();
        bad.nvlink_failed = vec![String::new()];
        assert!(fabric_state(&bad)
            .unwrap_err()
            .contains("without a PCI bus id"));
        bad.nvlink_failed = vec!["GPU-7".into()];
        assert!(fabric_state(&bad)
            .unwrap_err()
            .contains("\"GPU-7\" is not a PCI address"));
        let mut bad = r.clone();
        bad.partitions[0].gpus[1].pci_bus_id = "slot 3".into();
        assert!(fabric_state(&bad)
            .unwrap_err()
            .starts_with("partition 3: module 3: PCI bus id"));
        let mut bad = r.clone();
        bad.partitions.push(bad.partitions[0].clone());
        assert!(fabric_state(&bad)
            .unwrap_err()
            .contains("partition 3 is listed twice"));
    }
}
