//! Versions of the VMM stack (QEMU, libvirt) and what each can do, as read by `read::vmm`.

use std::fmt;
use std::str::FromStr;

/// A QEMU version, from `qemu-system-x86_64 --version`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct QemuVersion {
    pub major: u32,
    pub minor: u32,
    pub micro: u32,
    /// Built with our `qemu-patches/` backport (local version suffix `+vfiop2p`),
    /// so it falls back to 0xD4 whatever its version number says.
    pub clique_backport: bool,
}

impl fmt::Display for QemuVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.micro)?;
        if self.clique_backport {
            f.write_str(" with the vfio-p2p clique backport")?;
        }
        Ok(())
    }
}

impl QemuVersion {
    /// First QEMU with the 0xD4 fallback for GPUs that have a capability at 0xC8.
    pub const CLIQUE_FALLBACK: QemuVersion = QemuVersion {
        major: 8,
        minor: 1,
        micro: 0,
        clique_backport: false,
    };

    /// First QEMU that maps a peer's BARs into an iommufd IOAS: it exports each BAR as a
    /// VFIO dma-buf (`VFIO_DEVICE_FEATURE_DMA_BUF`) and maps that with `IOMMU_IOAS_MAP_FILE`
    /// (hw/vfio: dma-buf BAR mapping, Shameer Kolothum's series of Dec 2025/Jan 2026, first
    /// released in QEMU 11.0). QEMU 10.x maps BARs with `IOMMU_IOAS_MAP`, which cannot pin
    /// PFNMAP memory: it warns and goes on, and peer writes fault.
    pub const BAR_DMABUF: QemuVersion = QemuVersion {
        major: 11,
        minor: 0,
        micro: 0,
        clique_backport: false,
    };

    /// First QEMU with `-object iommufd` and `vfio-pci,iommufd=` (hw/vfio/iommufd.c, QEMU 8.2).
    pub const IOMMUFD: QemuVersion = QemuVersion {
        major: 8,
        minor: 2,
        micro: 0,
        clique_backport: false,
    };

    /// First QEMU with `-object acpi-generic-initiator,pci-dev=,node=` (hw/acpi/
    /// acpi_generic_initiator.c, NVIDIA's series for Grace GPU memory nodes, QEMU 9.0).
    pub const GENERIC_INITIATOR: QemuVersion = QemuVersion::release(9, 0);

    /// First QEMU whose `virt` machine takes `highmem-mmio-size` (a power of two, at least
    /// the 512 GiB default; hw/arm/virt.c, Matthew R. Ochs's patch for Grace GPUs' BARs).
    pub const HIGHMEM_MMIO_SIZE: QemuVersion = QemuVersion::release(10, 0);

    /// First QEMU with user-created `-device arm-smmuv3,primary-bus=` on `virt`, one per
    /// PCIe root complex (`pxb-pcie`), not allowed with the machine-wide `iommu=smmuv3`.
    pub const SMMUV3_PER_BUS: QemuVersion = QemuVersion::release(10, 2);

    /// First QEMU with `arm-smmuv3,accel=on` (nested translation on the host SMMUv3 through
    /// iommufd), which only real Grace hardware exercises.
    pub const SMMUV3_ACCEL: QemuVersion = QemuVersion::release(11, 0);

    /// Version `major.minor.0` as upstream releases it.
    pub const fn release(major: u32, minor: u32) -> QemuVersion {
        QemuVersion {
            major,
            minor,
            micro: 0,
            clique_backport: false,
        }
    }

    /// Whether this QEMU places the clique at 0xD4 when 0xC8 is taken.
    pub fn has_clique_fallback(&self) -> bool {
        self.clique_backport || *self >= Self::CLIQUE_FALLBACK
    }
}

/// A Linux kernel release, `major.minor` (from `uname -r`: `6.12.57+deb13-amd64`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct KernelVersion {
    pub major: u32,
    pub minor: u32,
}

impl KernelVersion {
    /// First Linux that exports PCI BARs as dma-bufs (`VFIO_DEVICE_FEATURE_DMA_BUF`,
    /// "vfio/pci: Add dma-buf export support for MMIO regions", CONFIG_VFIO_PCI_DMABUF) and
    /// takes a dma-buf in `IOMMU_IOAS_MAP_FILE` ("Initial DMABUF support for iommufd"):
    /// both merged for v6.19 (the NV-Kernels backports #300/#322 name v6.19 as their source).
    pub const BAR_DMABUF: KernelVersion = KernelVersion {
        major: 6,
        minor: 19,
    };

    /// Parses the start of a release string; `None` when it has no `N.N`.
    pub fn parse(release: &str) -> Option<KernelVersion> {
        let mut nums = release.trim().split(['.', '-', '+']).map(str::parse::<u32>);
        Some(KernelVersion {
            major: nums.next()?.ok()?,
            minor: nums.next()?.ok()?,
        })
    }
}

impl fmt::Display for KernelVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// A libvirt version, `major.minor[.micro]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct LibvirtVersion {
    pub major: u32,
    pub minor: u32,
}

/// The first libvirt with `<qemu:override>`.
pub const OVERRIDE_SINCE: LibvirtVersion = LibvirtVersion { major: 8, minor: 2 };

