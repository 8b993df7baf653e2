use std::collections::BTreeMap;

use super::*;
use crate::clique_plan::{plan, PlanOptions};
use crate::mmio;
use vfio_p2p_model::host_facts::{HostFacts, IommuFacts, ModuleState, NodeProbe};
use vfio_p2p_model::HostRecord;

const GIB: u64 = 1 << 30;
use vfio_p2p_read::qemu_argv::read_qemu_args_text;
use vfio_p2p_read::synth::{Attach, EndpointSpec, HostBuilder, ACS_ISOLATING};

const A100: (u16, u16) = (0x10de, 0x20b2);

fn live_ok(topo: &Topology, gpus: &[Bdf]) -> HostFacts {
    HostFacts {
        vfio_pci: ModuleState::Loaded,
        vfio_container: NodeProbe::Ok(0),
        groups: gpus
            .iter()
            .filter_map(|g| topo.device(g).and_then(|d| d.iommu_group))
            .map(|g| (g, NodeProbe::Ok(true)))
            .collect(),
        kvm: NodeProbe::Ok(12),
        deep: BTreeMap::new(),
        iommu: IommuFacts::not_probed("test"),
        grace: vfio_p2p_model::host_facts::GraceFacts::not_probed("test"),
    }
}

/// One switch with two GPUs bound to vfio-pci (A100-like: MSI-X at 0xC8 when `msix`),
/// and a NIC on a third port whose ACS is `nic_port_acs`.
fn host(msix: bool, nic_port_acs: Option<u16>) -> HostRecord {
    let mut b = HostBuilder::new("test check");
    b.numa_node(0, "0-7");
    b.kernel_cmdline("root=/dev/sda intel_iommu=on iommu=pt");
    let hb = b.host_bridge(0, 0);
    let rp = b.root_port(hb, Some(0), Some(ACS_ISOLATING));
    let (_, dsps) = b.switch(rp, 2, Some(ACS_ISOLATING));
    let mut gpu = EndpointSpec::gpu(A100.0, A100.1, 64).with_driver(Some("vfio-pci"));
    gpu.msix_at_c8 = msix;
    for d in &dsps {
        b.endpoint(Attach::Below(*d), 0, &gpu, None);
    }
    let rp2 = b.root_port(hb, Some(0), nic_port_acs);
    let (_, nic_ports) = b.switch(rp2, 2, nic_port_acs);
    b.endpoint(Attach::Below(nic_ports[0]), 0, &gpu, None);
    b.endpoint(
        Attach::Below(nic_ports[1]),
        0,
        &EndpointSpec::nic(0x15b3, 0x1021),
        None,
    );
    b.build()
}

fn run(topo: &Topology, gpus: &[Bdf], host: &HostFacts, vmm: &VmmFacts) -> CheckReport {
    let p = plan(topo, gpus, &PlanOptions::default());
    run_checks(topo, gpus, host, vmm, &p)
}

fn find<'a>(r: &'a CheckReport, check: &str, subject: Option<&Bdf>) -> &'a CheckResult {
    r.checks
        .iter()
        .find(|c| c.check == check && c.subject == subject.map(Bdf::to_string))
        .unwrap_or_else(|| panic!("no {check} check in {:#?}", r.checks))
}

fn gpus(t: &Topology) -> Vec<Bdf> {
    t.gpus().map(|d| d.bdf).collect()
}

fn qemu(version: &str) -> VmmFacts {
    VmmFacts {
        qemu_version: Some(
            vfio_p2p_read::vmm::parse_qemu_version(version).ok_or("unparsed".to_string()),
        ),
        hole64: Some((1 << 40, "test".into())),
        ..VmmFacts::default()
    }
}

#[test]
fn healthy_host_passes_everything() {
    let t = Topology::from_record(&host(false, Some(ACS_ISOLATING)));
    let g = &gpus(&t)[..2];
    let r = run(&t, g, &live_ok(&t, g), &qemu("QEMU emulator version 8.2.2"));
    let not_pass: Vec<_> = r
        .checks
        .iter()
        .filter(|c| c.status != Status::Pass)
        .collect();
    assert!(not_pass.is_empty(), "{not_pass:#?}");
    assert_eq!(r.exit_code(), 0);
}

