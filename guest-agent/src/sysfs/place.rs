//! Where each GPU sits in the guest's PCIe tree, read the way `nvidia-smi topo -m` reads
//! it: the GPU's sysfs directory (`sys/devices/pciDDDD:BB/…/BDF`) names its root complex
//! and the bridges above it, each bridge's config space says whether it is a switch, the
//! GPU's `numa_node` the complex's NUMA node. `guest_topo` labels the pairs from these.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use pci_config::{Bdf, ConfigSpace, DevicePlace, PathBridge, PciePortType, RootComplex};

use super::read_sysfs_file;

#[derive(Debug, thiserror::Error)]
pub enum TopoError {
    #[error("cannot resolve {path}: {source}")]
    Resolve {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not below a PCI root complex directory (pciDDDD:BB)")]
    NoRootComplex { path: PathBuf },
    #[error("not read: the context reads the GPUs of the scan and of the expectation")]
    NotRead,
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
fn place(root: &Path, gpu: Bdf) -> Result<DevicePlace, TopoError> {
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

/// Where each GPU the agent looks at sits, read once: the GPUs of the scan and those the
/// expectation places.
#[derive(Debug, Default)]
pub struct Places(BTreeMap<Bdf, Result<DevicePlace, TopoError>>);

impl Places {
    /// Reads the place of each of `gpus` below `root`.
    pub fn read(root: &Path, gpus: impl IntoIterator<Item = Bdf>) -> Places {
        Places(gpus.into_iter().map(|g| (g, place(root, g))).collect())
    }

    /// Where `gpu` sits, or why that could not be read.
    pub fn get(&self, gpu: Bdf) -> Result<&DevicePlace, &TopoError> {
        match self.0.get(&gpu) {
            Some(Ok(p)) => Ok(p),
            Some(Err(e)) => Err(e),
            None => Err(&TopoError::NotRead),
        }
    }
}
