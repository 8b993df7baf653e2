//! An aarch64 host whose GPUs are plain PCIe cards (an Ampere Altra server, an Arm MGX
//! server with PCIe H100s or L40S behind switches): the guest is an aarch64 `virt`
//! machine (GICv3, AAVMF) with the x86 guest's PCIe tree (expanders, root ports, the
//! mirrored switches) on `pcie.0`, and none of a Grace guest's pieces: no
//! generic-initiator NUMA nodes (those stand for a superchip's C2C-attached GPU memory),
//! no vSMMU (the x86 guest has no vIOMMU either).
//!
//! The GPUs' 64-bit BARs go in `virt`'s high PCIe MMIO window: 512 GiB when
//! `highmem-mmio-size` is not given (hw/arm/virt.c, `DEFAULT_HIGH_PCIE_MMIO_SIZE`), which
//! QEMU >= 10.0 lets grow to a power of two (`virt_set_highmem_mmio_size` refuses anything
//! else, and anything below the default). So a window the default holds is not written
//! (any QEMU runs it); a larger one is, and a QEMU known to be older is refused.

use serde::Serialize;

use crate::grace_guest::HIGHMEM_MMIO_DEFAULT;
use vfio_p2p_model::vmm::QemuVersion;

/// A window QEMU cannot give.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("the GPUs' 64-bit BARs need a {} GiB high PCIe window on the aarch64 virt machine (highmem-mmio-size, QEMU >= {needed}); the QEMU given is {found}, whose window is fixed at 512 GiB: install a newer QEMU (Debian trixie-backports and sid have 11.1) and point gen --qemu at it, or choose fewer GPUs", .window >> 30)]
pub struct WindowTooLarge {
    pub window: u64,
    pub found: QemuVersion,
    pub needed: QemuVersion,
}

/// What an Arm PCIe guest needs beyond its PCIe tree (which is in the guest layout).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ArmPcieGuest {
    /// `highmem-mmio-size`, bytes; `None` where virt's 512 GiB default holds the BARs.
    pub highmem_mmio_size: Option<u64>,
}

/// The Arm PCIe guest for GPUs whose BARs need a `window`-byte high window (a power of
/// two, at least the default: `grace_guest::window`), on QEMU `version` where it was
/// asked, with the warnings to say.
pub fn decide(
    version: Option<QemuVersion>,
    window: u64,
) -> Result<(ArmPcieGuest, Vec<String>), WindowTooLarge> {
    if window <= HIGHMEM_MMIO_DEFAULT {
        return Ok((
            ArmPcieGuest {
                highmem_mmio_size: None,
            },
            Vec::new(),
        ));
    }
    let needed = QemuVersion::HIGHMEM_MMIO_SIZE;
    let mut warnings = Vec::new();
    match version {
        Some(v) if v < needed => {
            return Err(WindowTooLarge {
                window,
                found: v,
                needed,
            })
        }
        Some(_) => {}
        None => warnings.push(format!(
            "the QEMU that runs this VM is not known (gen --qemu PATH asks its version): the GPUs' BARs need a {} GiB high PCIe window, written as highmem-mmio-size, which needs QEMU >= {needed}",
            window >> 30
        )),
    }
    Ok((
        ArmPcieGuest {
            highmem_mmio_size: Some(window),
        },
        warnings,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn a_window_the_default_holds_is_not_written_on_any_qemu() {
        for v in [None, Some(QemuVersion::release(7, 2))] {
            let (g, w) = decide(v, HIGHMEM_MMIO_DEFAULT).unwrap();
            assert_eq!(g.highmem_mmio_size, None);
            assert!(w.is_empty(), "{w:?}");
        }
    }

    #[test]
    fn a_larger_window_needs_qemu_10_0() {
        let (g, w) = decide(Some(QemuVersion::release(10, 0)), 1024 * GIB).unwrap();
        assert_eq!(g.highmem_mmio_size, Some(1024 * GIB));
        assert!(w.is_empty());
        let e = decide(Some(QemuVersion::release(9, 2)), 1024 * GIB).unwrap_err();
        assert!(e.to_string().contains("1024 GiB high PCIe window"), "{e}");
        assert!(e.to_string().contains("QEMU >= 10.0.0"), "{e}");
        // unknown: written, with the version it needs said
        let (g, w) = decide(None, 1024 * GIB).unwrap();
        assert_eq!(g.highmem_mmio_size, Some(1024 * GIB));
        assert!(w[0].contains("1024 GiB high PCIe window"), "{w:?}");
    }
}
