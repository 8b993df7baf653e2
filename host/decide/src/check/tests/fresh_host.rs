//! A fresh host (GPUs still on `nvidia`): the group and VFIO rules when the VM's starter
//! binds the GPUs, and when nobody does.

use super::*;

/// A fresh host: the GPUs still on `nvidia`, no `/dev/vfio/N` yet; `host(false, None)`
/// puts the third GPU in one group with a NIC on mlx5_core.
fn fresh(acs: Option<u16>) -> (Topology, HostFacts) {
    let mut rec = host(false, acs);
    for d in rec.devices.iter_mut().filter(|d| d.class >> 16 == 0x03) {
        d.driver = Some("nvidia".into());
    }
    let t = Topology::from_record(&rec);
    let all = gpus(&t);
    let mut facts = live_ok(&t, &all);
    for p in facts.groups.values_mut() {
        *p = NodeProbe::Absent("/dev/vfio/N".into());
    }
    (t, facts)
}

fn started_by(devices: &[Bdf]) -> VmmFacts {
    VmmFacts {
        bound_at_start: StartBinding {
            by: "libvirt (managed='yes')".into(),
            devices: devices.to_vec(),
        },
        ..qemu("QEMU emulator version 8.2.2")
    }
}

#[test]
fn a_fresh_host_passes_when_the_starter_binds_the_gpus() {
    let (t, facts) = fresh(Some(ACS_ISOLATING));
    let g = &gpus(&t)[..2];
    let r = run(&t, g, &facts, &started_by(g));
    for gpu in g {
        let c = find(&r, "iommu-group", Some(gpu));
        assert_eq!(c.status, Status::Pass, "{c:?}");
        assert!(c.saw.contains("libvirt (managed='yes') binds"), "{}", c.saw);
        assert!(c.saw.contains("nvidia-persistenced"), "{}", c.saw);
        let c = find(&r, "vfio-group", Some(gpu));
        assert_eq!(c.status, Status::Pass, "{c:?}");
        assert!(c.saw.contains("does not exist yet"), "{}", c.saw);
    }
    assert_eq!(r.exit_code(), 0, "{:#?}", r.checks);
}

#[test]
fn a_fresh_host_fails_when_nobody_binds_the_gpus() {
    // an unmanaged hostdev (or no VM definition): nobody binds them at start
    let (t, facts) = fresh(Some(ACS_ISOLATING));
    let g = &gpus(&t)[..2];
    let r = run(&t, g, &facts, &started_by(&g[..1]));
    assert_eq!(find(&r, "iommu-group", Some(&g[0])).status, Status::Pass);
    assert_eq!(find(&r, "iommu-group", Some(&g[1])).status, Status::Fail);
    assert_eq!(find(&r, "vfio-group", Some(&g[1])).status, Status::Fail);
    assert_eq!(r.exit_code(), 2);
}

#[test]
fn a_group_member_the_starter_does_not_bind_still_fails() {
    // the GPU shares its group with a NIC on mlx5_core that the VM is not given: libvirt
    // detaches the GPU, and the group stays unviable
    let (t, facts) = fresh(None);
    let gpu = gpus(&t)[2];
    let r = run(&t, &[gpu], &facts, &started_by(&[gpu]));
    let c = find(&r, "iommu-group", Some(&gpu));
    assert_eq!(c.status, Status::Fail, "{c:?}");
    assert!(c.saw.contains("bound to mlx5_core"), "{}", c.saw);
    assert_eq!(find(&r, "vfio-group", Some(&gpu)).status, Status::Fail);
}
