//! The path labels the guest will see (PIX/PXB/PHB/NODE/SYS), computed from the decided
//! layout with the host's own rule (`pci_config::path`): each expander is a guest root
//! complex on its guest NUMA node, each emulated upstream port a switch. Used for the
//! expectation's `guest_path` and to name, before the VM starts, every pair whose guest
//! label will differ from the host's.

use std::fmt;

use pci_config::{Bdf, DevicePlace, PathBridge, PathClass, PathKind, RootComplex};

use super::guest_layout::{GuestBridgeKind, GuestDevice, GuestGpu, GuestLayout, MAX_EXPANDERS};
use vfio_p2p_model::Topology;

/// Where a GPU sits in the guest: its guest root complex and the bridges above it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestPlace {
    pub place: DevicePlace,
    /// QEMU id of the expander it sits below, if any.
    pub expander: Option<String>,
}

/// The guest place of `gpu`: below an expander, a root complex numbered at its bus with
/// its guest NUMA node; on `pcie.0`, complex 00 with no node. Bridges are named by their
/// guest address.
pub fn guest_place(layout: &GuestLayout, gpu: &GuestGpu) -> GuestPlace {
    let chain = layout.ancestors(gpu);
    let (root, expander, rest) = match chain.split_first() {
        Some((top, rest)) => match top.kind {
            GuestBridgeKind::Expander { numa_node, .. } => (
                RootComplex {
                    domain: 0,
                    bus: top.bus,
                    numa_node,
                },
                Some(top.id.clone()),
                rest,
            ),
            _ => (root_bus(), None, chain.as_slice()),
        },
        None => (root_bus(), None, chain.as_slice()),
    };
    let bridges = rest
        .iter()
        .map(|b| PathBridge {
            bdf: Bdf::new(0, layout.bridge(&b.parent).map_or(0, |p| p.bus), b.slot, 0),
            switch: matches!(b.kind, GuestBridgeKind::SwitchUpstream),
        })
        .collect();
    GuestPlace {
        place: DevicePlace {
            device: gpu.guest,
            root,
            bridges,
        },
        expander,
    }
}

fn root_bus() -> RootComplex {
    RootComplex {
        domain: 0,
        bus: 0,
        numa_node: None,
    }
}

/// The guest's label for every pair of the layout's GPUs, in the layout's order
/// (`(i, j)` with `i < j`): the layout as is (no emulated tree) keeps the host's labels.
pub fn guest_labels(topo: &Topology, layout: &GuestLayout) -> Vec<(usize, usize, PathClass)> {
    let places: Vec<GuestPlace> = layout.gpus.iter().map(|g| guest_place(layout, g)).collect();
    let mut out = Vec::new();
    for i in 0..places.len() {
        for j in i + 1..places.len() {
            let class = if layout.as_is {
                let kind = topo.path(&layout.gpus[i].host, &layout.gpus[j].host).kind;
                PathClass {
                    kind,
                    common: 0,
                    lowest_common: None,
                    switches: 0,
                }
            } else {
                pci_config::classify(&places[i].place.path(), &places[j].place.path())
            };
            out.push((i, j, class));
        }
    }
    out
}

/// A pair whose label in the guest will not be the host's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabelDifference {
    pub a: Bdf,
    pub b: Bdf,
    /// Whether `a` (`b`) is a NIC passed with the GPUs rather than a GPU.
    pub a_nic: bool,
    pub b_nic: bool,
    pub host: PathKind,
    pub guest: PathKind,
    pub why: String,
}

impl fmt::Display for LabelDifference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let pair = match (self.a_nic, self.b_nic) {
            (false, false) => format!("GPUs {} and {}", self.a, self.b),
            (true, true) => format!("NICs {} and {}", self.a, self.b),
            (false, true) => format!("GPU {} and NIC {}", self.a, self.b),
            (true, false) => format!("NIC {} and GPU {}", self.a, self.b),
        };
        write!(
            f,
            "{pair} will read {} in the guest, {} on the host: {}",
            self.guest, self.host, self.why
        )
    }
}

/// Every pair of passed devices (GPU–GPU, GPU–NIC, NIC–NIC) of a `mirror` layout whose
/// guest label differs from the host's, and why.
pub fn label_differences(topo: &Topology, layout: &GuestLayout) -> Vec<LabelDifference> {
    let devices: Vec<(&GuestDevice, bool)> = layout
        .gpus
        .iter()
        .map(|g| (g, false))
        .chain(layout.nics.iter().map(|n| (n, true)))
        .collect();
    let places: Vec<GuestPlace> = devices
        .iter()
        .map(|(d, _)| guest_place(layout, d))
        .collect();
    let mut out = Vec::new();
    for i in 0..devices.len() {
        for j in i + 1..devices.len() {
            let ((a, a_nic), (b, b_nic)) = (devices[i], devices[j]);
            let host = topo.path(&a.host, &b.host).kind;
            let guest = if layout.as_is {
                host
            } else {
                pci_config::classify(&places[i].place.path(), &places[j].place.path()).kind
            };
            if host != guest {
                out.push(LabelDifference {
                    a: a.host,
                    b: b.host,
                    a_nic,
                    b_nic,
                    host,
                    guest,
                    why: why(host, guest, &places[i], &places[j]),
                });
            }
        }
    }
    out
}

