//! Which NIC each placed GPU gets (`place --with-nics`): the free NIC nearest to it in the
//! host's PCIe tree, taken only when that is PIX or PXB (below the GPU's own switch), as
//! GPUDirect RDMA wants; otherwise the GPU gets none and the nearest free one is named.
//!
//! Every free NIC is filed under each scope that holds it: each bridge above it, its
//! root complex, its NUMA node, the whole host. A GPU looks through its own scopes from
//! the narrowest; the first with a free NIC holds the nearest (PCIe paths are a tree
//! metric). A NIC taken leaves all its scopes. With n devices of tree depth d that is
//! O(n · d · log n).

use std::collections::{BTreeMap, BTreeSet};

use pci_config::Bdf;
use serde::Serialize;

use pci_config::PathKind;
use vfio_p2p_model::{DeviceKind, HostBridgeId, Topology};

/// Virtio network devices are VM plumbing, never GPUDirect RDMA peers.
const VENDOR_VIRTIO: u16 = 0x1af4;

/// Where a device sits, narrowest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Scope {
    Bridge(Bdf),
    RootComplex(HostBridgeId),
    Numa(Option<u32>),
    Host,
}

/// The NIC a GPU got, or why none.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NicChoice {
    pub gpu: Bdf,
    /// The NIC given to the GPU (PIX or PXB to it); `None`: the host has no such free NIC.
    pub nic: Option<Bdf>,
    /// The path label between the GPU and `nic` (or `nearest`).
    pub path: Option<PathKind>,
    /// When no PIX/PXB NIC is free: the nearest free NIC, not given.
    pub nearest: Option<Bdf>,
}

/// The free NICs by scope.
pub struct NicPool<'t> {
    topo: &'t Topology,
    by_scope: BTreeMap<Scope, BTreeSet<Bdf>>,
    scopes_of: BTreeMap<Bdf, Vec<Scope>>,
}

/// The scopes of `bdf`, narrowest first.
fn scopes(topo: &Topology, bdf: &Bdf) -> Vec<Scope> {
    let mut s: Vec<Scope> = topo
        .ancestors(bdf)
        .into_iter()
        .rev()
        .map(|d| Scope::Bridge(d.bdf))
        .collect();
    if let Some(d) = topo.device(bdf) {
        s.push(Scope::RootComplex(d.host_bridge));
        s.push(Scope::Numa(
            topo.host_bridge_numa(d.host_bridge).or(d.numa_node),
        ));
    }
    s.push(Scope::Host);
    s
}

impl<'t> NicPool<'t> {
    /// Every NIC of the host not in `unavailable` (nor sharing an IOMMU group with one).
    pub fn new(topo: &'t Topology, unavailable: &BTreeSet<Bdf>) -> Self {
        let blocked: BTreeSet<u32> = unavailable
            .iter()
            .filter_map(|b| topo.device(b)?.iommu_group)
            .collect();
        let mut pool = NicPool {
            topo,
            by_scope: BTreeMap::new(),
            scopes_of: BTreeMap::new(),
        };
        let nics = topo.devices.values().filter(|d| {
            d.kind == DeviceKind::Nic
                && d.vendor != VENDOR_VIRTIO
                && !unavailable.contains(&d.bdf)
                && !d.iommu_group.is_some_and(|g| blocked.contains(&g))
        });
        for n in nics {
            let s = scopes(topo, &n.bdf);
            for scope in &s {
                pool.by_scope.entry(*scope).or_default().insert(n.bdf);
            }
            pool.scopes_of.insert(n.bdf, s);
        }
        pool
    }

