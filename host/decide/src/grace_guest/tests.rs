use std::collections::BTreeMap;

use super::*;
use crate::guest_layout::{self, LayoutOptions};
use vfio_p2p_config::vm::GuestTopology;
use vfio_p2p_read::synth;

fn v(major: u32, minor: u32) -> Option<QemuVersion> {
    Some(QemuVersion::release(major, minor))
}

fn flat(topo: &Topology) -> GuestLayout {
    let gpus: Vec<Bdf> = topo.gpus().map(|g| g.bdf).collect();
    let opts = LayoutOptions {
        topology: GuestTopology::Flat,
        guest_numa: false,
    };
    guest_layout::decide(topo, &gpus, &BTreeMap::new(), opts).unwrap()
}

fn example(name: &str) -> Topology {
    Topology::from_record(&synth::example(name).unwrap())
}

fn pieces(topo: &Topology, qemu: Option<QemuVersion>) -> QemuPieces {
    qemu_pieces(qemu, window(topo, &flat(topo))).unwrap().0
}

fn grace(topo: &Topology, qemu: Option<QemuVersion>) -> (GuestLayout, GraceGuest, Vec<String>) {
    decide(topo, flat(topo), 16384, pieces(topo, qemu)).unwrap()
}

#[test]
fn gh200_cpu_node_first_then_the_gpus_8_nodes_with_the_hosts_distances() {
    let topo = example("gh200");
    let (layout, g, warnings) = grace(&topo, v(11, 1));
    assert_eq!(warnings, Vec::<String>::new());
    assert_eq!(layout.numa_nodes.len(), 1);
    assert_eq!(
        (layout.numa_nodes[0].id, layout.numa_nodes[0].host_node),
        (0, 0)
    );
    assert_eq!(g.node_count, 9);
    let ids: Vec<(u32, u32)> = g.gpus[0]
        .nodes
        .iter()
        .map(|n| (n.id, n.host_node))
        .collect();
    assert_eq!(ids, (1..=8).map(|n| (n, n)).collect::<Vec<_>>());
    assert!(g.distances_from_host);
    for (i, row) in g.distances.iter().enumerate() {
        for (j, d) in row.iter().enumerate() {
            assert_eq!(Some(*d), topo.numa_distance(i as u32, j as u32));
        }
    }
    assert_eq!(g.hugepage_kib, Some(512 * 1024));
    assert_eq!(g.highmem_mmio_size, Some(512 << 30));
}

#[test]
fn gb200_one_pxb_and_vsmmu_per_physical_smmu_and_34_nodes() {
    let topo = example("gb200");
    let (layout, g, _) = grace(&topo, v(11, 1));
    assert_eq!(g.node_count, 34);
    assert_eq!(g.smmu_form, SmmuForm::PerPhysical);
    assert_eq!(g.smmus.len(), 4);
    assert_eq!(g.smmus[2].primary_bus, "pcie.3");
    assert_eq!(
        g.smmus[2].host_unit.as_deref(),
        Some("smmu3.0x0000100011000000")
    );
    // GPU 2's memory node is guest node 2 + 2*8 = 18 (host 18): 40 from CPU node 0, 20 from 1
    assert_eq!(
        g.gpus[2].nodes[0],
        GraceNode {
            id: 18,
            host_node: 18
        }
    );
    assert_eq!((g.distances[0][18], g.distances[1][18]), (40, 20));
    // the expanders come first, each GPU's root port below its own, the GPU below that
    let pxb = layout.bridge("pcie.3").unwrap();
    assert!(matches!(
        pxb.kind,
        GuestBridgeKind::Expander {
            numa_node: Some(1),
            ..
        }
    ));
    assert_eq!(pxb.bus, 3 * EXPANDER_BUS_STRIDE);
    let gpu = &layout.gpus[2];
    let port = layout.bridge(&gpu.parent).unwrap();
    assert_eq!((port.parent.as_str(), port.bus), ("pcie.3", pxb.bus + 1));
    assert_eq!(gpu.guest.bus, pxb.bus + 1);
    let first_port = layout
        .bridges
        .iter()
        .position(|b| b.id == gpu.parent)
        .unwrap();
    assert!(
        layout
            .bridges
            .iter()
            .position(|b| b.id == "pcie.3")
            .unwrap()
            < first_port
    );
    // 4 GPUs of 256 GiB + 32 MiB BARs: 4 × 512 GiB slots, 2 TiB and the headroom → 4 TiB
    assert_eq!(g.highmem_mmio_size, Some(4 << 40));
}