fn why(host: PathKind, guest: PathKind, a: &GuestPlace, b: &GuestPlace) -> String {
    match (host, guest) {
        (PathKind::Node | PathKind::Sys, PathKind::Phb) => format!(
            "both sit below expander {}: beyond {MAX_EXPANDERS} host root complexes they share one",
            a.expander.as_deref().unwrap_or("pcie.0")
        ),
        (PathKind::Sys, PathKind::Node) => format!(
            "expanders {} and {} are on one guest NUMA node (guest NUMA is off, or a host node is unknown)",
            a.expander.as_deref().unwrap_or("pcie.0"),
            b.expander.as_deref().unwrap_or("pcie.0")
        ),
        _ => "the bridges above them on the host are not a PCIe chain the guest can mirror \
              (a legacy bridge, or a GPU on a root bus), so the guest gives them root ports of their own"
            .to_string(),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::guest_layout::{decide, decide_with_nics, LayoutOptions};
    use vfio_p2p_config::vm::GuestTopology;
    use vfio_p2p_read::synth;

    fn layout(topo: &Topology, guest_numa: bool) -> GuestLayout {
        let gpus: Vec<Bdf> = topo.gpus().map(|d| d.bdf).collect();
        let opts = LayoutOptions {
            topology: GuestTopology::Mirror,
            guest_numa,
        };
        decide(topo, &gpus, &BTreeMap::new(), opts).unwrap()
    }

    #[test]
    fn mirror_keeps_every_label_of_the_examples() {
        for ex in ["hgx-h100", "dual-socket-pcie", "flat-vm"] {
            let topo = Topology::from_record(&synth::example(ex).unwrap());
            assert_eq!(
                label_differences(&topo, &layout(&topo, true)),
                vec![],
                "{ex}"
            );
        }
    }

    /// With every NIC of the examples passed too, every GPU–NIC and NIC–NIC pair keeps
    /// its host label under mirror.
    #[test]
    fn mirror_keeps_gpu_nic_labels_of_the_examples() {
        for ex in ["hgx-h100", "dual-socket-pcie"] {
            let topo = Topology::from_record(&synth::example(ex).unwrap());
            let gpus: Vec<Bdf> = topo.gpus().map(|d| d.bdf).collect();
            let nics: Vec<Bdf> = topo.nic_names.keys().copied().collect();
            assert!(nics.len() >= 2, "{ex}");
            let opts = LayoutOptions {
                topology: GuestTopology::Mirror,
                guest_numa: true,
            };
            let l = decide_with_nics(&topo, &gpus, &nics, &BTreeMap::new(), opts).unwrap();
            assert_eq!(l.nics.len(), nics.len());
            assert_eq!(label_differences(&topo, &l), vec![], "{ex}");
            // flat loses them, and names each GPU–NIC pair that changes
            let flat = LayoutOptions {
                topology: GuestTopology::Flat,
                guest_numa: true,
            };
            let l =
                decide_with_nics(&topo, &gpus[..2], &nics[..2], &BTreeMap::new(), flat).unwrap();
            let d = label_differences(&topo, &l);
            assert!(d.iter().any(|x| !x.a_nic && x.b_nic), "{ex}");
            assert!(d
                .iter()
                .any(|x| x.to_string().starts_with("GPU ") && x.to_string().contains(" and NIC ")));
        }
    }

    /// Without guest NUMA nodes every expander reads node -1: the 16 cross-socket pairs
    /// of hgx-h100 read NODE instead of SYS, and each is named.
    #[test]
    fn without_guest_numa_cross_socket_pairs_are_named() {
        let topo = Topology::from_record(&synth::example("hgx-h100").unwrap());
        let d = label_differences(&topo, &layout(&topo, false));
        assert_eq!(d.len(), 16);
        assert!(d
            .iter()
            .all(|x| (x.host, x.guest) == (PathKind::Sys, PathKind::Node)));
        assert_eq!(
            d[0].to_string(),
            "GPUs 0000:18:00.0 and 0000:9d:00.0 will read NODE in the guest, SYS on the host: \
             expanders pxb0 and pxb2 are on one guest NUMA node (guest NUMA is off, or a host node is unknown)"
        );
    }

    /// Eight root complexes on two sockets, six expanders: the two complexes left over
    /// share socket 1's first expander, and the three pairs among them read PHB, not NODE.
    #[test]
    fn complexes_beyond_the_expanders_share_one_and_are_named() {
        let spec = synth::tree::ServerSpec::uniform(2, 4, 1, 1);
        let topo = Topology::from_record(&synth::tree::server(&spec));
        let l = layout(&topo, true);
        let expanders = l
            .bridges
            .iter()
            .filter(|b| matches!(b.kind, GuestBridgeKind::Expander { .. }))
            .count();
        assert_eq!(expanders, MAX_EXPANDERS);
        let d = label_differences(&topo, &l);
        assert_eq!(d.len(), 3, "{d:?}");
        assert!(d
            .iter()
            .all(|x| (x.host, x.guest) == (PathKind::Node, PathKind::Phb)));
        assert!(d[0].why.contains("share one"), "{}", d[0]);
    }
}
