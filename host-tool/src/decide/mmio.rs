//! Sizing the guest's 64-bit PCI MMIO window so every passed-through BAR fits.

use pci_config::Bdf;

use crate::model::Topology;

/// Smallest window QEMU's q35 gives by default (32 GiB): never ask for less.
const MIN_HOLE64: u64 = 32 << 30;

/// A 64-bit MMIO window size for `gpus` and their other functions: per GPU the 64-bit
/// BARs (powers of two) in a port window that firmware aligns and sizes to the largest
/// BAR, summed and rounded up to a power of two so the window itself stays aligned.
pub fn hole64_size(topo: &Topology, gpus: &[Bdf]) -> u64 {
    let mut total: u64 = 0;
    for gpu in gpus {
        let functions = topo
            .device(gpu)
            .into_iter()
            .chain(topo.sibling_functions(gpu))
            .filter(|d| d.bridge_role().is_none());
        let bars: Vec<u64> = functions
            .flat_map(|d| d.bars.iter().filter(|b| b.is_64bit).map(|b| b.size))
            .map(|s| s.next_power_of_two())
            .collect();
        let largest = bars.iter().copied().max().unwrap_or(1);
        // The GPU's port window is aligned to its largest BAR and sized to a multiple of it.
        let window = bars.iter().sum::<u64>().div_ceil(largest).saturating_mul(largest);
        total = total.saturating_add(window);
    }
    total
        .checked_next_power_of_two()
        .unwrap_or(1 << 63)
        .max(MIN_HOLE64)
}

/// The same in MiB, for OVMF's `opt/ovmf/X-PciMmio64Mb`.
pub fn hole64_mib(size: u64) -> u64 {
    size.div_ceil(1 << 20)
}
