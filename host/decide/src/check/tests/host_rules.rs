//! The host's rules (`check::host_rules`): IOMMU groups, the VFIO and KVM probes, the
//! IOMMU itself, reset methods, vhost_vsock.

use super::*;

#[test]
fn gpu_sharing_its_group_with_a_nic() {
    // No ACS on the second switch: GPU and NIC end up in one group.
    let t = Topology::from_record(&host(false, None));
    let all = gpus(&t);
    let gpu = all[2];
    let members = t.group_members(&gpu);
    let nic = *members
        .iter()
        .find(|m| t.device(m).unwrap().kind == vfio_p2p_model::DeviceKind::Nic)
        .unwrap();
    let r = run(
        &t,
        &[gpu],
        &live_ok(&t, &[gpu]),
        &qemu("QEMU emulator version 8.2.2"),
    );
    let c = find(&r, "iommu-group", Some(&gpu));
    assert_eq!(c.status, Status::Fail, "{c:?}");
    assert!(
        c.saw.contains(&format!("{nic} bound to mlx5_core")),
        "{}",
        c.saw
    );
    assert!(c.fix.as_ref().unwrap().contains("same VM"));
}

#[test]
fn group_with_unbound_foreign_member_warns() {
    let mut rec = host(false, None);
    for d in rec.devices.iter_mut().filter(|d| d.class >> 16 == 0x02) {
        d.driver = None;
    }
    let t = Topology::from_record(&rec);
    let gpu = gpus(&t)[2];
    let r = run(
        &t,
        &[gpu],
        &live_ok(&t, &[gpu]),
        &qemu("QEMU emulator version 8.2.2"),
    );
    assert_eq!(find(&r, "iommu-group", Some(&gpu)).status, Status::Warn);
}

#[test]
fn probe_outcomes() {
    let t = Topology::from_record(&host(false, Some(ACS_ISOLATING)));
    let g = &gpus(&t)[..2];
    let mut facts = live_ok(&t, g);
    facts.vfio_container = NodeProbe::Absent("/x/dev/vfio/vfio".into());
    let group = t.device(&g[0]).unwrap().iommu_group.unwrap();
    facts.groups.insert(group, NodeProbe::Ok(false));
    facts.kvm = NodeProbe::Error("/dev/kvm: create the KVM-VFIO device: No such device".into());
    facts.vfio_pci = ModuleState::Missing("nowhere".into());
    facts.deep.insert(g[1], NodeProbe::Ok(false));
    let r = run(&t, g, &facts, &qemu("QEMU emulator version 8.2.2"));
    let c = find(&r, "vfio-container", None);
    assert_eq!(c.status, Status::Fail);
    assert!(c.saw.contains("/x/dev/vfio/vfio does not exist"));
    assert_eq!(find(&r, "vfio-group", Some(&g[0])).status, Status::Fail);
    assert_eq!(find(&r, "vfio-group", Some(&g[1])).status, Status::Pass);
    assert_eq!(find(&r, "kvm", None).status, Status::Fail);
    assert_eq!(find(&r, "vfio-pci-module", None).status, Status::Fail);
    assert_eq!(
        find(&r, "vfio-device-open", Some(&g[1])).status,
        Status::Warn
    );
}

#[test]
fn no_iommu_fails_with_the_vendor_fix() {
    let mut rec = host(false, Some(ACS_ISOLATING));
    rec.kernel_cmdline = Some("root=/dev/sda".into());
    for d in &mut rec.devices {
        d.iommu_group = None;
    }
    let t = Topology::from_record(&rec);
    let g = &gpus(&t)[..2];
    let r = run(&t, g, &live_ok(&t, g), &qemu("QEMU emulator version 8.2.2"));
    let c = find(&r, "iommu", None);
    assert_eq!(c.status, Status::Fail);
    assert!(c.fix.as_ref().unwrap().contains("intel_iommu=on"));
    assert_eq!(find(&r, "iommu-group", Some(&g[0])).status, Status::Fail);
}

/// On AMD the fix names only what the kernel documents: the firmware turns the IOMMU on
/// (there is no `amd_iommu=on`), an `=off` option is removed, `iommu=pt` is the usual choice.
#[test]
fn no_iommu_on_amd_names_documented_options_only() {
    let mut rec = host(false, Some(ACS_ISOLATING));
    rec.kernel_cmdline = Some("root=/dev/sda amd_iommu=off".into());
    for d in &mut rec.devices {
        d.iommu_group = None;
        if d.vendor == 0x8086 {
            d.vendor = 0x1022;
        }
    }
    let t = Topology::from_record(&rec);
    let g = &gpus(&t)[..2];
    let r = run(&t, g, &live_ok(&t, g), &qemu("QEMU emulator version 8.2.2"));
    let fix = find(&r, "iommu", None).fix.clone().unwrap();
    assert!(
        !fix.contains("amd_iommu=on") && !fix.contains("iommu=on"),
        "{fix}"
    );
    assert!(
        fix.starts_with("remove amd_iommu=off from the kernel command line"),
        "{fix}"
    );
    assert!(
        fix.contains("firmware") && fix.contains("iommu=pt"),
        "{fix}"
    );
}

#[test]
fn reset_methods() {
    let mut rec = host(false, Some(ACS_ISOLATING));
    let g0 = rec
        .devices
        .iter()
        .find(|d| d.class >> 16 == 0x03)
        .unwrap()
        .bdf;
    for d in rec.devices.iter_mut().filter(|d| d.bdf == g0) {
        d.reset_method = Some(vec!["bus".into()]);
    }
    let t = Topology::from_record(&rec);
    let g = &gpus(&t)[..2];
    let r = run(&t, g, &live_ok(&t, g), &qemu("QEMU emulator version 8.2.2"));
    let c = find(&r, "reset", Some(&g[0]));
    assert_eq!(c.status, Status::Warn);
    assert!(c.saw.contains("no function-level reset"));
    assert_eq!(find(&r, "reset", Some(&g[1])).status, Status::Pass);
}

#[test]
fn the_vsock_module_check_fails_only_when_the_host_has_none() {
    let missing = check_vsock_module(&ModuleState::Missing("nowhere".into()));
    assert_eq!(missing.status, Status::Fail);
    assert!(missing.fix.as_ref().unwrap().contains("CONFIG_VHOST_VSOCK"));
    let available = check_vsock_module(&ModuleState::Available("vhost_vsock.ko".into()));
    assert_eq!(available.status, Status::Pass);
    assert!(available.saw.contains("/dev/vhost-vsock loads it"));
    assert_eq!(
        check_vsock_module(&ModuleState::Loaded).status,
        Status::Pass
    );
    assert_eq!(
        check_vsock_module(&ModuleState::Unknown("example".into())).status,
        Status::Skip
    );
}

#[test]
fn checks_bus_reset_warning_names_what_the_bind_would_reset_below_a_bridge() {
    let (mut topo, a, behind) = crate::reset::tests::deep_host();
    topo.devices.get_mut(&a).unwrap().reset_methods = Some(vec!["bus".into()]);
    let gpu = topo.device(&a).unwrap().clone();
    let row = crate::check::host_rules::check_reset(&topo, &gpu);
    assert!(
        row.saw
            .contains(&format!("a bus reset also resets {behind}")),
        "{}",
        row.saw
    );
}
