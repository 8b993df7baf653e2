//! The pipeline's entry on embedded example hosts: the spec's merge refusals, the forms
//! decided per target, and what is said in order.

use super::spec::{VmFlags, VmSpec};
use super::*;
use vfio_p2p_config::vm::VmConfig;
use vfio_p2p_config::vm_boot::DirectKernel;
use vfio_p2p_model::vmm::OVERRIDE_SINCE;
use vfio_p2p_read::synth;

fn topo(example: &str) -> Topology {
    Topology::from_record(&synth::example(example).unwrap())
}

fn flags(target: VmTarget) -> VmFlags {
    VmFlags::new(target)
}

/// The plan of `spec` on `topo` with a libvirt version `libvirt`, and what it said.
fn plan_of<'a>(
    topo: &'a Topology,
    spec: &'a VmSpec,
    libvirt: Result<LibvirtVersion, String>,
    fabric: &'a Fabric,
    config: &'a HostConfig,
) -> (VmPlan<'a>, Vec<Said>) {
    let inputs = VmInputs {
        host: Host {
            topo,
            fabric,
            config,
        },
        iommu: None,
        qemu_version: None,
        libvirt_version: libvirt,
        incus: None,
    };
    let mut said = Vec::new();
    let p = plan(&inputs, spec, &mut |s| said.push(s)).unwrap();
    (p, said)
}

#[test]
fn flags_a_target_does_not_take_are_refused_when_applied() {
    let mut f = flags(VmTarget::Libvirt);
    f.format = true;
    let e = VmSpec::apply(VmConfig::default(), f).unwrap_err();
    assert!(e.to_string().starts_with("--format applies to qemu"), "{e}");
    let mut f = flags(VmTarget::Qemu);
    f.as_is = true;
    assert!(VmSpec::apply(VmConfig::default(), f).is_err());
    // incus lays the guest out flat whatever vm.yaml says
    let s = VmSpec::apply(VmConfig::default(), flags(VmTarget::Incus)).unwrap();
    assert_eq!(s.config.guest_topology, GuestTopology::Flat);
}

#[test]
fn libvirt_of_unknown_version_is_written_for_override_since_with_a_warning() {
    let t = topo("dual-socket-pcie");
    let spec = VmSpec::apply(VmConfig::default(), flags(VmTarget::Libvirt)).unwrap();
    let (fabric, host) = (Fabric::default(), HostConfig::default());
    let (p, said) = plan_of(&t, &spec, Err("no virsh".into()), &fabric, &host);
    assert_eq!(p.form, TargetForm::Libvirt(OVERRIDE_SINCE));
    let last = said.last().unwrap();
    assert!(
        matches!(last, Said::Warning(w) if w.starts_with("no virsh: libvirt's version is unknown")),
        "{said:?}"
    );
    let v81 = "8.1".parse().unwrap();
    let (p, said) = plan_of(&t, &spec, Ok(v81), &fabric, &host);
    assert_eq!(p.form, TargetForm::Libvirt(v81));
    assert!(
        said.iter()
            .any(|s| matches!(s, Said::Warning(w) if w.contains("has no <qemu:override>"))),
        "{said:?}"
    );
}

#[test]
fn cloud_hypervisor_puts_every_device_on_its_root_bus() {
    let t = topo("dual-socket-pcie");
    let spec = VmSpec::apply(VmConfig::default(), flags(VmTarget::CloudHypervisor)).unwrap();
    let (fabric, host) = (Fabric::default(), HostConfig::default());
    let (p, said) = plan_of(&t, &spec, Ok(OVERRIDE_SINCE), &fabric, &host);
    assert_eq!(p.form, TargetForm::CloudHypervisor);
    assert!(p.layout.bridges.is_empty() && p.layout.numa_nodes.is_empty());
    assert!(p.layout.gpus.iter().all(|g| g.guest.bus == 0));
    assert!(!said
        .iter()
        .any(|s| matches!(s, Said::Warning(w) if w.contains("boots nothing"))));
    // the VM boots nothing (no kernel, no firmware: uefi): refused when the spec is validated
    let refused = spec.validate(&[], false, &mut |_| {}).unwrap_err();
    assert!(
        refused
            .to_string()
            .contains("Cloud Hypervisor boots nothing"),
        "{refused}"
    );
    // a kernel and its initramfs boot: no disk needed, nothing said
    let mut config = VmConfig::default();
    config.boot.kernel = Some(DirectKernel {
        kernel: "/boot/vmlinuz".into(),
        initramfs: Some("/boot/initrd.img".into()),
        cmdline: None,
    });
    let direct = VmSpec::apply(config, flags(VmTarget::CloudHypervisor)).unwrap();
    let mut said = Vec::new();
    direct.validate(&[], false, &mut |s| said.push(s)).unwrap();
    assert!(said.is_empty(), "{said:?}");
    let mut said = Vec::new();
    let no_kernel = VmSpec::apply(VmConfig::default(), flags(VmTarget::Qemu)).unwrap();
    no_kernel
        .validate(&[], false, &mut |s| said.push(s))
        .unwrap();
    assert!(
        said.iter()
            .any(|s| matches!(s, Said::Warning(w) if w.contains("has no disks"))),
        "{said:?}"
    );
    // the same VM for QEMU mirrors the host's switches
    let spec = VmSpec::apply(VmConfig::default(), flags(VmTarget::Qemu)).unwrap();
    let (p, _) = plan_of(&t, &spec, Ok(OVERRIDE_SINCE), &fabric, &host);
    assert!(!p.layout.bridges.is_empty());
    assert_eq!(p.gpus.len(), 8);
    assert_eq!(p.expectation.gpus.len(), 8);
}

