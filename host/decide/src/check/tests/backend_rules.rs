//! The IOMMU backend's rules (`check::backend_rules`): iommufd asked for, and cliques over
//! iommufd.

use super::*;

/// iommufd facts: a kernel release, `/dev/iommu` and one VFIO cdev or none of them.
fn iommu(release: &str, present: bool) -> IommuFacts {
    IommuFacts {
        dev_iommu: if present {
            NodeProbe::Ok(())
        } else {
            NodeProbe::Absent("/dev/iommu".into())
        },
        vfio_cdevs: if present {
            NodeProbe::Ok(vec!["vfio0".into()])
        } else {
            NodeProbe::Absent("/dev/vfio/devices".into())
        },
        kernel_release: Some(release.into()),
        kernel_config: None,
    }
}

#[test]
fn iommufd_asked_for_on_a_kernel_without_it_fails_with_the_fix() {
    let t = Topology::from_record(&host(false, Some(ACS_ISOLATING)));
    let g = &gpus(&t)[..2];
    let mut facts = live_ok(&t, g);
    facts.iommu = iommu("6.12.57+deb13-amd64", false);
    let mut vmm = qemu("QEMU emulator version 10.0.3");
    let r = run(&t, g, &facts, &vmm);
    let c = find(&r, "iommu-backend", None);
    assert_eq!(c.status, Status::Pass);
    assert!(
        c.saw
            .starts_with("legacy for this VM; the host offers legacy only"),
        "{}",
        c.saw
    );
    vmm.iommu_backend = Some(vfio_p2p_config::vm::IommuBackend::Iommufd);
    let r = run(&t, g, &facts, &vmm);
    let c = find(&r, "iommu-backend", None);
    assert_eq!(c.status, Status::Fail);
    assert!(c.saw.contains("/dev/iommu does not exist"), "{}", c.saw);
    assert!(c.fix.as_ref().unwrap().contains("CONFIG_IOMMUFD"));
    assert_eq!(r.exit_code(), 2);
}

#[test]
fn iommufd_with_cliques_needs_bar_dmabuf_in_kernel_and_qemu() {
    let t = Topology::from_record(&host(false, Some(ACS_ISOLATING)));
    let g = &gpus(&t)[..2];
    let mut facts = live_ok(&t, g);
    let mut vmm = qemu("QEMU emulator version 10.0.3");
    vmm.iommu_backend = Some(vfio_p2p_config::vm::IommuBackend::Iommufd);
    // the switch pair: P2P stays below the switch, so a missing BAR mapping only warns
    facts.iommu = iommu("6.12.57+deb13-amd64", true);
    let c = find(&run(&t, g, &facts, &vmm), "iommufd-p2p", None).clone();
    assert_eq!(c.status, Status::Warn, "{c:?}");
    assert!(
        c.saw.contains("6.19") && c.saw.contains("QEMU 10.0.3"),
        "{}",
        c.saw
    );
    assert!(c.fix.as_ref().unwrap().contains("--iommu-backend legacy"));
    facts.iommu = iommu("7.2.0-lab", true);
    let new = qemu("QEMU emulator version 11.1.3");
    let mut new_vmm = new.clone();
    new_vmm.iommu_backend = vmm.iommu_backend;
    let c = find(&run(&t, g, &facts, &new_vmm), "iommufd-p2p", None).clone();
    assert_eq!(c.status, Status::Pass, "{c:?}");
    // auto: iommufd there, and the row says why
    new_vmm.iommu_backend = Some(vfio_p2p_config::vm::IommuBackend::Auto);
    let c = find(&run(&t, g, &facts, &new_vmm), "iommu-backend", None).clone();
    assert!(c.saw.contains("auto picks iommufd"), "{}", c.saw);
}
