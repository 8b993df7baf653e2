//! Checks of the IOMMU backend: which ones the host offers, whether the one asked for is
//! there, and whether the VM's P2P cliques survive iommufd (see [`crate::iommu_backend`]).

use super::facts::VmmFacts;
use super::report::{result, CheckResult, Status};
use crate::clique_plan::CliquePlan;
use crate::iommu_backend::{self, BarMapping, Offered};
use pci_config::PathKind;
use vfio_p2p_config::vm::IommuBackend;
use vfio_p2p_model::host_facts::HostFacts;

/// The `iommu-backend` row, and with iommufd and cliques the `iommufd-p2p` row.
/// Without a live host and without `--iommu-backend`, no rows (nothing to say).
pub(super) fn check_backend(
    host: &HostFacts,
    vmm: &VmmFacts,
    plan: Option<&CliquePlan>,
) -> Vec<CheckResult> {
    let offered = iommu_backend::iommufd_offered(&host.iommu);
    let requested = match (vmm.iommu_backend, &offered) {
        (Some(r), _) => r,
        (None, Offered::Unknown(_)) => return Vec::new(),
        (None, _) => IommuBackend::Legacy,
    };
    let bars = iommu_backend::bar_mapping(&host.iommu, vmm.qemu_version.as_ref());
    let has_cliques = plan.is_some_and(|p| !p.cliques.is_empty());
    let (backend, why) = iommu_backend::resolve(requested, &offered, &bars, has_cliques);
    let offers = match &offered {
        Offered::Yes(saw) => format!("legacy and iommufd ({saw})"),
        Offered::No { why, .. } => format!("legacy only ({why})"),
        Offered::Unknown(why) => format!("not probed: {why}"),
    };
    let chosen = match requested {
        IommuBackend::Auto => format!("; auto picks {backend}: {why}"),
        _ => String::new(),
    };
    let mut out = vec![match (backend, &offered) {
        (IommuBackend::Iommufd, Offered::No { why: _, fix }) => result(
            "iommu-backend",
            None,
            Status::Fail,
            format!("iommufd asked for; the host offers {offers}"),
            Some(fix.clone()),
        ),
        (IommuBackend::Iommufd, Offered::Unknown(_)) => result(
            "iommu-backend",
            None,
            Status::Skip,
            format!("iommufd asked for; {offers}"),
            Some("run `vfio-p2p check` on the host itself (--sysfs-root /)".into()),
        ),
        _ => result(
            "iommu-backend",
            None,
            Status::Pass,
            format!("{backend} for this VM; the host offers {offers}{chosen}"),
            None,
        ),
    }];
    if backend == IommuBackend::Iommufd {
        if let Some(p) = plan.filter(|_| has_cliques) {
            out.push(check_p2p(p, &bars));
        }
    }
    out
}

/// P2P through iommufd: peer BARs must be mapped into the IOAS, or peer writes that reach
/// the IOMMU fault. Cliques whose every pair stays below PCIe switches (PIX/PXB) only warn.
fn check_p2p(plan: &CliquePlan, bars: &BarMapping) -> CheckResult {
    let crossing = plan
        .pairs
        .iter()
        .filter(|p| p.clique.is_some() && p.nvlink.is_none())
        .any(|p| !matches!(p.path, PathKind::Pix | PathKind::Pxb | PathKind::X));
    let fix = format!(
        "use the legacy backend for this VM (--iommu-backend legacy, `iommu_backend: legacy`), or Linux >= {} with CONFIG_VFIO_PCI_DMABUF=y and QEMU >= {}",
        vfio_p2p_model::vmm::KernelVersion::BAR_DMABUF,
        vfio_p2p_model::vmm::QemuVersion::BAR_DMABUF
    );
    let cliques = plan.cliques.len();
    match bars {
        BarMapping::Works(w) => result(
            "iommufd-p2p",
            None,
            Status::Pass,
            format!("{cliques} clique(s): peer BARs are mapped as dma-bufs ({w})"),
            None,
        ),
        BarMapping::Fails(why) => result(
            "iommufd-p2p",
            None,
            if crossing { Status::Fail } else { Status::Warn },
            if crossing {
                format!("{cliques} clique(s) with P2P through the IOMMU, but peer BARs cannot be mapped: {why}; the guest would see the cliques and its peer writes would fault")
            } else {
                format!("{cliques} clique(s), all below PCIe switches, so P2P does not reach the IOMMU; but peer BARs cannot be mapped: {why}")
            },
            Some(fix),
        ),
        BarMapping::Unknown(why) => result(
            "iommufd-p2p",
            None,
            Status::Warn,
            format!("{cliques} clique(s) need peer BARs in the IOMMU; not known whether they can be mapped: {why}"),
            Some(fix),
        ),
    }
}