/// The guest kind follows the host's CPU: x86 → q35, aarch64 with a Grace superchip GPU →
/// the Grace guest, aarch64 with PCIe GPUs → an Arm PCIe guest (the x86 tree, a high
/// window, no Grace pieces); Cloud Hypervisor gets no machine but not q35's address rules.
#[test]
fn the_guest_kind_follows_the_host_arch() {
    let (fabric, host) = (Fabric::default(), HostConfig::default());
    let kinds = |example: &str, target: VmTarget| {
        let t = topo(example);
        let spec = VmSpec::apply(VmConfig::default(), flags(target)).unwrap();
        let (p, _) = plan_of(&t, &spec, Ok(OVERRIDE_SINCE), &fabric, &host);
        let window = p.arm_pcie.as_ref().and_then(|a| a.highmem_mmio_size);
        let shape = (p.layout.bridges.len(), p.layout.numa_nodes.len());
        (
            p.form,
            p.grace.is_some(),
            p.arm_pcie.is_some(),
            window,
            shape,
        )
    };
    let (form, grace, arm, _, _) = kinds("dual-socket-pcie", VmTarget::Qemu);
    assert_eq!((form, grace, arm), (TargetForm::Qemu, false, false));
    let (form, grace, arm, _, _) = kinds("gh200", VmTarget::Qemu);
    assert_eq!((form, grace, arm), (TargetForm::QemuGrace, true, false));
    let (form, grace, arm, window, (bridges, nodes)) = kinds("altra-pcie", VmTarget::Qemu);
    assert_eq!((form, grace, arm), (TargetForm::QemuArmPcie, false, true));
    // 4 GPUs in 256 GiB slots and 32 GiB for the rest: a 2 TiB power of two
    assert_eq!(window, Some(2048 << 30));
    // 2 expanders, 2 root ports, 2 switches of an upstream and 2 downstream ports
    assert_eq!((bridges, nodes), (2 + 2 + 2 * 3, 1));
    let (form, _, arm, _, _) = kinds("altra-pcie", VmTarget::Libvirt);
    assert_eq!(
        (form, arm),
        (TargetForm::LibvirtArmPcie(OVERRIDE_SINCE), true)
    );
    let (form, _, arm, _, _) = kinds("altra-pcie", VmTarget::CloudHypervisor);
    assert_eq!((form, arm), (TargetForm::CloudHypervisor, false));
    // the NCCL file describes GPUs, whatever the arch
    let (form, _, arm, _, _) = kinds("altra-pcie", VmTarget::Nccl);
    assert_eq!((form, arm), (TargetForm::Nccl, false));
}

/// An aarch64 host's libvirt domain is not told about `<maxphysaddr>`, an x86 element.
#[test]
fn an_arm_domain_of_an_old_libvirt_is_not_told_of_maxphysaddr() {
    let (fabric, host) = (Fabric::default(), HostConfig::default());
    let said = |example: &str| {
        let t = topo(example);
        let spec = VmSpec::apply(VmConfig::default(), flags(VmTarget::Libvirt)).unwrap();
        let (_, said) = plan_of(&t, &spec, Ok("8.1".parse().unwrap()), &fabric, &host);
        said.iter()
            .any(|s| matches!(s, Said::Warning(w) if w.contains("<maxphysaddr>")))
    };
    assert!(said("dual-socket-pcie"));
    assert!(!said("altra-pcie"));
}
