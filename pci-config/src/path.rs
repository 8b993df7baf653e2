//! The PCIe path between two devices, labelled the way `nvidia-smi topo -m` does
//! (PIX/PXB/PHB/NODE/SYS), computed once for both sides: the host tool classifies host
//! pairs and predicts the guest's from its emitted layout, the guest agent classifies the
//! guest's from guest sysfs. All three must agree, so there is one implementation.
//!
//! The rule: two devices below different root complexes are NODE when the complexes sit
//! on the same NUMA node (both unknown counts as the same), else SYS. Below one complex
//! with no common bridge they are PHB. Otherwise count the switches crossed: the lowest
//! common bridge if it is a switch, plus every switch below it on either side; at most
//! one is PIX, more is PXB. A switch is an upstream port or a legacy PCI bridge.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::Bdf;

/// How two devices are connected over PCIe, best first (the order matters:
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

impl<'de> Deserialize<'de> for PathKind {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

/// A root complex: the `pciDDDD:BB` directory a device sits below, with its NUMA node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RootComplex {
    pub domain: u16,
    pub bus: u8,
    pub numa_node: Option<u32>,
}

impl RootComplex {
    /// Whether two complexes are the same one (the NUMA node is a property, not the key).
    fn same(&self, other: &RootComplex) -> bool {
        (self.domain, self.bus) == (other.domain, other.bus)
    }
}

impl fmt::Display for RootComplex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "pci{:04x}:{:02x}", self.domain, self.bus)
    }
}

/// A bridge above a device, and whether it counts as a switch (an upstream port or a
/// legacy PCI bridge; root and downstream ports do not).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PathBridge {
    pub bdf: Bdf,
    pub switch: bool,
}

/// Where a device sits: its root complex and the bridges above it, top first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DevicePath<'a> {
    pub device: Bdf,
    pub root: RootComplex,
    pub bridges: &'a [PathBridge],
}

/// [`DevicePath`] with its bridges owned: what a reader builds once per device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DevicePlace {
    pub device: Bdf,
    pub root: RootComplex,
    pub bridges: Vec<PathBridge>,
}

impl DevicePlace {
    pub fn path(&self) -> DevicePath<'_> {
        DevicePath {
            device: self.device,
            root: self.root,
            bridges: &self.bridges,
        }
    }
}

/// The classification of a pair, with what decided it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PathClass {
    pub kind: PathKind,
    /// How many bridges the two chains share from the top (0 for PHB and worse).
    pub common: usize,
    /// The lowest bridge both sit below (PIX/PXB only).
    pub lowest_common: Option<Bdf>,
    /// Switches crossed (PIX/PXB only).
    pub switches: usize,
}

/// Classifies the path between `a` and `b`; total, never panics.
pub fn classify(a: &DevicePath<'_>, b: &DevicePath<'_>) -> PathClass {
    let class = |kind| PathClass {
        kind,
        common: 0,
        lowest_common: None,
        switches: 0,
    };
    if a.device == b.device {
        return class(PathKind::X);
    }
    if !a.root.same(&b.root) {
        return class(if a.root.numa_node == b.root.numa_node {
            PathKind::Node
        } else {
            PathKind::Sys
        });
    }
    let common = a
        .bridges
        .iter()
        .zip(b.bridges)
        .take_while(|(x, y)| x.bdf == y.bdf)
        .count();
    let Some(lca) = common.checked_sub(1).and_then(|i| a.bridges.get(i)) else {
        return class(PathKind::Phb);
    };
    let below = |p: &DevicePath<'_>| p.bridges.iter().skip(common).filter(|x| x.switch).count();
    let switches = usize::from(lca.switch) + below(a) + below(b);
    PathClass {
        kind: if switches <= 1 {
            PathKind::Pix
        } else {
            PathKind::Pxb
        },
        common,
        lowest_common: Some(lca.bdf),
        switches,
    }
}

