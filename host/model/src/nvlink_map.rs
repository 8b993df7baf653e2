//! Which GPUs are NVLink peers, as `read::nvidia_smi` reads it from captured `nvidia-smi` text.

use pci_config::Bdf;

/// NVLink pairs read from `nvidia-smi` text, by PCI address.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NvlinkMap {
    /// The file(s) they came from, for messages.
    pub source_name: String,
    pub links: Vec<(Bdf, Bdf, u8)>,
}
