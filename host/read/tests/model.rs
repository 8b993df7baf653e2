//! The model built from what the readers and the example hosts produce: the model crate
//! cannot use them in its own tests (the read crate depends on it).

use pci_config::Bdf;
use vfio_p2p_model::{AcsUnknown, DeviceKind, NicRef, Topology};
use vfio_p2p_read::synth::{Attach, EndpointSpec, HostBuilder};

#[test]
fn nvlink_captures_are_recorded_only_for_this_hosts_gpus() {
    let text = include_str!("../../../tests/fixtures/nvidia-smi/h200x2-topo-m.txt");
    let map = vfio_p2p_read::nvidia_smi::parse(text, "h200x2-topo-m.txt").unwrap();
    let b = |s: &str| s.parse::<Bdf>().unwrap();
    let mut topo = Topology::from_record(&vfio_p2p_read::synth::example("flat-vm").unwrap());
    topo.add_nvlinks(&map).unwrap();
    assert_eq!(
        topo.path(&b("0000:00:06.0"), &b("0000:00:07.0")).label(),
        "NV18"
    );
    let mut other =
        Topology::from_record(&vfio_p2p_read::synth::example("dual-socket-pcie").unwrap());
    let e = other.add_nvlinks(&map).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("h200x2-topo-m.txt: names GPU 0000:00:06.0"),
        "{e}"
    );
    assert!(other.nvlinks.is_empty());
}

/// Issue 15 #7: a loop in the extended list is named (device, offset) and leaves the
/// ACS state unknown; an intact list without ACS is absence.
#[test]
fn a_capability_loop_leaves_acs_unknown_not_absent() {
    let mut host = vfio_p2p_read::synth::example("lab").unwrap();
    let port: Bdf = "0000:02:00.0".parse().unwrap();
    let intact = Topology::from_record(&host.clone());
    assert!(intact
        .device(&port)
        .unwrap()
        .capability_list_error
        .is_none());
    let r = host.devices.iter_mut().find(|d| d.bdf == port).unwrap();
    r.config[0x100..0x104].copy_from_slice(&(0x0001u32 | 1 << 16 | 0x100 << 20).to_le_bytes());
    let topo = Topology::from_record(&host);
    let d = topo.device(&port).unwrap();
    assert_eq!(d.acs, None);
    assert!(matches!(
        d.acs_unknown(),
        Some(AcsUnknown::CorruptCapabilityList(e)) if e.contains("loops back to 0x100")
    ));
    assert!(topo.warnings.iter().any(|w| w
        .to_string()
        .starts_with("0000:02:00.0: corrupt capability list")));
}

#[test]
fn bmc_vga_is_not_a_gpu_but_other_display_controllers_are() {
    let mut b = HostBuilder::new("bmc");
    let hb = b.host_bridge(0, 0);
    let display = |vendor, device, class| EndpointSpec {
        class,
        ..EndpointSpec::gpu(vendor, device, 1)
    };
    let at = Attach::HostBridge(hb);
    b.endpoint(at, 0, &display(0x1a03, 0x2000, 0x030000), None);
    b.endpoint(at, 0, &display(0x102b, 0x0536, 0x030000), None);
    b.endpoint(at, 0, &display(0x1234, 0x1111, 0x038000), None);
    b.endpoint(at, 0, &display(0x1002, 0x740f, 0x038000), None);
    b.endpoint(at, 0, &display(0x10de, 0x2330, 0x030200), None);
    let topo = Topology::from_record(&b.build());
    let gpus: Vec<u16> = topo.gpus().map(|g| g.vendor).collect();
    assert_eq!(gpus, [0x1234, 0x1002, 0x10de]);
    assert_eq!(topo.gpus().filter(|g| g.is_nvidia_gpu()).count(), 1);
}

#[test]
fn resolves_names_on_hgx_h100() {
    let topo = Topology::from_record(&vfio_p2p_read::synth::example("hgx-h100").unwrap());
    let by_rdma = topo.resolve_nic(&NicRef::Name("mlx5_0".into())).unwrap();
    let d = topo.device(&by_rdma).unwrap();
    assert_eq!(d.kind, DeviceKind::Nic);
    let net = topo.nic_names[&by_rdma].net[0].clone();
    assert_eq!(topo.resolve_nic(&NicRef::Name(net)).unwrap(), by_rdma);
    let err = topo.resolve_nic(&NicRef::Name("eth9".into())).unwrap_err();
    assert!(
        err.contains("'eth9'") && err.contains("PCI address"),
        "{err}"
    );
    let gpu = topo.gpus().next().unwrap().bdf;
    assert!(topo
        .resolve_nic(&NicRef::Bdf(gpu))
        .unwrap_err()
        .contains("class 02"));
    let twice = [NicRef::Name("mlx5_0".into()), NicRef::Bdf(by_rdma)];
    assert_eq!(topo.resolve_nics(&twice).unwrap(), vec![by_rdma]);
}
