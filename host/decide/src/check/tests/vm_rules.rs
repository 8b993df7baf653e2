//! The VM's rules (`check::vm_rules`): where the clique capability goes, a visible
//! hypervisor, the 64-bit MMIO window, the P2P plan.

use super::*;

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

/// An Arm `virt` VM (a Grace guest): the GPUs' BARs go in the high PCIe window that
/// `highmem-mmio-size` sets, 512 GiB when not set; q35's 32 GiB default never applies.
#[test]
fn mmio_window_of_an_arm_virt_machine() {
    let t = Topology::from_record(&host(false, Some(ACS_ISOLATING)));
    let g = &gpus(&t)[..2]; // 288 GiB needed
    let virt = |args: &str| {
        let argv = read_qemu_args_text(args);
        VmmFacts {
            arm_virt: argv.is_arm_virt(),
            hole64: argv.highmem_mmio.map(|(_, h)| (h, "--qemu-args".into())),
            vm_config: Some("--qemu-args".into()),
            ..VmmFacts::default()
        }
    };
    let default = virt("-machine virt,gic-version=3");
    let c = find(&run(&t, g, &live_ok(&t, g), &default), "mmio-window", None).clone();
    assert_eq!(c.status, Status::Pass, "{}", c.saw);
    assert!(
        c.saw
            .contains("Arm virt's default high PCIe window sets 512 GiB"),
        "{}",
        c.saw
    );
    let small = virt("-machine virt,highmem-mmio-size=256G");
    let c = find(&run(&t, g, &live_ok(&t, g), &small), "mmio-window", None).clone();
    assert_eq!(c.status, Status::Fail, "{}", c.saw);
    let fix = c.fix.unwrap();
    assert!(
        fix.contains("-machine virt,highmem-mmio-size=512G") && !fix.contains("pci-hole64"),
        "{fix}"
    );
    // more than virt's default: the next power of two (QEMU refuses others)
    let fix = super::super::vm_rules::virt_window_fix(544 * GIB, &ConfigSyntax::Qemu);
    assert!(fix.contains("highmem-mmio-size=1024G"), "{fix}");
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

/// No VM definition given: an aarch64 host's VMs are `virt` machines, so the fix names
/// virt's high window, never q35's hole or OVMF's; an x86 host's names q35's.
#[test]
fn an_arm_hosts_window_fix_is_virts_without_a_vm_given() {
    let fix_on = |arch| {
        let mut rec = host(false, Some(ACS_ISOLATING));
        rec.cpu = Some(vfio_p2p_model::CpuIdentity {
            arch,
            vendor: None,
            family: None,
            model: None,
            phys_bits: None,
        });
        let t = Topology::from_record(&rec);
        let g = &gpus(&t)[..2];
        let r = run(&t, g, &live_ok(&t, g), &VmmFacts::default());
        let c = find(&r, "mmio-window", None);
        assert_eq!(c.status, Status::Warn, "{}", c.saw);
        c.fix.clone().unwrap()
    };
    let arm = fix_on(vfio_p2p_model::CpuArch::Arm64);
    assert!(
        arm.contains("-machine virt,highmem-mmio-size=512G") && !arm.contains("q35"),
        "{arm}"
    );
    let x86 = fix_on(vfio_p2p_model::CpuArch::X86_64);
    assert!(x86.contains("q35-pcihost.pci-hole64-size"), "{x86}");
}