#[test]
fn gpus_behind_one_smmu_share_one_vsmmu() {
    let mut host = synth::example("gb200").unwrap();
    let unit = host.iommu_units.values().next().unwrap().clone();
    for u in host.iommu_units.values_mut() {
        *u = unit.clone();
    }
    let topo = Topology::from_record(&host);
    let (layout, g, _) = grace(&topo, v(11, 1));
    assert_eq!(g.smmus.len(), 1);
    let ports: Vec<(&str, u8, u8)> = layout
        .gpus
        .iter()
        .map(|d| layout.bridge(&d.parent).unwrap())
        .map(|p| (p.parent.as_str(), p.slot, p.bus))
        .collect();
    let b = EXPANDER_BUS_STRIDE;
    assert_eq!(
        ports,
        [
            ("pcie.1", 0, b + 1),
            ("pcie.1", 1, b + 2),
            ("pcie.1", 2, b + 3),
            ("pcie.1", 3, b + 4)
        ]
    );
}

#[test]
fn a_gpu_without_an_smmu_link_gets_its_own_vsmmu_and_a_warning() {
    let mut host = synth::example("gb200").unwrap();
    host.iommu_units.clear();
    let topo = Topology::from_record(&host);
    let (_, g, warnings) = grace(&topo, v(11, 1));
    assert_eq!(g.smmus.len(), 4);
    assert!(g.smmus.iter().all(|s| s.host_unit.is_none()));
    assert_eq!(warnings.iter().filter(|w| w.contains("no SMMU")).count(), 4);
}

#[test]
fn a_gpu_the_host_shows_fewer_nodes_for_is_refused_naming_it() {
    let mut host = synth::example("gh200").unwrap();
    for n in 2..=8 {
        host.numa_nodes.remove(&n);
    }
    let topo = Topology::from_record(&host);
    let e = decide(&topo, flat(&topo), 16384, pieces(&topo, v(11, 1))).unwrap_err();
    assert!(
        matches!(e, GraceError::MissingNodes { found: 1, .. }),
        "{e}"
    );
    assert!(
        e.to_string()
            .starts_with("0009:01:00.0: the host shows 1 NUMA node(s)"),
        "{e}"
    );
}

#[test]
fn without_host_distances_the_guest_gets_qemus_and_a_warning() {
    let mut host = synth::example("gh200").unwrap();
    host.numa_distances.clear();
    let topo = Topology::from_record(&host);
    let (_, g, warnings) = grace(&topo, v(11, 1));
    assert!(!g.distances_from_host);
    assert_eq!(
        (g.distances[0][0], g.distances[0][1], g.distances[3][3]),
        (10, 20, 10)
    );
    assert!(warnings[0].contains("nodeN/distance"), "{warnings:?}");
}

#[test]
fn hugepages_only_on_a_64k_kernel_and_ram_in_whole_pages() {
    let topo = example("gb200");
    let e = decide(&topo, flat(&topo), 16384 + 512, pieces(&topo, v(11, 1))).unwrap_err();
    assert!(
        matches!(e, GraceError::HugepageFit { multiple: 1024, .. }),
        "{e}"
    );
    let mut host = synth::example("gb200").unwrap();
    host.hugepage_sizes_kib = vec![2048, 1048576];
    let topo = Topology::from_record(&host);
    let (_, g, _) = decide(&topo, flat(&topo), 16384 + 512, pieces(&topo, v(11, 1))).unwrap();
    assert_eq!(g.hugepage_kib, None);
}

