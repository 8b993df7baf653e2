//! Generated GPU servers of any size: sockets → host bridges → a top PCIe switch →
//! leaf switches → GPUs. Used by the placement benchmark and property tests, where
//! the hand-written examples are too small or too regular.

use super::{Attach, EndpointSpec, HostBuilder, ACS_ISOLATING};
use vfio_p2p_model::HostRecord;

/// One leaf switch and the GPUs below it: one per downstream port, each in its
/// own IOMMU group, or (`shared_group`) all as functions of one multi-function
/// device without ACS, which Linux puts in one IOMMU group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeafSpec {
    pub gpus: u8,
    pub shared_group: bool,
}

/// A host bridge: its root port carries one top switch with these leaf switches.
pub type HostBridgeSpec = Vec<LeafSpec>;

/// A server: per socket (NUMA node), its host bridges.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerSpec {
    pub sockets: Vec<Vec<HostBridgeSpec>>,
}

impl ServerSpec {
    /// `sockets × bridges × leaves × gpus` GPUs, every port isolating.
    pub fn uniform(sockets: usize, bridges: usize, leaves: usize, gpus: u8) -> Self {
        let leaf = LeafSpec {
            gpus,
            shared_group: false,
        };
        ServerSpec {
            sockets: vec![vec![vec![leaf; leaves]; bridges]; sockets],
        }
    }

    pub fn gpu_count(&self) -> usize {
        self.sockets
            .iter()
            .flatten()
            .flatten()
            .map(|l| usize::from(l.gpus))
            .sum()
    }
}

const SWITCH_GPU: (u16, u16) = (0x10de, 0x26b9);

/// Builds the server; host bridges get root buses 0x00, 0x20, 0x40… in socket order.
///
/// Panics when the spec needs more than 8 host bridges or 31 buses below one.
pub fn server(spec: &ServerSpec) -> HostRecord {
    server_with_nics(spec, 0)
}

/// The server with `nics` ConnectX-7 NICs beside the GPUs of each leaf switch (on ports
/// of their own, after the GPUs'), as HGX boards pair GPUs and NICs.
pub fn server_with_nics(spec: &ServerSpec, nics: u8) -> HostRecord {
    let mut b = HostBuilder::new("generated server");
    for socket in 0..spec.sockets.len() {
        b.numa_node(
            socket as u32,
            &format!("{}-{}", socket * 16, socket * 16 + 15),
        );
    }
    let mut bus: u16 = 0;
    for (socket, bridges) in spec.sockets.iter().enumerate() {
        let numa = Some(socket as u32);
        for leaves in bridges {
            let root_bus = u8::try_from(bus).expect("at most 8 host bridges");
            bus += 0x20;
            let hb = b.host_bridge(0, root_bus);
            let rp = b.root_port(hb, numa, Some(ACS_ISOLATING));
            let (_, top) = b.switch(rp, leaves.len(), Some(ACS_ISOLATING));
            for (port, leaf) in top.iter().zip(leaves) {
                let gpu = EndpointSpec::gpu(SWITCH_GPU.0, SWITCH_GPU.1, 48);
                if leaf.shared_group {
                    let (_, dsps) = b.switch(*port, 1, Some(ACS_ISOLATING));
                    for function in 0..leaf.gpus {
                        b.endpoint(Attach::Below(dsps[0]), function, &gpu, None);
                    }
                } else {
                    let ports = usize::from(leaf.gpus + nics);
                    let (_, dsps) = b.switch(*port, ports, Some(ACS_ISOLATING));
                    let (gpu_ports, nic_ports) = dsps.split_at(usize::from(leaf.gpus));
                    for d in gpu_ports {
                        b.endpoint(Attach::Below(*d), 0, &gpu, None);
                    }
                    for d in nic_ports {
                        let nic = EndpointSpec::nic(0x15b3, 0x1021);
                        b.endpoint(Attach::Below(*d), 0, &nic, None);
                    }
                }
            }
        }
    }
    b.build()
}

