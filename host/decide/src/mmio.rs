//! Sizing the guest's 64-bit MMIO window for large GPU BARs.
//!
//! Each passed-through GPU sits behind its own (emulated) root port, whose prefetchable
//! window must hold the GPU's 64-bit BARs and is aligned to its own power-of-two size,
//! so a GPU with a 128 GiB + 32 MiB BAR set takes a 256 GiB slot. The window also keeps
//! QEMU's default 32 GiB for everything else in the guest.

use vfio_p2p_model::Device;

const GIB: u64 = 1 << 30;
/// Room left for the guest's other 64-bit BARs (QEMU's default `pci-hole64-size`).
pub const HEADROOM: u64 = 32 * GIB;

/// The 64-bit MMIO window (bytes, a whole number of GiB) the guest needs for `gpus`.
pub fn hole64_size(gpus: &[&Device]) -> u64 {
    let slots: u64 = gpus
        .iter()
        .map(|d| d.bar64_total())
        .filter(|&t| t > 0)
        .map(u64::next_power_of_two)
        .sum();
    (slots + HEADROOM).div_ceil(GIB) * GIB
}

/// `-global q35-pcihost.pci-hole64-size=…` for QEMU.
pub fn qemu_hole64_arg(size: u64) -> String {
    format!(
        "-global q35-pcihost.pci-hole64-size={}G",
        size.div_ceil(GIB)
    )
}

/// OVMF's `X-PciMmio64Mb` value (MiB).
pub fn ovmf_mmio64_mb(size: u64) -> u64 {
    size.div_ceil(1 << 20)
}

/// `-fw_cfg name=opt/ovmf/X-PciMmio64Mb,string=…` for QEMU with OVMF.
pub fn ovmf_fw_cfg_arg(size: u64) -> String {
    format!(
        "-fw_cfg name=opt/ovmf/X-PciMmio64Mb,string={}",
        ovmf_mmio64_mb(size)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use vfio_p2p_model::Topology;
    use vfio_p2p_read::synth;

    #[test]
    fn eight_h100_need_two_tib_plus_headroom() {
        let topo = Topology::from_record(&synth::example("hgx-h100").unwrap());
        let gpus: Vec<&Device> = topo.gpus().collect();
        assert_eq!(gpus.len(), 8);
        // 16 MiB (32-bit) + 128 GiB + 32 MiB per GPU → 256 GiB slots.
        assert_eq!(hole64_size(&gpus), 8 * 256 * GIB + HEADROOM);
        assert_eq!(
            qemu_hole64_arg(hole64_size(&gpus)),
            "-global q35-pcihost.pci-hole64-size=2080G"
        );
        assert_eq!(
            ovmf_fw_cfg_arg(hole64_size(&gpus)),
            "-fw_cfg name=opt/ovmf/X-PciMmio64Mb,string=2129920"
        );
    }

    #[test]
    fn no_gpus_keep_the_default() {
        assert_eq!(hole64_size(&[]), HEADROOM);
    }
}
