//! The guest's PCIe path labels (PIX/PXB/PHB/NODE/SYS), from where each GPU sits in guest
//! sysfs (`sysfs::place`, read the way `nvidia-smi topo -m` reads it), compared per pair
//! with the host's labels in the expectation. The rule is the host's own
//! (`pci_config::path`); what differs is where the facts come from.

use pci_config::{Bdf, DevicePlace, PathClass, PathKind, RootComplex};
use serde::{Deserialize, Serialize};
use vfio_p2p_contract::Expectation;

use crate::sysfs::place::Places;

/// One GPU pair: the host's label, the guest's, and what makes them differ.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopoPair {
    pub a: Bdf,
    pub b: Bdf,
    /// The host's label (the expectation's `path`).
    pub host: String,
    /// What the host predicted for the guest (`guest_path`), when it said.
    pub predicted: Option<String>,
    /// The guest's label from sysfs; `None` when a GPU is not there.
    pub guest: Option<String>,
    /// NVML's common-ancestor label, when the NVIDIA driver is loaded.
    pub nvml: Option<String>,
    pub as_expected: bool,
    /// The guest bridge or root complex that gives the guest label, when it differs.
    pub difference: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopoReport {
    pub pairs: Vec<TopoPair>,
    /// GPUs whose place could not be read, and why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

impl TopoReport {
    pub fn mismatches(&self) -> usize {
        self.pairs.iter().filter(|p| !p.as_expected).count()
    }

    /// Adds NVML's label per pair (`label(a, b)`); a pair NVML reads differently from the
    /// host is not as expected either.
    pub fn add_nvml(&mut self, label: impl Fn(Bdf, Bdf) -> Option<String>) {
        for p in &mut self.pairs {
            p.nvml = label(p.a, p.b).filter(|l| !l.starts_with("NV") && l != "PCIe");
            if p.host.is_empty() {
                continue; // the guest's own view: no host label to differ from
            }
            if let Some(n) = p.nvml.as_ref().filter(|n| **n != p.host) {
                p.as_expected = false;
                p.difference.get_or_insert_with(|| {
                    format!("NVML reads {n} where the host reads {}", p.host)
                });
            }
        }
    }
}

/// The guest's own view, with no expectation: every pair of `gpus` with its guest label
/// (the host's label is empty: nothing to compare with).
pub fn guest_view(places: &Places, gpus: &[Bdf]) -> TopoReport {
    let mut warnings = Vec::new();
    let found: Vec<Option<&DevicePlace>> = gpus
        .iter()
        .map(|&g| {
            places
                .get(g)
                .map_err(|err| warnings.push(format!("GPU {g}: {err}")))
                .ok()
        })
        .collect();
    let mut pairs = Vec::new();
    for (i, a) in gpus.iter().enumerate() {
        for (j, b) in gpus.iter().enumerate().skip(i + 1) {
            let guest = match (found[i], found[j]) {
                (Some(pa), Some(pb)) => Some(
                    pci_config::classify(&pa.path(), &pb.path())
                        .kind
                        .label()
                        .to_string(),
                ),
                _ => None,
            };
            pairs.push(TopoPair {
                a: *a,
                b: *b,
                host: String::new(),
                predicted: None,
                guest,
                nvml: None,
                as_expected: true,
                difference: None,
            });
        }
    }
    TopoReport { pairs, warnings }
}

/// Compares the guest's label of every expected pair with the host's.
pub fn compare(places: &Places, e: &Expectation) -> TopoReport {
    let mut warnings = Vec::new();
    let found: Vec<(Bdf, Option<&DevicePlace>)> = e
        .gpus
        .iter()
        .map(|g| match places.get(g.guest_bdf) {
            Ok(p) => (g.guest_bdf, Some(p)),
            Err(err) => {
                warnings.push(format!("GPU {}: {err}", g.guest_bdf));
                (g.guest_bdf, None)
            }
        })
        .collect();
    let find = |b: Bdf| found.iter().find(|p| p.0 == b).and_then(|p| p.1);
    let pairs = e
        .pairs
        .iter()
        .map(|p| {
            let class = match (find(p.a), find(p.b)) {
                (Some(a), Some(b)) => Some((pci_config::classify(&a.path(), &b.path()), a, b)),
                _ => None,
            };
            let guest = class.as_ref().map(|(c, ..)| c.kind.label().to_string());
            // Only PCIe labels compare; an older host may have written NV# there.
            let comparable = p.path.parse::<PathKind>().is_ok();
            let as_expected = !comparable || guest.as_deref() == Some(p.path.as_str());
            let difference = match &class {
                _ if !comparable => Some(format!(
                    "the host's label {} is not a PCIe path label; not compared",
                    p.path
                )),
                Some((c, a, b)) if !as_expected => Some(what_decides(c, a, b)),
                None => Some("a GPU of the pair is not in guest sysfs".to_string()),
                _ => None,
            };
            TopoPair {
                a: p.a,
                b: p.b,
                host: p.path.clone(),
                predicted: p.guest_path.clone(),
                guest,
                nvml: None,
                as_expected,
                difference,
            }
        })
        .collect();
    TopoReport { pairs, warnings }
}

/// The guest bridge or root complexes that decide the guest's label, in words.
fn what_decides(c: &PathClass, a: &DevicePlace, b: &DevicePlace) -> String {
    let node = |r: &RootComplex| r.numa_node.map_or("none".to_string(), |n| n.to_string());
    match (c.kind, c.lowest_common) {
        (_, Some(lca)) => format!(
            "both sit below guest bridge {lca}, {} switch(es) crossed",
            c.switches
        ),
        (PathKind::Phb, None) => format!(
            "both sit below guest root complex {} with no bridge in common",
            a.root
        ),
        _ => format!(
            "guest root complexes {} (NUMA node {}) and {} (NUMA node {})",
            a.root,
            node(&a.root),
            b.root,
            node(&b.root)
        ),
    }
}