#[test]
fn msix_at_c8_needs_qemu_8_1() {
    let t = Topology::from_record(&host(true, Some(ACS_ISOLATING)));
    let g = &gpus(&t)[..2];
    let facts = live_ok(&t, g);
    let old = run(
        &t,
        g,
        &facts,
        &qemu("QEMU emulator version 7.2.0 (Debian 1:7.2+dfsg-7+deb12u6)"),
    );
    let c = find(&old, "clique-placement", Some(&g[0]));
    assert_eq!(c.status, Status::Fail);
    assert!(c.saw.contains("0xC8 taken"), "{}", c.saw);
    assert!(c.fix.as_ref().unwrap().contains("qemu-patches/qemu-7.2/"));
    assert_eq!(old.exit_code(), 2);
    let new = run(
        &t,
        g,
        &facts,
        &qemu("QEMU emulator version 8.2.2 (Debian 1:8.2.2+ds-0ubuntu1)"),
    );
    let c = find(&new, "clique-placement", Some(&g[0]));
    assert_eq!(c.status, Status::Pass);
    assert!(c.saw.contains("falls back to 0xD4"));
    let backport = run(
        &t,
        g,
        &facts,
        &qemu("QEMU emulator version 7.2.22 (Debian 1:7.2+dfsg-7+deb12u18+vfiop2p1)"),
    );
    let c = find(&backport, "clique-placement", Some(&g[0]));
    assert_eq!(c.status, Status::Pass, "{}", c.saw);
    assert!(c.saw.contains("backport"), "{}", c.saw);
    let ch = VmmFacts {
        vmm: Vmm::CloudHypervisor,
        ..qemu("")
    };
    let r = run(&t, g, &facts, &ch);
    assert_eq!(
        find(&r, "clique-placement", Some(&g[0])).status,
        Status::Pass
    );
    let unknown = run(&t, g, &facts, &VmmFacts::default());
    assert_eq!(
        find(&unknown, "clique-placement", Some(&g[0])).status,
        Status::Warn
    );
}

#[test]
fn cloud_hypervisor_fails_when_d4_is_taken() {
    let mut rec = host(false, Some(ACS_ISOLATING));
    let gpu = rec
        .devices
        .iter_mut()
        .find(|d| d.class >> 16 == 0x03)
        .unwrap();
    // Link a capability at 0xD4 after PCIe (0x40).
    gpu.config[0x41] = 0xd4;
    gpu.config[0xd4] = pci_config::CAP_ID_MSI;
    gpu.config[0xd5] = 0;
    let t = Topology::from_record(&rec);
    let g = &gpus(&t)[..2];
    let ch = VmmFacts {
        vmm: Vmm::CloudHypervisor,
        ..qemu("")
    };
    let r = run(&t, g, &live_ok(&t, g), &ch);
    let c = find(&r, "clique-placement", Some(&g[0]));
    assert_eq!(c.status, Status::Fail, "{c:?}");
    assert!(c.saw.contains("0xD4 taken"));
}

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
fn hidden_hypervisor_fails() {
    let hidden = |a: &str| {
        read_qemu_args_text(a)
            .hidden_hypervisor()
            .collect::<Vec<_>>()
    };
    assert_eq!(
        hidden("-machine q35 -cpu host,kvm=off,hv_vendor_id=x -m 8G"),
        ["QEMU argument -cpu host,kvm=off,hv_vendor_id=x"]
    );
    assert!(hidden("-cpu host -name kvm=off").is_empty());
    let hidden = vec!["vm.xml: <features><kvm><hidden state='on'/>".to_string()];
    let t = Topology::from_record(&host(false, Some(ACS_ISOLATING)));
    let g = &gpus(&t)[..2];
    let vmm = VmmFacts {
        hidden_hypervisor: hidden,
        ..qemu("QEMU emulator version 8.2.2")
    };
    let r = run(&t, g, &live_ok(&t, g), &vmm);
    assert_eq!(find(&r, "hypervisor-visible", None).status, Status::Fail);
}

