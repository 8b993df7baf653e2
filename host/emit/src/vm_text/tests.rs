//! The emitters from a [`VmPlan`]: a plan decided on an embedded example, then one
//! decision of it flipped, and what the emitter writes for each.

use super::*;
use vfio_p2p_config::host::HostConfig;
use vfio_p2p_config::vm::{IommuBackend, VmConfig};
use vfio_p2p_contract::CLIQUE_PROPERTY;
use vfio_p2p_decide::vm::incus::CliqueForm;
use vfio_p2p_decide::vm::spec::{VmFlags, VmSpec};
use vfio_p2p_decide::vm::{plan, Host, VmInputs, VmTarget};
use vfio_p2p_model::fabric::Fabric;
use vfio_p2p_model::Topology;
use vfio_p2p_read::synth;

fn spec(target: VmTarget) -> VmSpec {
    let flags = VmFlags::new(target);
    VmSpec::apply(VmConfig::default(), flags).unwrap()
}

/// `f` given the plan of `target` on dual-socket-pcie (8 GPUs, 4 cliques).
fn with_plan<R>(target: VmTarget, f: impl FnOnce(VmPlan) -> R) -> R {
    let topo = Topology::from_record(&synth::example("dual-socket-pcie").unwrap());
    let (fabric, host) = (Fabric::default(), HostConfig::default());
    let spec = spec(target);
    let inputs = VmInputs {
        host: Host {
            topo: &topo,
            fabric: &fabric,
            config: &host,
        },
        iommu: None,
        qemu_version: None,
        libvirt_version: Ok("9.0".parse().unwrap()),
        incus: None,
    };
    f(plan(&inputs, &spec, &mut |_| {}).unwrap())
}

fn text(plan: &VmPlan) -> String {
    render(plan, ExpectationSource::Inline, TextOptions::default()).0
}

#[test]
fn libvirt_writes_the_clique_form_of_the_version_decided() {
    with_plan(VmTarget::Libvirt, |mut p| {
        let new = text(&p);
        assert!(new.contains("<qemu:override>"), "{new}");
        assert!(!new.contains("<qemu:arg value='-set'/>"), "{new}");
        p.form = TargetForm::Libvirt("8.1".parse().unwrap());
        let old = text(&p);
        assert!(!old.contains("<qemu:override>"), "{old}");
        assert!(old.contains("<qemu:arg value='-set'/>"), "{old}");
    });
}

#[test]
fn incus_writes_cliques_where_the_form_decided_says() {
    with_plan(VmTarget::Incus, |mut p| {
        assert_eq!(p.form, TargetForm::Incus(CliqueForm::DeviceKey));
        let key = text(&p);
        assert!(key.contains("nvidia.clique:"), "{key}");
        assert!(!key.contains("raw.qemu.conf"), "{key}");
        p.form = TargetForm::Incus(CliqueForm::RawQemuConf);
        let raw = text(&p);
        assert!(!raw.contains("nvidia.clique:"), "{raw}");
        assert!(raw.contains("raw.qemu.conf"), "{raw}");
    });
}

#[test]
fn qemu_writes_the_backend_and_the_cliques_the_plan_decided() {
    with_plan(VmTarget::Qemu, |mut p| {
        let legacy = text(&p);
        assert!(!legacy.contains("iommufd0"), "{legacy}");
        assert_eq!(legacy.matches(CLIQUE_PROPERTY).count(), 8, "{legacy}");
        p.iommu_backend = IommuBackend::Iommufd;
        p.layout.gpus[0].clique = None;
        let iommufd = text(&p);
        assert!(iommufd.contains("iommufd,id=iommufd0"), "{iommufd}");
        assert_eq!(iommufd.matches(CLIQUE_PROPERTY).count(), 7, "{iommufd}");
    });
}

#[test]
fn cloud_hypervisor_passes_the_devices_in_the_plans_guest_order() {
    with_plan(VmTarget::CloudHypervisor, |mut p| {
        let first = p.layout.gpus[0].host.to_string();
        let last = p.layout.gpus[7].host.to_string();
        let before = text(&p);
        assert!(before.find(&first) < before.find(&last), "{before}");
        let (a, b) = (p.layout.gpus[0].guest, p.layout.gpus[7].guest);
        p.layout.gpus[0].guest = b;
        p.layout.gpus[7].guest = a;
        let after = text(&p);
        assert!(after.find(&first) > after.find(&last), "{after}");
    });
}
