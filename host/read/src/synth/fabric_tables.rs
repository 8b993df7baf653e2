//! Fabric Manager's partition tables of the embedded examples' boards, with each module
//! id mapped to the example's PCI address.
//!
//! HGX H100 8-GPU baseboard (also the HGX H200 board) in the shared NVSwitch model:
//! partition 0 = modules 1-8, 1 = 1-4, 2 = 5-8, 3 = {1, 3}, 4 = {2, 4}, 5 = {5, 7},
//! 6 = {6, 8}, 7-14 = modules 1-8 alone. NVIDIA publishes the table in the Fabric
//! Manager User Guide, "Shared NVSwitch Virtualization Model" → "GPU Partitions"
//! (docs.nvidia.com/datacenter/tesla/fabric-manager-user-guide/index.html#gpu-partitions);
//! that page's table could not be read from here, so the rows were taken from:
//! - partitions 0-4 as FM itself listed them on a real HGX host (NVIDIA's partitioner
//!   sample, columns "Partition ID / Number of GPUs / GPU Module ID / Max NVLinks/GPU")
//!   in OpenNebula's NVIDIA Fabric Manager guide (github.com/OpenNebula/website,
//!   content/product/cluster_configuration/hosts_and_clusters/one_fabricmanager.md);
//! - the full table 0-14 as reproduced from NVIDIA's HGX Shared NVSwitch GPU Passthrough
//!   Virtualization Integration Guide (WP-12736-002) in kubeswift's HGX fixture
//!   (github.com/kubeswift-io/kubeswift, internal/controller/swiftgpu/hgx_fixture_test.go);
//! - this project's GPU machines (each a VM on a shared-NVSwitch HGX H200): a 2-GPU VM
//!   held modules {1, 3}, 4-GPU VMs held {1, 2, 3, 4} and {5, 6, 7, 8}
//!   (/work/shared/fixtures/fabric/h100x4-partition).
//!
//! Multi-GPU partitions have all 18 NVLinks per GPU; a 1-GPU partition none (FM prints
//! `maxNumNvLinks` 0 for it in NVIDIA's published example).
//!
//! Module ids do not follow PCI order. The same integration guide's host lists its GPUs
//! in lspci order with modules 5, 7, 6, 8, 1, 3, 2, 4; the example's GPUs, in PCI order,
//! get those ids in turn. So each 2-GPU partition is the two GPUs of one PCIe switch
//! (modules 1 and 3 at 9d/9e, as that guide's 86/87), and the 4-GPU partitions are the
//! two sockets.

use pci_config::Bdf;

use vfio_p2p_model::fabric_state::FabricPartition;
use vfio_p2p_model::fabric_state::FabricState;
use vfio_p2p_model::fabric_state::PartitionGpu;

/// (partition id, module ids) of the HGX H100/H200 8-GPU baseboard.
const HGX_8GPU: &[(u32, &[u32])] = &[
    (0, &[1, 2, 3, 4, 5, 6, 7, 8]),
    (1, &[1, 2, 3, 4]),
    (2, &[5, 6, 7, 8]),
    (3, &[1, 3]),
    (4, &[2, 4]),
    (5, &[5, 7]),
    (6, &[6, 8]),
    (7, &[1]),
    (8, &[2]),
    (9, &[3]),
    (10, &[4]),
    (11, &[5]),
    (12, &[6]),
    (13, &[7]),
    (14, &[8]),
];

/// Module ids of the board's GPUs in PCI address order (see the module documentation).
const HGX_MODULES_IN_PCI_ORDER: [u32; 8] = [5, 7, 6, 8, 1, 3, 2, 4];

/// NVLinks per H100/H200 SXM GPU.
const HGX_H100_NVLINKS: u32 = 18;

/// FM's partitions of an example that has NVSwitches; `gpus` are the example's GPUs.
pub fn example_fabric(name: &str, gpus: &[Bdf]) -> Option<FabricState> {
    match name {
        "hgx-h100" => Some(hgx_8gpu(gpus)),
        _ => None,
    }
}

fn hgx_8gpu(gpus: &[Bdf]) -> FabricState {
    let mut sorted = gpus.to_vec();
    sorted.sort_unstable();
    let bdf_of = |module: u32| {
        HGX_MODULES_IN_PCI_ORDER
            .iter()
            .position(|m| *m == module)
            .and_then(|i| sorted.get(i).copied())
    };
    let partitions = HGX_8GPU
        .iter()
        .map(|(id, modules)| {
            let links = if modules.len() > 1 {
                HGX_H100_NVLINKS
            } else {
                0
            };
            FabricPartition {
                id: *id,
                gpus: modules
                    .iter()
                    .map(|m| PartitionGpu {
                        module_id: *m,
                        bdf: bdf_of(*m),
                        nvlinks_available: links,
                        nvlinks_max: links,
                    })
                    .collect(),
                active: false,
            }
        })
        .collect();
    FabricState {
        fm_version: None,
        partitions,
        unsupported: Vec::new(),
        nvlink_failed_gpus: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hgx_partitions_follow_the_guide_and_the_measured_vms() {
        let host = crate::synth::example("hgx-h100").unwrap();
        let topo = vfio_p2p_model::Topology::from_record(&host);
        let gpus: Vec<Bdf> = topo.gpus().map(|g| g.bdf).collect();
        let s = example_fabric("hgx-h100", &gpus).unwrap();
        let sizes: Vec<usize> = s.partitions.iter().map(|p| p.gpus.len()).collect();
        assert_eq!(sizes, [8, 4, 4, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1]);
        // Every module appears once per partition size, and every GPU has an address.
        for size in [8, 4, 2, 1] {
            let mut modules: Vec<u32> = s
                .partitions
                .iter()
                .filter(|p| p.gpus.len() == size)
                .flat_map(|p| p.gpus.iter().map(|g| g.module_id))
                .collect();
            modules.sort_unstable();
            assert_eq!(modules, (1..=8).collect::<Vec<_>>());
        }
        assert!(s.partitions.iter().all(|p| p.bdfs().is_some()));
        // The 2-GPU VM measured on the lent machines held modules {1, 3}: a partition.
        assert_eq!(s.partitions[3].module_list(), "1, 3");
        // Modules 1 and 3 share a PCIe switch here, as 86/87 do on NVIDIA's guide host.
        let p3 = s.partitions[3].bdfs().unwrap();
        assert_eq!(topo.path(&p3[0], &p3[1]).kind, pci_config::PathKind::Pix);
        assert_eq!(example_fabric("dual-socket-pcie", &gpus), None);
    }
}