/// The `nvidia-smi topo -m` label of the path between `a` and `b`.
pub fn path_label(a: &DevicePath<'_>, b: &DevicePath<'_>) -> PathKind {
    classify(a, b).kind
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn bdf(bus: u8, dev: u8) -> Bdf {
        Bdf::new(0, bus, dev, 0)
    }
    fn root(bus: u8, numa: Option<u32>) -> RootComplex {
        RootComplex {
            domain: 0,
            bus,
            numa_node: numa,
        }
    }
    fn port(bus: u8, dev: u8) -> PathBridge {
        PathBridge {
            bdf: bdf(bus, dev),
            switch: false,
        }
    }
    fn switch(bus: u8) -> PathBridge {
        PathBridge {
            bdf: bdf(bus, 0),
            switch: true,
        }
    }

    /// The hgx-h100 shape: root port, switch (upstream + two downstream ports).
    #[test]
    fn labels_of_a_two_level_host() {
        let a_chain = [port(0x15, 0), switch(0x16), port(0x17, 0)];
        let b_chain = [port(0x15, 0), switch(0x16), port(0x17, 1)];
        let c_chain = [port(0x37, 0), switch(0x38), port(0x39, 0)];
        let a = DevicePath {
            device: bdf(0x18, 0),
            root: root(0x15, Some(0)),
            bridges: &a_chain,
        };
        let b = DevicePath {
            device: bdf(0x19, 0),
            root: root(0x15, Some(0)),
            bridges: &b_chain,
        };
        let c = DevicePath {
            device: bdf(0x3a, 0),
            root: root(0x37, Some(0)),
            bridges: &c_chain,
        };
        let far = DevicePath {
            root: root(0x9a, Some(1)),
            ..c
        };
        assert_eq!(path_label(&a, &a), PathKind::X);
        let pix = classify(&a, &b);
        assert_eq!(pix.kind, PathKind::Pix);
        assert_eq!((pix.lowest_common, pix.switches), (Some(bdf(0x16, 0)), 1));
        assert_eq!(path_label(&a, &c), PathKind::Node);
        assert_eq!(path_label(&a, &far), PathKind::Sys);
        // Two root ports of one complex, no common bridge.
        let d = DevicePath {
            device: bdf(0x20, 0),
            root: root(0x15, Some(0)),
            bridges: &c_chain,
        };
        assert_eq!(path_label(&a, &d), PathKind::Phb);
        // A switch below a switch: PXB.
        let deep = [port(0x15, 0), switch(0x16), port(0x17, 1), switch(0x1a)];
        let e = DevicePath {
            device: bdf(0x1c, 0),
            bridges: &deep,
            ..a
        };
        assert_eq!(path_label(&a, &e), PathKind::Pxb);
    }

    #[test]
    fn labels_parse_and_print_alike() {
        for k in PathKind::ALL {
            assert_eq!(k.label().parse::<PathKind>(), Ok(k));
            assert_eq!(k.to_string().to_lowercase().parse::<PathKind>(), Ok(k));
        }
        assert!("PCI".parse::<PathKind>().is_err());
    }

    fn arb_chain() -> impl Strategy<Value = Vec<PathBridge>> {
        // One bridge is a switch or not in every chain it appears in: derived from its address.
        proptest::collection::vec(0u8..4, 0..6).prop_map(|v| {
            v.into_iter()
                .enumerate()
                .map(|(depth, dev)| PathBridge {
                    bdf: Bdf::new(0, depth as u8 + 1, dev, 0),
                    switch: (depth as u8 + dev).is_multiple_of(3),
                })
                .collect()
        })
    }

    proptest! {
        /// Symmetric and total for any chains, roots and NUMA nodes.
        #[test]
        fn symmetric_and_total(
            ca in arb_chain(), cb in arb_chain(),
            ra in 0u8..3, rb in 0u8..3, na in proptest::option::of(0u32..2), nb in proptest::option::of(0u32..2),
            da in 0u8..4, db in 0u8..4,
        ) {
            let a = DevicePath { device: bdf(0x80, da), root: root(ra, na), bridges: &ca };
            let b = DevicePath { device: bdf(0x80, db), root: root(rb, nb), bridges: &cb };
            let ab = classify(&a, &b);
            let ba = classify(&b, &a);
            prop_assert_eq!(ab.kind, ba.kind);
            prop_assert_eq!(ab.lowest_common, ba.lowest_common);
            prop_assert_eq!(ab.kind == PathKind::X, da == db);
            if ab.kind >= PathKind::Phb {
                prop_assert!(ab.lowest_common.is_none());
            }
        }
    }
}