    /// Gives `gpu` its nearest free NIC when that is PIX or PXB to it.
    pub fn choose(&mut self, gpu: Bdf) -> NicChoice {
        let nearest = scopes(self.topo, &gpu)
            .into_iter()
            .find_map(|s| self.by_scope.get(&s).and_then(|set| set.first().copied()));
        let Some(nic) = nearest else {
            return NicChoice {
                gpu,
                nic: None,
                path: None,
                nearest: None,
            };
        };
        let path = self.topo.path(&gpu, &nic).kind;
        if path > PathKind::Pxb {
            return NicChoice {
                gpu,
                nic: None,
                path: Some(path),
                nearest: Some(nic),
            };
        }
        for s in self.scopes_of.remove(&nic).unwrap_or_default() {
            if let Some(set) = self.by_scope.get_mut(&s) {
                set.remove(&nic);
            }
        }
        NicChoice {
            gpu,
            nic: Some(nic),
            path: Some(path),
            nearest: None,
        }
    }
}

impl std::fmt::Display for NicChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.nic, self.nearest, self.path) {
            (Some(n), _, Some(p)) => write!(f, "GPU {} gets NIC {n} ({p})", self.gpu),
            (None, Some(n), Some(p)) => write!(
                f,
                "GPU {} gets no NIC: none free is PIX or PXB to it on this host (nearest free: {n}, {p})",
                self.gpu
            ),
            _ => write!(f, "GPU {} gets no NIC: this host has no free NIC", self.gpu),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vfio_p2p_read::synth;

    fn topo(ex: &str) -> Topology {
        Topology::from_record(&synth::example(ex).unwrap())
    }

    /// hgx-h100: each switch holds 2 GPUs and 2 NICs, so all 8 GPUs get a PIX NIC of
    /// their own switch, each NIC once.
    #[test]
    fn every_hgx_gpu_gets_a_pix_nic_of_its_switch() {
        let t = topo("hgx-h100");
        let mut pool = NicPool::new(&t, &BTreeSet::new());
        let gpus: Vec<Bdf> = t.gpus().map(|d| d.bdf).collect();
        let choices: Vec<NicChoice> = gpus.iter().map(|g| pool.choose(*g)).collect();
        assert!(choices
            .iter()
            .all(|c| c.path == Some(PathKind::Pix) && c.nic.is_some()));
        let nics: BTreeSet<Bdf> = choices.iter().filter_map(|c| c.nic).collect();
        assert_eq!(nics.len(), 8);
        assert_eq!(
            choices[0].to_string(),
            "GPU 0000:18:00.0 gets NIC 0000:1a:00.0 (PIX)"
        );
    }

    /// dual-socket-pcie: one NIC per socket, PXB to its socket's four GPUs: the first
    /// GPU of each socket gets it, the others are told the nearest free NIC is across the socket.
    #[test]
    fn gpus_beyond_the_hosts_nics_are_told_so() {
        let t = topo("dual-socket-pcie");
        let mut pool = NicPool::new(&t, &BTreeSet::new());
        let gpus: Vec<Bdf> = t.gpus().map(|d| d.bdf).collect();
        let choices: Vec<NicChoice> = gpus.iter().map(|g| pool.choose(*g)).collect();
        let got: Vec<&NicChoice> = choices.iter().filter(|c| c.nic.is_some()).collect();
        assert_eq!(got.len(), 2);
        assert!(got.iter().all(|c| c.path == Some(PathKind::Pxb)));
        assert!(choices[1].nic.is_none());
        assert!(
            choices[1].to_string().contains("none free is PIX or PXB"),
            "{}",
            choices[1]
        );
        // the last GPU: both NICs taken
        assert_eq!(
            choices[7].to_string(),
            format!("GPU {} gets no NIC: this host has no free NIC", gpus[7])
        );
    }

    /// A NIC that is taken (or in a taken IOMMU group) is never given.
    #[test]
    fn taken_nics_are_not_given() {
        let t = topo("hgx-h100");
        let taken: BTreeSet<Bdf> = ["0000:1a:00.0", "0000:1b:00.0"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        let mut pool = NicPool::new(&t, &taken);
        let c = pool.choose("0000:18:00.0".parse().unwrap());
        assert_eq!(c.nic, None);
        assert_eq!(c.path, Some(PathKind::Node));
    }
}