/// A big switched host: `switches` leaf switches of `gpus` GPUs each (every port
/// isolating, a group per GPU), `per_bridge` leaf switches below one top switch per host
/// bridge, the host bridges split evenly over `sockets` NUMA nodes. Each host bridge gets
/// a PCI domain of its own (root bus 0), as one domain's 256 buses hold about 25 such
/// switches. `switched(125, 21, 8, 2)`: 1,000 GPUs under 6 host bridges.
///
/// Panics when a host bridge needs more than 255 buses (`per_bridge × (gpus + 2) + 2`).
pub fn switched(switches: usize, per_bridge: usize, gpus: u8, sockets: usize) -> HostRecord {
    let mut b = HostBuilder::new("generated switched host");
    for socket in 0..sockets {
        b.numa_node(
            socket as u32,
            &format!("{}-{}", socket * 16, socket * 16 + 15),
        );
    }
    let bridges = switches.div_ceil(per_bridge);
    for bridge in 0..bridges {
        let leaves = per_bridge.min(switches - bridge * per_bridge);
        let numa = Some((bridge * sockets / bridges) as u32);
        let domain = u16::try_from(bridge).expect("at most 65,536 host bridges");
        let hb = b.host_bridge(domain, 0);
        let rp = b.root_port(hb, numa, Some(ACS_ISOLATING));
        let (_, top) = b.switch(rp, leaves, Some(ACS_ISOLATING));
        let gpu = EndpointSpec::gpu(SWITCH_GPU.0, SWITCH_GPU.1, 48);
        for port in top {
            let (_, dsps) = b.switch(port, usize::from(gpus), Some(ACS_ISOLATING));
            for d in dsps {
                b.endpoint(Attach::Below(d), 0, &gpu, None);
            }
        }
    }
    b.build()
}

#[cfg(test)]
mod tests {
    use super::*;
    use pci_config::PathKind;
    use vfio_p2p_model::Topology;

    #[test]
    fn uniform_server_has_the_requested_gpus_and_paths() {
        let spec = ServerSpec::uniform(2, 4, 2, 4);
        let topo = Topology::from_record(&server(&spec));
        let gpus: Vec<_> = topo.gpus().map(|g| g.bdf).collect();
        assert_eq!(gpus.len(), 64);
        assert_eq!(spec.gpu_count(), 64);
        assert_eq!(topo.path(&gpus[0], &gpus[1]).kind, PathKind::Pix);
        assert_eq!(topo.path(&gpus[0], &gpus[4]).kind, PathKind::Pxb);
        assert_eq!(topo.path(&gpus[0], &gpus[8]).kind, PathKind::Node);
        assert_eq!(topo.path(&gpus[0], &gpus[63]).kind, PathKind::Sys);
        let groups: std::collections::BTreeSet<_> = topo.gpus().map(|g| g.iommu_group).collect();
        assert_eq!(groups.len(), 64);
    }

    #[test]
    fn switched_host_has_its_switches_under_host_bridges_of_their_own() {
        let topo = Topology::from_record(&switched(5, 2, 3, 2));
        let gpus: Vec<_> = topo.gpus().map(|g| g.bdf).collect();
        assert_eq!(gpus.len(), 15);
        assert_eq!(topo.host_bridges.len(), 3);
        assert_eq!(topo.path(&gpus[0], &gpus[2]).kind, PathKind::Pix);
        assert_eq!(topo.path(&gpus[0], &gpus[3]).kind, PathKind::Pxb);
        assert_eq!(topo.path(&gpus[0], &gpus[6]).kind, PathKind::Node);
        assert_eq!(topo.path(&gpus[0], &gpus[14]).kind, PathKind::Sys);
        let groups: std::collections::BTreeSet<_> = topo.gpus().map(|g| g.iommu_group).collect();
        assert_eq!(groups.len(), 15);
    }

    #[test]
    fn shared_group_leaf_puts_its_gpus_in_one_group() {
        let spec = ServerSpec {
            sockets: vec![vec![vec![
                LeafSpec {
                    gpus: 2,
                    shared_group: true,
                },
                LeafSpec {
                    gpus: 2,
                    shared_group: false,
                },
            ]]],
        };
        let topo = Topology::from_record(&server(&spec));
        let groups: Vec<_> = topo.gpus().map(|g| g.iommu_group.unwrap()).collect();
        assert_eq!(groups[0], groups[1]);
        assert_ne!(groups[2], groups[3]);
        assert_ne!(groups[1], groups[2]);
    }
}
