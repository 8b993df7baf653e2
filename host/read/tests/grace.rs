//! Grace superchips in the model (`model::grace`): the C2C GPUs and their memory's NUMA
//! nodes, on the gh200 example (the model crate cannot use the read crate's examples).

use pci_config::Bdf;
use vfio_p2p_model::grace::{c2c_gpus, C2cGpu};
use vfio_p2p_model::Topology;

#[test]
fn the_gh200_gpu_is_c2c_with_its_memory_node() {
    let topo = Topology::from_record(&vfio_p2p_read::synth::example("gh200").unwrap());
    let c2c = c2c_gpus(&topo);
    let gpu: Bdf = "0009:01:00.0".parse().unwrap();
    assert_eq!(
        c2c.get(&gpu),
        Some(&C2cGpu {
            superchip: "GH200",
            memory_nodes: (1..=8).collect()
        })
    );
    let gpu = &c2c[&gpu];
    assert_eq!(
        (gpu.memory_node(), gpu.companions()),
        (Some(1), &[2, 3, 4, 5, 6, 7, 8][..])
    );
}

/// A GB200 tray: 2 CPU nodes, then 8 nodes per GPU in PCI order; one SMMU each; NVLink-5.
#[test]
fn the_gb200_tray_shares_its_34_nodes_out_by_8_in_pci_order() {
    let host = vfio_p2p_read::synth::example("gb200").unwrap();
    assert_eq!(host.numa_nodes.len(), 34);
    assert_eq!(host.numa_distances.len(), 34);
    let topo = Topology::from_record(&host);
    let c2c = c2c_gpus(&topo);
    let firsts: Vec<Option<u32>> = c2c.values().map(|g| g.memory_node()).collect();
    assert_eq!(firsts, [Some(2), Some(10), Some(18), Some(26)]);
    assert!(c2c
        .values()
        .all(|g| g.superchip == "GB200" && g.companions().len() == 7));
    assert_eq!(topo.numa_distance(0, 2), Some(20));
    assert_eq!(topo.numa_distance(0, 18), Some(40));
    assert_eq!(topo.numa_distance(5, 5), Some(10));
    let smmus: std::collections::BTreeSet<&String> = topo.iommu_units.values().collect();
    assert_eq!(smmus.len(), 4);
}

/// The same GPU ID on an x86 host is a PCIe card's, not a superchip's.
#[test]
fn an_x86_host_has_no_c2c() {
    let mut host = vfio_p2p_read::synth::example("gh200").unwrap();
    host.cpu = Some(vfio_p2p_read::synth::x86_cpu("GenuineIntel", 6, 143));
    assert!(c2c_gpus(&Topology::from_record(&host)).is_empty());
}

/// A lone GPU owns every memory-only node (GH200's MIG ranges once onlined).
#[test]
fn a_lone_gpu_owns_every_memory_only_node() {
    let mut host = vfio_p2p_read::synth::example("gh200").unwrap();
    host.numa_nodes.insert(9, String::new());
    host.numa_nodes.insert(10, String::new());
    let topo = Topology::from_record(&host);
    assert_eq!(
        c2c_gpus(&topo).values().next().unwrap().memory_nodes,
        (1..=10).collect::<Vec<u32>>()
    );
}
