//! The guest's PCIe path labels (PIX/PXB/PHB/NODE/SYS), read from guest sysfs the way
//! `nvidia-smi topo -m` reads them, and compared per pair with the host's labels in the
//! expectation. The rule is the host's own (`pci_config::path`); what differs is where
//! the facts come from: each GPU's sysfs directory (`sys/devices/pciDDDD:BB/…/BDF`)
//! names its root complex and the bridges above it, each bridge's config space says
//! whether it is a switch, the GPU's `numa_node` the complex's NUMA node.

use std::fs;
use std::path::{Path, PathBuf};

use pci_config::{
    Bdf, ConfigSpace, DevicePlace, PathBridge, PathClass, PathKind, PciePortType, RootComplex,
};
use serde::{Deserialize, Serialize};
use vfio_p2p_contract::Expectation;

use crate::sysfs::gpus::read_sysfs_file;

#[derive(Debug, thiserror::Error)]
pub enum TopoError {
    #[error("cannot resolve {path}: {source}")]
    Resolve {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not below a PCI root complex directory (pciDDDD:BB)")]
    NoRootComplex { path: PathBuf },
}

/// How a bridge takes part in a path, as the host tool types it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Root,
    Upstream,
    Downstream,
    Legacy,
}

/// The role of a bridge from its PCIe port type, else (config space beyond 64 bytes
/// unreadable without root) from its parent's, as the host tool infers it.
fn role(port_type: Option<PciePortType>, parent: Option<Role>) -> Role {
    match (port_type, parent) {
        (Some(PciePortType::RootPort), _) => Role::Root,
        (Some(PciePortType::UpstreamPort), _) => Role::Upstream,
        (Some(PciePortType::DownstreamPort), _) => Role::Downstream,
        (Some(_), _) => Role::Legacy,
        (None, None) => Role::Root,
        (None, Some(Role::Root | Role::Downstream)) => Role::Upstream,
        (None, Some(Role::Upstream)) => Role::Downstream,
        (None, Some(Role::Legacy)) => Role::Legacy,
    }
}

/// Reads where `gpu` sits below `root/sys/bus/pci/devices`.
pub fn place(root: &Path, gpu: Bdf) -> Result<DevicePlace, TopoError> {
    let link = root.join("sys/bus/pci/devices").join(gpu.to_string());
    let dir = fs::canonicalize(&link).map_err(|source| TopoError::Resolve {
        path: link.clone(),
        source,
    })?;
    let mut complex = None;
    let mut walked = PathBuf::new();
    let mut bridges = Vec::new();
    let mut parent_role = None;
    for c in dir.components() {
        walked.push(c);
        let name = c.as_os_str().to_string_lossy();
        if let Some(rc) = name.strip_prefix("pci").and_then(parse_complex) {
            complex = Some(rc);
            bridges.clear();
            parent_role = None;
            continue;
        }
        let Ok(bdf) = name.parse::<Bdf>() else {
            continue;
        };
        if complex.is_none() || bdf == gpu {
            continue;
        }
        let config = read_sysfs_file(&walked.join("config")).unwrap_or_default();
        let r = role(
            ConfigSpace::new(&config).pcie().map(|p| p.port_type),
            parent_role,
        );
        parent_role = Some(r);
        bridges.push(PathBridge {
            bdf,
            switch: matches!(r, Role::Upstream | Role::Legacy),
        });
    }
    let (domain, bus) = complex.ok_or(TopoError::NoRootComplex { path: dir.clone() })?;
    let numa_node = read_sysfs_file(&dir.join("numa_node"))
        .ok()
        .and_then(|b| String::from_utf8_lossy(&b).trim().parse::<i64>().ok())
        .and_then(|n| u32::try_from(n).ok());
    Ok(DevicePlace {
        device: gpu,
        root: RootComplex {
            domain,
            bus,
            numa_node,
        },
        bridges,
    })
}

/// `DDDD:BB` of a `pciDDDD:BB` directory name.
fn parse_complex(s: &str) -> Option<(u16, u8)> {
    let (d, b) = s.split_once(':')?;
    if d.len() != 4 || b.len() != 2 {
        return None;
    }
    Some((
        u16::from_str_radix(d, 16).ok()?,
        u8::from_str_radix(b, 16).ok()?,
    ))
}

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
pub fn guest_view(root: &Path, gpus: &[Bdf]) -> TopoReport {
    let mut warnings = Vec::new();
    let places: Vec<Option<DevicePlace>> = gpus
        .iter()
        .map(|&g| {
            place(root, g)
                .map_err(|err| warnings.push(format!("GPU {g}: {err}")))
                .ok()
        })
        .collect();
    let mut pairs = Vec::new();
    for (i, a) in gpus.iter().enumerate() {
        for (j, b) in gpus.iter().enumerate().skip(i + 1) {
            let guest = match (&places[i], &places[j]) {
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
pub fn compare(root: &Path, e: &Expectation) -> TopoReport {
    let mut warnings = Vec::new();
    let places: Vec<(Bdf, Option<DevicePlace>)> = e
        .gpus
        .iter()
        .map(|g| match place(root, g.guest_bdf) {
            Ok(p) => (g.guest_bdf, Some(p)),
            Err(err) => {
                warnings.push(format!("GPU {}: {err}", g.guest_bdf));
                (g.guest_bdf, None)
            }
        })
        .collect();
    let find = |b: Bdf| places.iter().find(|p| p.0 == b).and_then(|p| p.1.as_ref());
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
