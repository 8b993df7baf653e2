//! `check`'s rules, tested by the rule module they belong to (`host_rules`, `vm_rules`,
//! `backend_rules`) and by the surface of a fresh host (GPUs still on `nvidia` until the
//! VM's starter binds them); here the hosts they run on and the whole report.

mod backend_rules;
mod fresh_host;
mod host_rules;
mod vm_rules;

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
