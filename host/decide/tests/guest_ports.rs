//! Every passed GPU gets a root or downstream port of its own in the guest, in both
//! layouts and on every example host (docs/gen.md, "Guest layout and guest BDFs"): a GPU
//! sharing a bus with another device, or plugged straight into a root bus, is the flat
//! layout that broke CUDA start-up on B200 guests.

use std::collections::BTreeMap;

use vfio_p2p_config::vm::GuestTopology;
use vfio_p2p_decide::guest_layout::{decide, GuestBridgeKind, LayoutOptions};
use vfio_p2p_model::Topology;

#[test]
fn every_gpu_has_its_own_port() {
    for (example, _) in vfio_p2p_read::synth::EXAMPLES {
        let topo = Topology::from_record(&vfio_p2p_read::synth::example(example).unwrap());
        let gpus: Vec<_> = topo.gpus().map(|d| d.bdf).collect();
        let cliques = gpus.iter().map(|g| (*g, Some(0))).collect();
        for topology in [GuestTopology::Mirror, GuestTopology::Flat] {
            let opts = LayoutOptions {
                topology,
                guest_numa: true,
            };
            let l = decide(&topo, &gpus, &cliques, opts).unwrap();
            let mut on_bus: BTreeMap<&str, usize> = BTreeMap::new();
            for d in l.passed() {
                *on_bus.entry(d.parent.as_str()).or_default() += 1;
            }
            for g in &l.gpus {
                let port = l.bridge(&g.parent).map(|b| &b.kind);
                assert!(
                    matches!(
                        port,
                        Some(
                            GuestBridgeKind::RootPort { .. }
                                | GuestBridgeKind::SwitchDownstream { .. }
                        )
                    ),
                    "{example} {topology}: {} sits on {} ({port:?}), not on a port",
                    g.host,
                    g.parent
                );
                assert_eq!(
                    on_bus[g.parent.as_str()],
                    1,
                    "{example} {topology}: {} shares {} with another device",
                    g.host,
                    g.parent
                );
            }
        }
    }
}
