//! PCIe path classification between two devices, with `nvidia-smi topo -m` labels.

use std::fmt;
use std::str::FromStr;

use pci_config::Bdf;
use serde::Serialize;

use super::{BridgeRole, HostBridgeId, Topology};

/// How two GPUs are connected over PCIe, best first (the order matters:
/// "no worse than `Pxb`" is `kind <= PathKind::Pxb`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PathKind {
    /// The same device.
    X,
    /// At most one PCIe switch between them.
    Pix,
    /// Several switches, without crossing a host bridge.
    Pxb,
    /// Through one PCIe host bridge (root complex).
    Phb,
    /// Between host bridges within one NUMA node.
    Node,
    /// Across NUMA nodes (QPI/UPI/xGMI).
    Sys,
}

impl PathKind {
    pub const fn label(&self) -> &'static str {
        match self {
            PathKind::X => "X",
            PathKind::Pix => "PIX",
            PathKind::Pxb => "PXB",
            PathKind::Phb => "PHB",
            PathKind::Node => "NODE",
            PathKind::Sys => "SYS",
        }
    }

    pub const fn meaning(&self) -> &'static str {
        match self {
            PathKind::X => "Self",
            PathKind::Pix => "Connection traversing at most a single PCIe bridge",
            PathKind::Pxb => "Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)",
            PathKind::Phb => "Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)",
            PathKind::Node => "Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node",
            PathKind::Sys => "Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)",
        }
    }

    pub const ALL: [PathKind; 6] = [
        PathKind::X,
        PathKind::Pix,
        PathKind::Pxb,
        PathKind::Phb,
        PathKind::Node,
        PathKind::Sys,
    ];
}

impl fmt::Display for PathKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

impl FromStr for PathKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        PathKind::ALL
            .into_iter()
            .find(|k| k.label().eq_ignore_ascii_case(s))
            .ok_or_else(|| {
                format!("'{s}' is not a path level; use one of pix, pxb, phb, node, sys")
            })
    }
}

impl Serialize for PathKind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.label())
    }
}

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
    /// Classifies the path between two devices the way `nvidia-smi topo -m` does.
    pub fn path(&self, a: &Bdf, b: &Bdf) -> GpuPath {
        let nvlink = self.nvlink(a, b);
        if a == b {
            return GpuPath {
                kind: PathKind::X,
                bridges: vec![],
                nvlink: None,
            };
        }
        let (chain_a, chain_b) = (self.chain(a), self.chain(b));
        let (hb_a, hb_b) = (
            self.devices.get(a).map(|d| d.host_bridge),
            self.devices.get(b).map(|d| d.host_bridge),
        );
        let through_host = |kind| {
            let mut bridges: Vec<Bdf> = chain_a.iter().rev().copied().collect();
            bridges.extend(chain_b.iter().copied());
            GpuPath {
                kind,
                bridges,
                nvlink,
            }
        };
        if hb_a != hb_b {
            let numa = |hb: Option<HostBridgeId>| hb.and_then(|h| self.host_bridge_numa(h));
            let same_node = numa(hb_a) == numa(hb_b);
            return through_host(if same_node {
                PathKind::Node
            } else {
                PathKind::Sys
            });
        }
        let common = chain_a
            .iter()
            .zip(chain_b)
            .take_while(|(x, y)| x == y)
            .count();
        if common == 0 {
            return through_host(PathKind::Phb);
        }
        // Switches crossed: the lowest common bridge, if it is a switch, plus every
        // switch (upstream port or legacy bridge) below it on either side.
        let is_switch = |bdf: &Bdf| {
            matches!(
                self.devices.get(bdf).and_then(|d| d.bridge_role()),
                Some(BridgeRole::UpstreamPort) | Some(BridgeRole::PciBridge)
            )
        };
        let lca = chain_a[common - 1];
        let below_a = &chain_a[common..];
        let below_b = &chain_b[common..];
        let switches = usize::from(is_switch(&lca))
            + below_a.iter().filter(|b| is_switch(b)).count()
            + below_b.iter().filter(|b| is_switch(b)).count();
        let mut bridges: Vec<Bdf> = below_a.iter().rev().copied().collect();
        bridges.push(lca);
        bridges.extend(below_b.iter().copied());
        GpuPath {
            kind: if switches <= 1 {
                PathKind::Pix
            } else {
                PathKind::Pxb
            },
            bridges,
            nvlink,
        }
    }
}
