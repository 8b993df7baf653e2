//! Finds the NVIDIA GPUs in sysfs and reads what the hypervisor put in their config space.

use std::fs;
use std::path::{Path, PathBuf};

use pci_config::{clique, Bdf, ConfigSpace, CONFIG_SPACE_UNPRIVILEGED};
use serde::{Deserialize, Serialize};
use vfio_p2p_contract::nvidia_parts::{gpu_part, GpuPart};

use super::{read_regular_file, read_sysfs_file, MAX_SYSFS_FILE};

pub const NVIDIA_VENDOR: u16 = 0x10de;
/// PCI base class of display controllers (VGA 0x0300, 3D 0x0302).
const CLASS_DISPLAY: u32 = 0x03;

#[derive(Debug, thiserror::Error)]
pub enum ScanError {
    #[error("cannot list {path}: {source}")]
    List {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is a file but not a flat sysfs JSON dump (`{{\"BDF\": {{\"vendor\": …, \"config\": \"<hex>\"}}}}`, what `vfio-p2p --sysfs-root` also reads): {message}; give a directory with sys/bus/pci/devices below it, or such a dump")]
    Flat { path: PathBuf, message: String },
}

/// One NVIDIA GPU as seen in sysfs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuScan {
    pub bdf: Bdf,
    pub vendor: String,
    pub device: String,
    pub class: String,
    pub driver: Option<String>,
    /// Bytes of config space this user could read (64 unless root).
    pub config_bytes: usize,
    /// Whether the capability list could be read at all.
    pub caps_readable: bool,
    /// Clique ID of the capability the guest driver would find (walking the list).
    pub clique: Option<u8>,
    /// Where that capability is, `"0xc8"`.
    pub cap_offset: Option<String>,
    /// Whether the capability is linked in the list (`false`: present but unreachable).
    pub cap_linked: Option<bool>,
    /// Something wrong with the capability, in words.
    pub problem: Option<String>,
    pub link_speed: Option<String>,
    pub link_width: Option<u32>,
    pub max_link_speed: Option<String>,
    pub max_link_width: Option<u32>,
    pub numa_node: Option<i32>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Scan {
    pub sysfs_root: String,
    pub gpus: Vec<GpuScan>,
    /// Said once when config space was truncated for lack of privilege.
    pub note: Option<String>,
    /// Devices that could not be read, and why; the scan goes on without them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

impl Scan {
    /// The part table's entry of the GPU at `bdf`, from the PCI device ID the scan read.
    pub fn part_of(&self, bdf: Bdf) -> Option<&'static GpuPart> {
        let g = self.gpus.iter().find(|g| g.bdf == bdf)?;
        gpu_part(u16::from_str_radix(g.device.trim_start_matches("0x"), 16).ok()?)
    }

    /// Whether any GPU's clique could not be read (non-root).
    pub fn unreadable(&self) -> bool {
        self.gpus.iter().any(|g| !g.caps_readable)
    }

    pub fn gpu(&self, bdf: Bdf) -> Option<&GpuScan> {
        self.gpus.iter().find(|g| g.bdf == bdf)
    }
}

fn read_attr(dir: &Path, name: &str) -> Option<String> {
    read_sysfs_file(&dir.join(name))
        .ok()
        .map(|b| String::from_utf8_lossy(&b).trim().to_string())
        .filter(|s| !s.is_empty())
}

fn parse_hex(s: &str) -> Option<u32> {
    u32::from_str_radix(s.trim().trim_start_matches("0x"), 16).ok()
}

/// Scans `root/sys/bus/pci/devices` for NVIDIA display-class functions, ordered by BDF.
pub fn scan(root: &Path) -> Result<Scan, ScanError> {
    if root.is_file() {
        return scan_flat(root);
    }
    let devices = root.join("sys/bus/pci/devices");
    let entries = fs::read_dir(&devices).map_err(|source| ScanError::List {
        path: devices.clone(),
        source,
    })?;
    let scanned =
        pci_devices(entries).map(|(bdf, dir)| (bdf, scan_device(&Device::Dir(&dir), bdf)));
    Ok(collect(root, scanned))
}

/// The most read of a flat JSON dump (a real host's is well below 1 MiB).
const MAX_FLAT_DUMP: u64 = 64 << 20;

/// A flat sysfs JSON dump (`{"BDF": {"vendor": "0x10de", "config": "<hex>", …}}`), the
/// form `vfio-p2p --sysfs-root FILE` reads and the fixtures hold.
fn scan_flat(path: &Path) -> Result<Scan, ScanError> {
    let bytes = read_regular_file(path, MAX_FLAT_DUMP).map_err(|source| ScanError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let flat = |message: String| ScanError::Flat {
        path: path.to_path_buf(),
        message,
    };
    let value: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|e| flat(format!("not JSON: {e}")))?;
    let map = value
        .as_object()
        .ok_or_else(|| flat("not a JSON object of devices".into()))?;
    let mut scanned = Vec::new();
    for (key, entry) in map {
        let (Ok(bdf), Some(attrs)) = (key.parse::<Bdf>(), entry.as_object()) else {
            return Err(flat(format!(
                "'{key}' is not a PCI address with an object of attributes"
            )));
        };
        scanned.push((bdf, scan_device(&Device::Flat(attrs), bdf)));
    }
    Ok(collect(path, scanned.into_iter()))
}

/// The scan of `root` from its devices' results: one unreadable device is a warning, as in
/// the host tool, and the others still count.
fn collect(
    root: &Path,
    scanned: impl Iterator<Item = (Bdf, Result<Option<GpuScan>, ScanError>)>,
) -> Scan {
    let mut gpus = Vec::new();
    let mut warnings = Vec::new();
    for (bdf, result) in scanned {
        match result {
            Ok(Some(gpu)) => gpus.push(gpu),
            Ok(None) => {}
            Err(e) => warnings.push(format!("{bdf}: {e}; left out")),
        }
    }
    gpus.sort_by_key(|g| g.bdf);
    let hidden = gpus.iter().filter(|g| !g.caps_readable).count();
    let note = (hidden > 0).then(|| {
        format!(
            "only the first {CONFIG_SPACE_UNPRIVILEGED} bytes of config space are readable without root: \
             the clique capability of {hidden} GPU(s) was not checked; run as root to check it"
        )
    });
    Scan {
        sysfs_root: root.display().to_string(),
        gpus,
        note,
        warnings,
    }
}

/// Where one device's attributes are read: its sysfs directory, or its entry in a flat dump.
enum Device<'a> {
    Dir(&'a Path),
    Flat(&'a serde_json::Map<String, serde_json::Value>),
}

impl Device<'_> {
    fn attr(&self, name: &str) -> Option<String> {
        match self {
            Device::Dir(dir) => read_attr(dir, name),
            Device::Flat(attrs) => attrs
                .get(name)
                .and_then(|v| v.as_str())
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty()),
        }
    }

