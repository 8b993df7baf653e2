//! What the guest should see: the expectation handed to the guest agent through fw_cfg
//! (`vfio_p2p_contract::FW_CFG_NAME`), built from the plan's guest layout. The format and
//! its version rule live in the `vfio-p2p-contract` crate, shared with the agent.
//!
//! `path` is the host's PCIe path label (`nvidia-smi topo -m` without NVLink), `guest_path`
//! the label the emitted guest tree gives the pair (`guest_paths`); `verdict` is
//! `p2p` when the two GPUs share a clique or are joined by NVLink.

use vfio_p2p_contract::{Expectation, ExpectedFabric, ExpectedGpu, ExpectedPair, Verdict};

use super::guest_layout::GuestLayout;
use super::guest_paths;
use vfio_p2p_model::fabric::{Fabric, FabricModel};
use vfio_p2p_model::Topology;

/// The expectation for VM `vm` laid out as `layout` on `topo`.
pub fn for_layout(vm: &str, topo: &Topology, layout: &GuestLayout) -> Expectation {
    let mut e = Expectation::new(vm);
    e.gpus = layout
        .gpus
        .iter()
        .map(|g| ExpectedGpu {
            host_bdf: g.host,
            guest_bdf: g.guest,
            clique: g.clique,
            vendor: g.vendor.into(),
            device: g.device.into(),
            module_id: None,
            numa_nodes: Vec::new(),
        })
        .collect();
    for (i, j, guest) in guest_paths::guest_labels(topo, layout) {
        let (a, b) = (&layout.gpus[i], &layout.gpus[j]);
        {
            let path = topo.path(&a.host, &b.host);
            let same_clique = a.clique.is_some() && a.clique == b.clique;
            e.pairs.push(ExpectedPair {
                a: a.guest,
                b: b.guest,
                verdict: if same_clique || path.nvlink.is_some() {
                    Verdict::P2p
                } else {
                    Verdict::NoP2p
                },
                path: path.kind.label().to_string(),
                nvlink: path.nvlink,
                guest_path: Some(guest.kind.label().to_string()),
            });
        }
    }
    e
}

/// Adds the fabric the VM was planned on: under shared NVSwitch when its GPUs are one of
/// FM's partitions (the partition id and each GPU's module id), under full passthrough
/// when it has the whole baseboard (module ids where FM's table tells them); nothing
/// otherwise, and the agent then checks no fabric.
pub fn add_fabric(e: &mut Expectation, topo: &Topology, fabric: &Fabric) {
    let hosts: Vec<_> = e.gpus.iter().map(|g| g.host_bdf).collect();
    let (model, partition) = match (fabric.model, &fabric.state) {
        (Some(FabricModel::SharedNvswitch), Some(state)) => match state.partition_of(&hosts) {
            Some(p) => (FabricModel::SharedNvswitch, Some(p.id)),
            None => return,
        },
        (Some(FabricModel::FullPassthrough), _)
            if super::fabric::takes_whole_baseboard(topo, &hosts) =>
        {
            (FabricModel::FullPassthrough, None)
        }
        _ => return,
    };
    if let Some(state) = &fabric.state {
        for g in &mut e.gpus {
            g.module_id = state.module_id(&g.host_bdf);
        }
    }
    e.fabric = Some(ExpectedFabric {
        model: model.name().to_string(),
        partition_id: partition,
        fm_version: fabric.state.as_ref().and_then(|s| s.fm_version.clone()),
    });
}

/// Adds a Grace guest's NUMA shape: the node count and distances the guest will list, and
/// each GPU's nodes (memory node, then companions). Only Grace guests carry it, so other
/// expectations keep their bytes.
pub fn add_grace_numa(e: &mut Expectation, grace: &crate::grace_guest::GraceGuest) {
    e.numa = Some(vfio_p2p_contract::ExpectedNuma {
        nodes: grace.node_count,
        distances: grace.distances.clone(),
    });
    for g in &mut e.gpus {
        if let Some(n) = grace.gpus.iter().find(|n| n.host == g.host_bdf) {
            g.numa_nodes = n.nodes.iter().map(|n| n.id).collect();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guest_layout::{self, LayoutOptions};
    use pci_config::Bdf;
    use vfio_p2p_model::fabric::Fabric;
    use vfio_p2p_read::synth;

    fn expect(model: FabricModel, gpus: impl Fn(&Fabric) -> Vec<Bdf>) -> Expectation {
        let mut topo = Topology::from_record(&synth::example("hgx-h100").unwrap());
        crate::nvlink::apply_nvswitch_fabric(&mut topo);
        let all: Vec<Bdf> = topo.gpus().map(|g| g.bdf).collect();
        let mut state = synth::example_fabric("hgx-h100", &all).unwrap();
        state.fm_version = Some("580.159.04".into());
        let fabric = Fabric {
            model: Some(model),
            state: Some(state),
            source: "test".into(),
            unreachable: None,
        };
        let gpus = gpus(&fabric);
        let layout = guest_layout::decide_with_nics(
            &topo,
            &gpus,
            &[],
            &Default::default(),
            LayoutOptions {
                topology: vfio_p2p_config::vm::GuestTopology::Flat,
                guest_numa: false,
            },
        )
        .unwrap();
        let mut e = for_layout("vm", &topo, &layout);
        add_fabric(&mut e, &topo, &fabric);
        e
    }

    #[test]
    fn a_partition_carries_its_id_module_ids_and_fm_version() {
        let part = |f: &Fabric| f.state.as_ref().unwrap().partitions[3].bdfs().unwrap();
        let e = expect(FabricModel::SharedNvswitch, part);
        let f = e.fabric.unwrap();
        assert_eq!(
            (f.model.as_str(), f.partition_id),
            ("shared-nvswitch", Some(3))
        );
        assert_eq!(f.fm_version.as_deref(), Some("580.159.04"));
        let mut modules: Vec<_> = e.gpus.iter().map(|g| g.module_id.unwrap()).collect();
        modules.sort_unstable();
        assert_eq!(modules, [1, 3]);
        // Not a partition: no fabric, no module ids.
        let mixed = |f: &Fabric| {
            let s = f.state.as_ref().unwrap();
            vec![
                s.partitions[3].bdfs().unwrap()[0],
                s.partitions[5].bdfs().unwrap()[0],
            ]
        };
        let e = expect(FabricModel::SharedNvswitch, mixed);
        assert!(e.fabric.is_none() && e.gpus.iter().all(|g| g.module_id.is_none()));
    }

    #[test]
    fn full_passthrough_of_the_whole_board_has_no_partition_id() {
        let all = |f: &Fabric| f.state.as_ref().unwrap().partitions[0].bdfs().unwrap();
        let e = expect(FabricModel::FullPassthrough, all);
        let f = e.fabric.unwrap();
        assert_eq!(
            (f.model.as_str(), f.partition_id),
            ("full-passthrough", None)
        );
        assert_eq!(e.gpus.len(), 8);
        let half = |f: &Fabric| f.state.as_ref().unwrap().partitions[1].bdfs().unwrap();
        assert!(expect(FabricModel::FullPassthrough, half).fabric.is_none());
    }
}