#[test]
fn mmio_window_against_configuration() {
    let t = Topology::from_record(&host(false, Some(ACS_ISOLATING)));
    let g = &gpus(&t)[..2];
    let need = mmio::hole64_size(&g.iter().map(|b| t.device(b).unwrap()).collect::<Vec<_>>());
    assert_eq!(need, 2 * 128 * GIB + mmio::HEADROOM);
    let small = VmmFacts {
        hole64: read_qemu_args_text("-global q35-pcihost.pci-hole64-size=64G")
            .hole64
            .map(|(_, h)| (h, "--qemu-args".into())),
        ..VmmFacts::default()
    };
    let r = run(&t, g, &live_ok(&t, g), &small);
    let c = find(&r, "mmio-window", None);
    assert_eq!(c.status, Status::Fail);
    assert!(c.fix.as_ref().unwrap().contains("pci-hole64-size=288G"));
    assert!(c
        .fix
        .as_ref()
        .unwrap()
        .contains("X-PciMmio64Mb,string=294912"));
    let r = run(&t, g, &live_ok(&t, g), &VmmFacts::default());
    let unknown = find(&r, "mmio-window", None);
    assert_eq!(unknown.status, Status::Warn);
    assert!(unknown.saw.contains("not known here"), "{}", unknown.saw);
    // A domain was given and sets no hole: QEMU's default applies, and it is too small.
    let given = VmmFacts {
        vm_config: Some("the domain vm.xml".into()),
        ..VmmFacts::default()
    };
    let r = run(&t, g, &live_ok(&t, g), &given);
    let c = find(&r, "mmio-window", None);
    assert_eq!(c.status, Status::Fail);
    assert!(
        c.saw.contains("the domain vm.xml sets no 64-bit MMIO hole")
            && c.saw.contains("QEMU's default (32 GiB) is too small"),
        "{}",
        c.saw
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
fn non_root_view_warns_instead_of_guessing() {
    let t = Topology::from_record(&host(true, Some(ACS_ISOLATING)).unprivileged_view());
    let g = &gpus(&t)[..2];
    let r = run(&t, g, &live_ok(&t, g), &qemu("QEMU emulator version 7.2.0"));
    let c = find(&r, "clique-placement", Some(&g[0]));
    assert_eq!(c.status, Status::Warn);
    assert!(c.fix.as_ref().unwrap().contains("as root"));
    assert_eq!(find(&r, "p2p-plan", None).status, Status::Warn);
    assert_eq!(r.exit_code(), 1);
}

#[test]
fn untranslated_plan_fails() {
    let mut b = HostBuilder::new("rr cleared");
    let hb = b.host_bridge(0, 0);
    let rp = b.root_port(hb, Some(0), Some(ACS_ISOLATING));
    let (_, dsps) = b.switch(rp, 2, Some(pci_config::AcsFlags::SV));
    let gpu = EndpointSpec::gpu(A100.0, A100.1, 64).with_driver(Some("vfio-pci"));
    for d in dsps {
        b.endpoint(Attach::Below(d), 0, &gpu, None);
    }
    let t = Topology::from_record(&b.build());
    let g = gpus(&t);
    let r = run(
        &t,
        &g,
        &live_ok(&t, &g),
        &qemu("QEMU emulator version 8.2.2"),
    );
    let c = find(&r, "p2p-plan", None);
    assert_eq!(c.status, Status::Fail);
    assert!(c.saw.contains("untranslated"), "{}", c.saw);
}

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
fn skipped_rows_leave_the_overall_status_and_exit_code_alone() {
    let row = |status| super::report::result("kvm", None, status, "saw".into(), None);
    let skipped_only = CheckReport::new(vec![row(Status::Skip), row(Status::Skip)]);
    assert_eq!(
        (skipped_only.status, skipped_only.exit_code()),
        (Status::Pass, 0)
    );
    let with_pass = CheckReport::new(vec![row(Status::Skip), row(Status::Pass)]);
    assert_eq!((with_pass.status, with_pass.exit_code()), (Status::Pass, 0));
    let with_warn = CheckReport::new(vec![row(Status::Skip), row(Status::Warn)]);
    assert_eq!((with_warn.status, with_warn.exit_code()), (Status::Warn, 1));
    let mut extended = CheckReport::new(vec![row(Status::Pass)]);
    extended.extend(vec![row(Status::Skip)]);
    assert_eq!(extended.exit_code(), 0);
}

#[test]
fn checks_bus_reset_warning_names_what_the_bind_would_reset_below_a_bridge() {
    let (mut topo, a, behind) = crate::reset::tests::deep_host();
    topo.devices.get_mut(&a).unwrap().reset_methods = Some(vec!["bus".into()]);
    let gpu = topo.device(&a).unwrap().clone();
    let row = super::host_rules::check_reset(&topo, &gpu);
    assert!(
        row.saw
            .contains(&format!("a bus reset also resets {behind}")),
        "{}",
        row.saw
    );
}