    /// Config space: the file, or the dump's hex string.
    fn config(&self) -> Result<Vec<u8>, ScanError> {
        match self {
            Device::Dir(dir) => {
                let path = dir.join("config");
                read_sysfs_file(&path).map_err(|source| ScanError::Read { path, source })
            }
            Device::Flat(attrs) => {
                let hex = attrs.get("config").and_then(|v| v.as_str()).unwrap_or("");
                let bad = || ScanError::Read {
                    path: PathBuf::from("config"),
                    source: std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        "not an even number of hex digits",
                    ),
                };
                if hex.len() % 2 != 0 || hex.len() as u64 > 2 * MAX_SYSFS_FILE {
                    return Err(bad());
                }
                (0..hex.len())
                    .step_by(2)
                    .map(|i| u8::from_str_radix(hex.get(i..i + 2).unwrap_or("zz"), 16))
                    .collect::<Result<Vec<u8>, _>>()
                    .map_err(|_| bad())
            }
        }
    }

    /// The bound driver's name.
    fn driver(&self) -> Option<String> {
        match self {
            // the kernel links `driver` to `…/bus/pci/drivers/NAME`; a link elsewhere (to
            // itself) names no driver
            Device::Dir(dir) => fs::read_link(dir.join("driver")).ok().and_then(|p| {
                let parent_is_drivers =
                    p.parent().and_then(Path::file_name) == Some("drivers".as_ref());
                parent_is_drivers
                    .then(|| p.file_name().map(|n| n.to_string_lossy().into_owned()))
                    .flatten()
            }),
            Device::Flat(_) => self.attr("driver"),
        }
    }
}

