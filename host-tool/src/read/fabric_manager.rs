//! Fabric Manager's live partition list, through its C API (`fm_api`): the supported
//! partitions (with their GPUs' physical ids, PCI addresses and NVLinks), the unsupported
//! ones and the GPUs with failed NVLinks, read once per run. `model::fabric_live` turns it
//! into a `FabricState`.

use crate::fm_api::{FmError, FmPartition, FmSession, FmUnsupported};

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
