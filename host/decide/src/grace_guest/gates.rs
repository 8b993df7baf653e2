//! Which QEMU writes which piece of a Grace guest: refused below the version that has it,
//! or replaced by the older form with a warning.

use serde::Serialize;

use super::{GraceError, HIGHMEM_MMIO_DEFAULT};
use vfio_p2p_model::vmm::QemuVersion;

/// How the guest's SMMUv3 is given.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SmmuForm {
    /// One `-device arm-smmuv3,primary-bus=pcie.N` per physical SMMU, on the `pxb-pcie` that
    /// holds the GPUs behind it (QEMU >= 10.2).
    PerPhysical,
    /// One SMMUv3 for the whole machine (`-machine virt,iommu=smmuv3`), the GPUs' root ports
    /// on `pcie.0`: what QEMU before 10.2 has.
    MachineWide,
}

/// What the QEMU that will run the VM takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QemuPieces {
    pub smmu_form: SmmuForm,
    /// Whether `-machine virt,highmem-mmio-size=` may be written.
    pub highmem_mmio_size: bool,
}

/// The pieces QEMU `version` takes for a guest whose GPUs' BARs need `window` bytes, with
/// a warning for each older form; refused where no form works. An unknown version gets
/// the newest forms and a warning saying which QEMU they need.
pub fn qemu_pieces(
    version: Option<QemuVersion>,
    window: u64,
) -> Result<(QemuPieces, Vec<String>), GraceError> {
    let Some(v) = version else {
        let warning = format!(
            "the QEMU that runs this VM is not known (gen --qemu PATH asks its version): writing for QEMU >= {} (acpi-generic-initiator: >= {}, highmem-mmio-size: >= {}); older QEMU refuses these options",
            QemuVersion::SMMUV3_PER_BUS,
            QemuVersion::GENERIC_INITIATOR,
            QemuVersion::HIGHMEM_MMIO_SIZE
        );
        let newest = QemuPieces {
            smmu_form: SmmuForm::PerPhysical,
            highmem_mmio_size: true,
        };
        return Ok((newest, vec![warning]));
    };
    if v < QemuVersion::GENERIC_INITIATOR {
        return Err(GraceError::QemuTooOld {
            found: v,
            needed: QemuVersion::GENERIC_INITIATOR,
            what: "acpi-generic-initiator, which ties each GPU to its NUMA nodes",
        });
    }
    let highmem_mmio_size = v >= QemuVersion::HIGHMEM_MMIO_SIZE;
    if !highmem_mmio_size && window > HIGHMEM_MMIO_DEFAULT {
        return Err(GraceError::QemuTooOld {
            found: v,
            needed: QemuVersion::HIGHMEM_MMIO_SIZE,
            what: "highmem-mmio-size, for GPU BARs beyond virt's fixed 512 GiB window",
        });
    }
    let mut warnings = Vec::new();
    let smmu_form = if v >= QemuVersion::SMMUV3_PER_BUS {
        SmmuForm::PerPhysical
    } else {
        warnings.push(format!(
            "QEMU {v} has no arm-smmuv3 per PCIe root complex (QEMU >= {}): the guest gets one SMMUv3 for the whole machine (-machine virt,iommu=smmuv3) and its GPUs' root ports on pcie.0, whatever SMMUs they sit behind on the host",
            QemuVersion::SMMUV3_PER_BUS
        ));
        SmmuForm::MachineWide
    };
    Ok((
        QemuPieces {
            smmu_form,
            highmem_mmio_size,
        },
        warnings,
    ))
}