/// The entries of `sys/bus/pci/devices` named by a PCI address, with their paths.
fn pci_devices(entries: fs::ReadDir) -> impl Iterator<Item = (Bdf, PathBuf)> {
    entries.flatten().filter_map(|e| {
        let bdf = e.file_name().to_str()?.parse::<Bdf>().ok()?;
        Some((bdf, e.path()))
    })
}

/// A network function the guest has (PCI class 02), with the names its drivers gave it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetFunction {
    pub vendor: u32,
    pub device: u32,
    /// RDMA devices (`infiniband/`), what NCCL's IB transport names its `<net>`s.
    pub rdma: Vec<String>,
    /// Network interfaces (`net/`), what its socket transport names them.
    pub net: Vec<String>,
}

/// The sorted entries of a directory; none when it is absent.
fn dir_names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// Every network function below `root/sys/bus/pci/devices`, by address (an unreadable
/// listing gives none: the NCCL check then finds every NIC of its file missing).
pub fn network_functions(root: &Path) -> std::collections::BTreeMap<Bdf, NetFunction> {
    let mut out = std::collections::BTreeMap::new();
    let Ok(entries) = fs::read_dir(root.join("sys/bus/pci/devices")) else {
        return out;
    };
    for (bdf, dir) in pci_devices(entries) {
        let hex = |name: &str| read_attr(&dir, name).and_then(|v| parse_hex(&v));
        if hex("class").is_none_or(|c| c >> 16 != 0x02) {
            continue;
        }
        out.insert(
            bdf,
            NetFunction {
                vendor: hex("vendor").unwrap_or(0),
                device: hex("device").unwrap_or(0),
                rdma: dir_names(&dir.join("infiniband")),
                net: dir_names(&dir.join("net")),
            },
        );
    }
    out
}

fn scan_device(dir: &Device, bdf: Bdf) -> Result<Option<GpuScan>, ScanError> {
    let config = dir.config()?;
    let cs = ConfigSpace::new(&config);
    let vendor = dir
        .attr("vendor")
        .and_then(|v| parse_hex(&v))
        .or_else(|| cs.vendor_id().ok().map(u32::from));
    let class = dir
        .attr("class")
        .and_then(|v| parse_hex(&v))
        .or_else(|| cs.class_code().ok());
    let (Some(vendor), Some(class)) = (vendor, class) else {
        return Ok(None);
    };
    if vendor != NVIDIA_VENDOR as u32 || class >> 16 != CLASS_DISPLAY {
        return Ok(None);
    }
    let device = dir
        .attr("device")
        .and_then(|v| parse_hex(&v))
        .or_else(|| cs.device_id().ok().map(u32::from))
        .unwrap_or(0);
    let caps_readable = cs.has_device_specific_area();
    let (clique, cap_offset, cap_linked, problem) = if caps_readable {
        decode_clique(&cs)
    } else {
        (None, None, None, None)
    };
    let pcie = cs.pcie();
    let link_speed = dir
        .attr("current_link_speed")
        .or_else(|| pcie.and_then(|p| p.current_speed).map(|s| s.to_string()));
    let link_width = dir
        .attr("current_link_width")
        .and_then(|w| w.parse().ok())
        .or_else(|| pcie.and_then(|p| p.current_width).map(u32::from));
    let max_link_speed = dir
        .attr("max_link_speed")
        .or_else(|| pcie.and_then(|p| p.max_speed).map(|s| s.to_string()));
    let max_link_width = dir
        .attr("max_link_width")
        .and_then(|w| w.parse().ok())
        .or_else(|| pcie.and_then(|p| p.max_width).map(u32::from));
    let driver = dir.driver();
    Ok(Some(GpuScan {
        bdf,
        vendor: format!("{vendor:#06x}"),
        device: format!("{device:#06x}"),
        class: format!("{class:#08x}"),
        driver,
        config_bytes: cs.len(),
        caps_readable,
        clique,
        cap_offset,
        cap_linked,
        problem,
        link_speed,
        link_width,
        max_link_speed,
        max_link_width,
        numa_node: dir.attr("numa_node").and_then(|n| n.parse().ok()),
    }))
}