#[test]
fn version_gates() {
    let big = 4u64 << 40;
    // no generic initiators before 9.0: refused, naming the version needed
    let e = qemu_pieces(v(8, 2), HIGHMEM_MMIO_DEFAULT).unwrap_err();
    assert!(
        e.to_string()
            .contains("QEMU >= 9.0.0 for acpi-generic-initiator"),
        "{e}"
    );
    assert!(qemu_pieces(v(9, 0), HIGHMEM_MMIO_DEFAULT).is_ok());
    // no highmem-mmio-size before 10.0: fine while the BARs fit 512 GiB, refused beyond
    let (p, _) = qemu_pieces(v(9, 2), HIGHMEM_MMIO_DEFAULT).unwrap();
    assert!(!p.highmem_mmio_size);
    let e = qemu_pieces(v(9, 2), big).unwrap_err();
    assert!(
        e.to_string()
            .contains("QEMU >= 10.0.0 for highmem-mmio-size"),
        "{e}"
    );
    assert!(qemu_pieces(v(10, 0), big).unwrap().0.highmem_mmio_size);
    // one SMMU for the machine before 10.2, with a warning; one per physical SMMU from 10.2
    let (p, w) = qemu_pieces(v(10, 1), big).unwrap();
    assert_eq!(p.smmu_form, SmmuForm::MachineWide);
    assert!(w[0].contains("iommu=smmuv3"), "{w:?}");
    let (p, w) = qemu_pieces(v(10, 2), big).unwrap();
    assert_eq!((p.smmu_form, w.len()), (SmmuForm::PerPhysical, 0));
    // unknown: the newest forms and a warning saying which QEMU they need
    let (p, w) = qemu_pieces(None, big).unwrap();
    assert_eq!(p.smmu_form, SmmuForm::PerPhysical);
    assert!(w[0].contains("--qemu"), "{w:?}");
}

#[test]
fn machine_wide_form_keeps_root_ports_on_pcie0() {
    let topo = example("gb200");
    let (layout, g, _) = grace(&topo, v(10, 1));
    assert!(g.smmus.is_empty());
    assert!(layout.bridges.iter().all(|b| b.parent == ROOT_BUS));
    assert_eq!(g.node_count, 34);
}

#[test]
fn only_an_aarch64_host_with_a_superchip_gpu_is_grace() {
    let topo = example("gh200");
    let gpus: Vec<Bdf> = topo.gpus().map(|g| g.bdf).collect();
    assert!(is_grace(&topo, &gpus));
    assert!(!is_grace(&topo, &[]));
    let mut host = synth::example("gh200").unwrap();
    host.cpu = Some(synth::x86_cpu("GenuineIntel", 6, 143));
    assert!(!is_grace(&Topology::from_record(&host), &gpus));
    let x86 = example("hgx-h100");
    let all: Vec<Bdf> = x86.gpus().map(|g| g.bdf).collect();
    assert!(!is_grace(&x86, &all));
}

#[test]
fn the_expectation_lists_each_gpus_nodes_and_the_guest_distances() {
    let topo = example("gb200");
    let (layout, g, _) = grace(&topo, v(11, 1));
    let mut e = crate::expectation::for_layout("vm", &topo, &layout);
    assert_eq!(e.numa, None);
    crate::expectation::add_grace_numa(&mut e, &g);
    let numa = e.numa.as_ref().unwrap();
    assert_eq!((numa.nodes, numa.distances.len()), (34, 34));
    assert_eq!(e.gpus[1].numa_nodes, (10..18).collect::<Vec<u32>>());
    // the contract's own consistency rule accepts it
    let back = vfio_p2p_contract::Expectation::from_json(&e.to_json()).unwrap();
    assert_eq!(back, e);
}

#[test]
fn more_nodes_than_debians_arm64_kernel_takes_are_warned_of() {
    // gh200 (9 nodes) is warned of nothing: gh200_cpu_node_first_... above
    let topo = example("gb200");
    let (_, g, warnings) = grace(&topo, v(11, 1));
    assert_eq!(g.node_count, 34);
    let w: Vec<&String> = warnings
        .iter()
        .filter(|w| w.contains("NUMA nodes"))
        .collect();
    assert_eq!(w.len(), 1, "{warnings:?}");
    assert!(
        w[0].contains("34 NUMA nodes") && w[0].contains("CONFIG_NODES_SHIFT=6"),
        "{}",
        w[0]
    );
    assert_eq!(node_limit_warning(16), None);
    assert!(node_limit_warning(17)
        .unwrap()
        .contains("CONFIG_NODES_SHIFT=5"));
}
