use std::collections::BTreeMap;
use std::path::Path;

use super::*;
use crate::guest_layout::{decide_with_nics, LayoutOptions};
use vfio_p2p_model::Topology;
use vfio_p2p_read::synth;

fn config(yaml: &str) -> VmConfig {
    VmConfig::parse(yaml, Path::new("vm.yaml")).unwrap()
}

/// dual-socket-pcie's first `n` GPUs (each with its audio function) in a mirror layout,
/// every one in clique `clique`.
fn layout(n: usize, clique: Option<u8>) -> (Topology, GuestLayout) {
    let topo = Topology::from_record(&synth::example("dual-socket-pcie").unwrap());
    let gpus: Vec<Bdf> = topo.gpus().map(|g| g.bdf).take(n).collect();
    let cliques: BTreeMap<Bdf, Option<u8>> = gpus.iter().map(|g| (*g, clique)).collect();
    let opts = LayoutOptions {
        topology: GuestTopology::Mirror,
        guest_numa: true,
    };
    let l = decide_with_nics(&topo, &gpus, &[], &cliques, opts).unwrap();
    (topo, l)
}

/// Every passed function's guest address, in `--device` order (host address order).
fn addresses(l: &GuestLayout) -> Vec<String> {
    let mut all: Vec<(Bdf, Bdf)> = Vec::new();
    for d in l.passed() {
        all.push((d.host, d.guest));
        all.extend(d.other_functions.iter().map(|f| (f.host, f.guest)));
    }
    all.sort();
    all.iter().map(|(_, g)| g.to_string()).collect()
}

/// CH numbers its root bus in creation order: its console when gen writes none (CH's
/// default `--console tty`), the disks, the NIC, the entropy device, the vsock, then each
/// passed function in `--device` order, a number of its own.
#[test]
fn guest_addresses_follow_the_virtio_devices_then_the_device_order() {
    let (_, mirror) = layout(2, Some(0));
    let cases = [
        ("name: a\nconsole: none\n", vec!["console", "rng"], 3),
        ("name: a\n", vec!["rng"], 2),
        (
            "name: a\ndisks:\n  - path: /i/a.raw\n  - path: /i/b.raw\nnetwork: {bridge: br0}\nverify: vsock\nvsock_cid: 3\nconsole: socket\n",
            vec!["disk", "disk", "net", "rng", "vsock"],
            6,
        ),
    ];
    for (yaml, virtio, first) in cases {
        let c = config(yaml);
        assert_eq!(virtio_devices(&c), virtio, "{yaml}");
        let ch = guest_layout(&c, &mirror).unwrap();
        let want: Vec<String> = (first..first + 4)
            .map(|d| format!("0000:00:{d:02x}.0"))
            .collect();
        assert_eq!(addresses(&ch), want, "{yaml}");
        // a GPU and its audio function: two numbers, the GPU first (its host function 0)
        assert_eq!(ch.gpus[0].other_functions[0].guest.device, first as u8 + 1);
        assert!(ch.bridges.is_empty() && ch.numa_nodes.is_empty());
        assert!(ch
            .passed()
            .all(|d| d.parent == ROOT_BUS && d.numa_node.is_none()));
        assert_eq!(ch.topology, GuestTopology::Flat);
        // the plan's cliques and host devices stay as they were
        let hosts = |l: &GuestLayout| -> Vec<(Bdf, Option<u8>)> {
            l.gpus.iter().map(|g| (g.host, g.clique)).collect()
        };
        assert_eq!(hosts(&ch), hosts(&mirror));
    }
}

/// 31 numbers for devices (0 is the host bridge): the last one fits, one more is refused.
#[test]
fn the_root_bus_holds_31_devices() {
    let (_, mut l) = layout(1, None);
    l.gpus[0].other_functions.clear();
    let gpu = l.gpus[0].clone();
    // rng and 30 passed functions: 0x01 to 0x1f
    l.gpus = vec![gpu.clone(); 30];
    let c = config("name: a\n");
    let ch = guest_layout(&c, &l).unwrap();
    assert_eq!(ch.gpus[29].guest, Bdf::new(0, 0, 0x1f, 0));
    l.gpus.push(gpu);
    let err = guest_layout(&c, &l).unwrap_err();
    assert_eq!(
        err,
        RootBusFull {
            virtio: vec!["rng"],
            passed: 31
        }
    );
    assert!(err.to_string().contains("has 31 device numbers"), "{err}");
}

fn refused(
    yaml: &str,
    backend: IommuBackend,
    clique: Option<u8>,
) -> Result<(), (Option<u64>, String)> {
    let (_, l) = layout(2, clique);
    refusal(&config(yaml), &l, backend).map_err(|r| (r.at.map(|a| a.line()), r.why.to_string()))
}

/// Each refusal names the vm.yaml line it is about; what CH takes passes.
#[test]
fn refuses_what_cloud_hypervisor_cannot_take_at_its_line() {
    let legacy = IommuBackend::Legacy;
    let cases = [
        (
            "name: a\ndisks:\n  - path: /i/a.raw\n    bus: sata\n",
            3,
            "Cloud Hypervisor has only virtio disks: /i/a.raw has `bus: sata`",
        ),
        (
            "name: a\ndisks:\n  - path: /i/ok.raw\n  - path: /i/a,b.raw\n",
            4,
            "cannot take a path with a comma in its options: /i/a,b.raw",
        ),
        (
            "name: a\nnetwork:\n  mode: user\n",
            3,
            "Cloud Hypervisor has no user-mode networking",
        ),
        (
            "name: a\nconsole: socket\nconsole_socket: /run/a,b.sock\n",
            3,
            "a comma in its options: /run/a,b.sock",
        ),
        (
            "name: a\ndisks:\n  - path: '/i/a\"b.raw'\n",
            3,
            "cannot take a path with '\"' in its options",
        ),
        (
            "name: a\ndisks:\n  - path: /i/a[1].raw\n",
            3,
            "cannot take a path with '[' in its options",
        ),
    ];
    for (yaml, line, why) in cases {
        let (at, text) = refused(yaml, legacy, None).unwrap_err();
        assert_eq!(at, Some(line), "{yaml}");
        assert!(text.contains(why), "{text}");
    }
    let fine = "name: a\ndisks:\n  - path: /i/a.raw\n    readonly: true\nnetwork: {bridge: br0}\nconsole: socket\nconsole_socket: /run/a.sock\n";
    assert_eq!(refused(fine, legacy, Some(0)), Ok(()));
    assert_eq!(
        refused("name: a\nnetwork: {mode: none}\n", legacy, None),
        Ok(())
    );
}

/// Under iommufd CH cannot map peer BARs: cliques are refused there, and only there.
#[test]
fn refuses_cliques_under_iommufd() {
    let (at, text) = refused("name: a\n", IommuBackend::Iommufd, Some(3)).unwrap_err();
    assert_eq!(at, None);
    assert!(
        text.contains("the 1 P2P clique(s) would be advertised"),
        "{text}"
    );
    assert_eq!(refused("name: a\n", IommuBackend::Iommufd, None), Ok(()));
    assert_eq!(refused("name: a\n", IommuBackend::Legacy, Some(3)), Ok(()));
}