type CliqueFields = (Option<u8>, Option<String>, Option<bool>, Option<String>);

/// The capability as the driver finds it (by walking the list), or a capability at
/// a hypervisor's usual offsets that the walk does not reach.
fn decode_clique(cs: &ConfigSpace<'_>) -> CliqueFields {
    let (_, walk_error) = cs.capabilities().collect_checked();
    if let Some(c) = clique::find(cs) {
        let problem = walk_error.map(|e| format!("capability list: {e}"));
        return (
            Some(c.clique),
            Some(format!("{:#04x}", c.offset)),
            Some(true),
            problem,
        );
    }
    for offset in [clique::OFFSET_PRIMARY, clique::OFFSET_FALLBACK] {
        if let Ok(c) = clique::decode_at(cs, offset) {
            return (
                None,
                Some(format!("{offset:#04x}")),
                Some(false),
                Some(format!(
                    "a clique capability (clique {}) sits at {offset:#04x} but is not linked in the \
                     capability list: the driver will not see it",
                    c.clique
                )),
            );
        }
    }
    let problem = walk_error.map(|e| format!("capability list: {e}"));
    (None, None, None, problem)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu_config(clique_at: Option<(u8, bool)>) -> Vec<u8> {
        let mut b = vec![0u8; 256];
        b[0..4].copy_from_slice(&[0xde, 0x10, 0x35, 0x23]);
        b[0x06] = 0x10;
        b[0x09..0x0c].copy_from_slice(&[0x00, 0x02, 0x03]);
        b[0x34] = 0x60;
        b[0x60..0x64].copy_from_slice(&[0x10, 0x00, 0x02, 0x00]);
        if let Some((offset, linked)) = clique_at {
            if linked {
                b[0x61] = offset;
            }
            b[offset as usize..offset as usize + 8].copy_from_slice(&clique::encode(2, 0).unwrap());
        }
        b
    }

    #[test]
    fn linked_capability() {
        let b = gpu_config(Some((0xd4, true)));
        let (clique, off, linked, problem) = decode_clique(&ConfigSpace::new(&b));
        assert_eq!(
            (clique, off.as_deref(), linked),
            (Some(2), Some("0xd4"), Some(true))
        );
        assert_eq!(problem, None);
    }

    #[test]
    fn unlinked_capability_is_a_problem() {
        let b = gpu_config(Some((0xc8, false)));
        let (clique, off, linked, problem) = decode_clique(&ConfigSpace::new(&b));
        assert_eq!(
            (clique, off.as_deref(), linked),
            (None, Some("0xc8"), Some(false))
        );
        assert!(problem.unwrap().contains("not linked"));
    }

    #[test]
    fn no_capability() {
        let b = gpu_config(None);
        assert_eq!(
            decode_clique(&ConfigSpace::new(&b)),
            (None, None, None, None)
        );
    }
}