/// The first libvirt with the iommufd backend for host devices: `<driver iommufd='yes'/>`
/// in a PCI `<hostdev>` (schema basictypes.rng `hostdevDriver`; libvirt's NEWS.rst, v12.2.0
/// bug fixes: "Introduced in v12.1.0 by implementing IOMMUFD backend support for host
/// devices"). v12.2.0 added the domain-wide `<iommufd enabled='yes'/>`. 11.3 (Debian 13)
/// has neither: checked against its domaincommon.rng/basictypes.rng.
pub const IOMMUFD_SINCE: LibvirtVersion = LibvirtVersion {
    major: 12,
    minor: 1,
};

/// The first libvirt with `<maxphysaddr>` in `<cpu>` (NEWS.rst, v8.7.0: "qemu: Add support
/// for specifying vCPU physical address size in bits"); `mode='passthrough'` becomes QEMU's
/// `host-phys-bits=on`.
pub const MAXPHYSADDR_SINCE: LibvirtVersion = LibvirtVersion { major: 8, minor: 7 };

/// First libvirt known to write QEMU's `acpi-generic-initiator` itself, from a hostdev's
/// `<acpi nodeset='…'/>` ("Add support for NUMA affinity of PCI devices", for NVIDIA MIG,
/// in the libvirt 12.0.0 changes Ubuntu 26.04 lists since its 11.6; the exact first
/// release between them is not checked, so older ones get `<qemu:commandline>`).
pub const ACPI_NODESET_SINCE: LibvirtVersion = LibvirtVersion {
    major: 12,
    minor: 0,
};
/// The first libvirt with `<iommu model='smmuv3'><driver pciBus='N'/>`: one SMMUv3 per
/// PCI expander bus, the per-physical-SMMU form (libvirt's formatdomain: "Since 11.10.0").
pub const SMMU_PCI_BUS_SINCE: LibvirtVersion = LibvirtVersion {
    major: 11,
    minor: 10,
};

impl FromStr for LibvirtVersion {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || format!("'{s}' is not a libvirt version; give MAJOR.MINOR, e.g. 9.0");
        let mut parts = s.trim().split('.');
        let major = parts.next().and_then(|p| p.parse().ok()).ok_or_else(bad)?;
        let minor = parts.next().and_then(|p| p.parse().ok()).ok_or_else(bad)?;
        match parts.next() {
            Some(p) if p.parse::<u32>().is_err() => return Err(bad()),
            _ => {}
        }
        if parts.next().is_some() {
            return Err(bad());
        }
        Ok(LibvirtVersion { major, minor })
    }
}

impl fmt::Display for LibvirtVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

impl LibvirtVersion {
    pub fn has_override(&self) -> bool {
        *self >= OVERRIDE_SINCE
    }

    pub fn has_iommufd(&self) -> bool {
        *self >= IOMMUFD_SINCE
    }

    pub fn has_acpi_nodeset(&self) -> bool {
        *self >= ACPI_NODESET_SINCE
    }

    /// An SMMUv3 per PCI expander bus (`<driver pciBus=…>`), see [`SMMU_PCI_BUS_SINCE`].
    pub fn has_smmu_pci_bus(&self) -> bool {
        *self >= SMMU_PCI_BUS_SINCE
    }

    pub fn has_maxphysaddr(&self) -> bool {
        *self >= MAXPHYSADDR_SINCE
    }
}

/// Whether a machine type is QEMU's Arm `virt` machine, versioned or not (`virt`,
/// `virt-9.2`): its GPUs' BARs go in the high PCIe window `highmem-mmio-size` sets (512 GiB
/// when not set), not in q35's `pci-hole64-size` (hw/arm/virt.c). `arch` is the guest
/// architecture where the definition names one (libvirt's `<type arch=…>`): RISC-V and
/// LoongArch call a machine `virt` too, and theirs is not this one.
pub fn is_arm_virt(arch: Option<&str>, machine: &str) -> bool {
    let arm = arch.is_none_or(|a| matches!(a, "aarch64" | "armv7l" | "armv6l"));
    arm && (machine == "virt" || machine.starts_with("virt-"))
}

#[cfg(test)]
mod grace_gates {
    use super::*;

    #[test]
    fn smmu_per_bus_from_11_10_and_acpi_nodeset_from_12_0() {
        let v = |s: &str| s.parse::<LibvirtVersion>().unwrap();
        assert!(!v("11.9.0").has_smmu_pci_bus() && v("11.10.0").has_smmu_pci_bus());
        assert!(!v("11.10.0").has_acpi_nodeset() && v("12.0.0").has_acpi_nodeset());
    }

    #[test]
    fn arm_virt_is_virt_or_a_versioned_virt_on_arm() {
        assert!(is_arm_virt(None, "virt") && is_arm_virt(Some("aarch64"), "virt-9.2"));
        assert!(!is_arm_virt(None, "q35") && !is_arm_virt(None, "pc-q35-7.2"));
        assert!(!is_arm_virt(None, "virtio") && !is_arm_virt(Some("aarch64"), "sbsa-ref"));
        assert!(!is_arm_virt(Some("riscv64"), "virt"));
    }
}
