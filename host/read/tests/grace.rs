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
            memory_nodes: vec![1]
        })
    );
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
    host.numa_nodes.insert(2, String::new());
    host.numa_nodes.insert(3, String::new());
    let topo = Topology::from_record(&host);
    assert_eq!(
        c2c_gpus(&topo).values().next().unwrap().memory_nodes,
        [1, 2, 3]
    );
}
