//! PCIe path classification between two devices, with `nvidia-smi topo -m` labels.
//! The rule itself lives in `pci_config::path`, shared with the guest agent.

use pci_config::{Bdf, DevicePath, PathBridge, PathKind, RootComplex};
use serde::Serialize;

use super::{BridgeRole, Topology};

/// The PCIe path between two devices and the bridges on it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuPath {
    pub kind: PathKind,
    /// Bridges crossed, from `a` upward and then down to `b` (the host bridge,
    /// for PHB and worse, sits between the two halves and is not a PCI function).
    pub bridges: Vec<Bdf>,
    /// NVLink count when the two GPUs are joined by NVLink/NVSwitch.
    pub nvlink: Option<u8>,
}

impl GpuPath {
    /// The `nvidia-smi topo -m` cell: `NV#` when NVLink is known, else the PCIe label.
    pub fn label(&self) -> String {
        match self.nvlink {
            Some(n) if self.kind != PathKind::X => format!("NV{n}"),
            _ => self.kind.label().to_string(),
        }
    }
}

impl Topology {
    /// The bridges above `bdf` (top first), each marked switch or not, for `pci_config::path`.
    pub fn path_bridges(&self, bdf: &Bdf) -> Vec<PathBridge> {
        self.chain(bdf)
            .iter()
            .map(|b| PathBridge {
                bdf: *b,
                switch: matches!(
                    self.devices.get(b).and_then(|d| d.bridge_role()),
                    Some(BridgeRole::UpstreamPort) | Some(BridgeRole::PciBridge)
                ),
            })
            .collect()
    }

    /// The root complex of `bdf` with its NUMA node.
    pub fn root_complex(&self, bdf: &Bdf) -> RootComplex {
        let hb = self.devices.get(bdf).map(|d| d.host_bridge);
        RootComplex {
            domain: hb.map_or(u16::MAX, |h| h.domain),
            bus: hb.map_or(u8::MAX, |h| h.bus),
            numa_node: hb.and_then(|h| self.host_bridge_numa(h)),
        }
    }

    /// Classifies the path between two devices the way `nvidia-smi topo -m` does.
    pub fn path(&self, a: &Bdf, b: &Bdf) -> GpuPath {
        let nvlink = self.nvlink(a, b);
        let (chain_a, chain_b) = (self.path_bridges(a), self.path_bridges(b));
        let class = pci_config::classify(
            &DevicePath {
                device: *a,
                root: self.root_complex(a),
                bridges: &chain_a,
            },
            &DevicePath {
                device: *b,
                root: self.root_complex(b),
                bridges: &chain_b,
            },
        );
        if class.kind == PathKind::X {
            return GpuPath {
                kind: PathKind::X,
                bridges: vec![],
                nvlink: None,
            };
        }
        // From `a` up to the lowest common bridge (or the host bridge), then down to `b`.
        let skip = class.common.saturating_sub(1);
        let mut bridges: Vec<Bdf> = chain_a.iter().skip(skip).rev().map(|x| x.bdf).collect();
        bridges.extend(chain_b.iter().skip(class.common).map(|x| x.bdf));
        GpuPath {
            kind: class.kind,
            bridges,
            nvlink,
        }
    }
}
