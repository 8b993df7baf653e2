//! The live sysfs reader. Everything is read below `ROOT/sys` (and `ROOT/proc`),
//! so real hosts, `snapshot` directories and test fixtures go through this code.

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Read};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use nix::fcntl::OFlag;
use nix::sys::stat::Mode;
use pci_config::Bdf;

use super::attr;
use super::flat_json;
use super::record::{DeviceRecord, HostBridgeId, HostRecord, ReadWarning};

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("{path}: no PCI devices directory here; pass --sysfs-root pointing at a directory that contains sys/bus/pci/devices (a live root '/' or a 'vfio-p2p snapshot' directory), or at a snapshot .json file")]
    NoSysfs { path: PathBuf },
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("{path}: {message}")]
    Snapshot { path: PathBuf, message: String },
}

/// Reads the host below `root` (a directory, or a flat JSON snapshot file).
pub fn read_host(root: &Path) -> Result<HostRecord, ReadError> {
    if root.is_file() {
        return flat_json::read_file(root);
    }
    let devices_dir = root.join("sys/bus/pci/devices");
    let entries = fs::read_dir(&devices_dir).map_err(|e| match e.kind() {
        io::ErrorKind::NotFound => ReadError::NoSysfs {
            path: devices_dir.clone(),
        },
        _ => ReadError::Io {
            path: devices_dir.clone(),
            source: e,
        },
    })?;
    let mut host = HostRecord {
        source: root.display().to_string(),
        ..Default::default()
    };
    let groups = read_iommu_groups(root, &mut host.warnings);
    let mut bdfs = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| ReadError::Io {
            path: devices_dir.clone(),
            source: e,
        })?;
        let name = entry.file_name().to_string_lossy().into_owned();
        match name.parse::<Bdf>() {
            Ok(b) => bdfs.push(b),
            Err(e) => host.warnings.push(ReadWarning {
                device: None,
                file: Some(entry.path().display().to_string()),
                message: format!("skipped: {e}"),
            }),
        }
    }
    bdfs.sort();
    let mut short_config = 0usize;
    for (device, warnings) in read_devices(root, &bdfs, &groups) {
        host.warnings.extend(warnings);
        if let Some(d) = device {
            if !d.config.is_empty() && d.config.len() <= pci_config::CONFIG_SPACE_UNPRIVILEGED {
                short_config += 1;
            }
            host.devices.push(d);
        }
    }
    host.devices.sort_by_key(|d| d.bdf);
    if short_config > 0 {
        host.warnings.push(ReadWarning {
            device: None,
            file: None,
            message: format!(
                "only the first 64 bytes of config space are readable for {short_config} device(s) (not running as root): \
                 capabilities, ACS, link and clique placement are unknown there; run as root for the full picture"
            ),
        });
    }
    host.numa_nodes = read_numa_nodes(root, &mut host.warnings);
    host.kernel_cmdline = fs::read_to_string(root.join("proc/cmdline"))
        .ok()
        .map(|s| s.trim().to_string());
    Ok(host)
}

/// Reads every device, in `bdfs` order. Hosts have thousands of functions and each
/// needs about 20 small reads, so the work is spread over a few threads.
fn read_devices(
    root: &Path,
    bdfs: &[Bdf],
    groups: &BTreeMap<Bdf, u32>,
) -> Vec<(Option<DeviceRecord>, Vec<ReadWarning>)> {
    let read_one = |bdf: &Bdf| {
        let mut warnings = Vec::new();
        let d = read_device(root, *bdf, groups, &mut warnings);
        (d, warnings)
    };
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, 8);
    if threads == 1 || bdfs.len() < 64 {
        return bdfs.iter().map(read_one).collect();
    }
    let chunk = bdfs.len().div_ceil(threads);
    std::thread::scope(|s| {
        let handles: Vec<_> = bdfs
            .chunks(chunk)
            .map(|part| s.spawn(move || part.iter().map(read_one).collect::<Vec<_>>()))
            .collect();
        handles
            .into_iter()
            .flat_map(|h| match h.join() {
                Ok(v) => v,
                Err(panic) => std::panic::resume_unwind(panic),
            })
            .collect()
    })
}

/// The device's real directory, from the `sys/bus/pci/devices/BDF` link, as a path
/// relative to `sys/devices` (checked: no component may climb out of it).
fn device_dir(root: &Path, bdf: Bdf) -> Result<Vec<String>, String> {
    let link = root.join("sys/bus/pci/devices").join(bdf.to_string());
    let target =
        fs::read_link(&link).map_err(|e| format!("not a symlink into sys/devices: {e}"))?;
    let mut parts: Vec<String> = Vec::new();
    let mut after_devices = false;
    for c in target.components() {
        match c {
            Component::ParentDir if !after_devices => {}
            Component::Normal(s) if !after_devices => {
                after_devices = s == "devices";
                if !after_devices {
                    return Err(format!(
                        "link target {} does not lead into sys/devices",
                        target.display()
                    ));
                }
            }
            Component::Normal(s) => parts.push(s.to_string_lossy().into_owned()),
            _ => {
                return Err(format!(
                    "link target {} is not a plain relative path",
                    target.display()
                ))
            }
        }
    }
    if parts.last().map(String::as_str) != Some(&bdf.to_string()) {
        return Err(format!(
            "link target {} does not end in {bdf}",
            target.display()
        ));
    }
    Ok(parts)
}

/// Host bridge and ancestor bridges from the path components under `sys/devices`:
/// the last `pciDDDD:BB` component is the host bridge, every BDF after it a bridge.
pub(crate) fn split_device_path(parts: &[String]) -> Result<(HostBridgeId, Vec<Bdf>), String> {
    let hb_pos = parts
        .iter()
        .rposition(|p| p.starts_with("pci"))
        .ok_or_else(|| format!("no host bridge (pciDDDD:BB) in {}", parts.join("/")))?;
    let hb: HostBridgeId = parts[hb_pos].parse()?;
    let chain = parts[hb_pos + 1..]
        .iter()
        .map(|p| p.parse::<Bdf>().map_err(|e| e.to_string()))
        .collect::<Result<Vec<_>, _>>()?;
    let (_, ancestors) = chain.split_last().ok_or("empty device path")?;
    Ok((hb, ancestors.to_vec()))
}

fn read_device(
    root: &Path,
    bdf: Bdf,
    groups: &BTreeMap<Bdf, u32>,
    warnings: &mut Vec<ReadWarning>,
) -> Option<DeviceRecord> {
    let link_path = format!("sys/bus/pci/devices/{bdf}");
    let parts = match device_dir(root, bdf).and_then(|p| split_device_path(&p).map(|s| (p, s))) {
        Ok(p) => p,
        Err(message) => {
            warnings.push(ReadWarning {
                device: Some(bdf),
                file: Some(link_path),
                message: format!("skipped: {message}"),
            });
            return None;
        }
    };
    let (parts, (host_bridge, ancestors)) = parts;
    let dir = root.join("sys/devices").join(parts.join("/"));
    let mut r = AttrReader::open(&dir, bdf, warnings);
    let vendor = r.parsed("vendor", attr::hex_u16)?;
    let device = r.parsed("device", attr::hex_u16)?;
    let class = r.parsed("class", attr::hex_u32)?;
    let config = match r.read("config") {
        Ok(c) => c,
        Err(e) => {
            r.warn("config", format!("unreadable: {e}"));
            Vec::new()
        }
    };
    let numa_node = r.text("numa_node").and_then(|t| match attr::numa_node(&t) {
        Ok(n) => n,
        Err(m) => {
            r.warn("numa_node", m);
            None
        }
    });
    Some(DeviceRecord {
        bdf,
        host_bridge,
        ancestors,
        vendor,
        device,
        class,
        subsystem_vendor: r.optional("subsystem_vendor", attr::hex_u16),
        subsystem_device: r.optional("subsystem_device", attr::hex_u16),
        config,
        numa_node,
        local_cpulist: r.optional("local_cpulist", attr::cpulist),
        iommu_group: groups.get(&bdf).copied(),
        driver: r.link_name("driver"),
        // `(null)` (no override) parses to None and is not worth a warning.
        driver_override: r
            .text("driver_override")
            .and_then(|t| attr::driver_override(&t)),
        resources: r.optional("resource", attr::resources).unwrap_or_default(),
        current_link_speed: r.optional("current_link_speed", attr::link_speed),
        current_link_width: r
            .optional("current_link_width", attr::decimal_u8)
            .filter(|w| *w != 0),
        max_link_speed: r.optional("max_link_speed", attr::link_speed),
        max_link_width: r
            .optional("max_link_width", attr::decimal_u8)
            .filter(|w| *w != 0),
        reset_method: r.text("reset_method").map(|t| attr::reset_method(&t)),
    })
}

/// Reads one device's attribute files, turning problems into warnings that name the file.
///
/// Files are opened relative to the device directory's descriptor: a host has
/// thousands of functions with ~20 files each, and walking the full (deep) path
/// for every one of them was most of `topo`'s time.
struct AttrReader<'a> {
    dir: &'a Path,
    /// The open error, when the directory cannot be opened, is what every read reports.
    dir_fd: Result<OwnedFd, io::Error>,
    bdf: Bdf,
    warnings: &'a mut Vec<ReadWarning>,
}

impl<'a> AttrReader<'a> {
    fn open(dir: &'a Path, bdf: Bdf, warnings: &'a mut Vec<ReadWarning>) -> Self {
        let flags = OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
        let dir_fd = nix::fcntl::open(dir, flags, Mode::empty()).map_err(io::Error::from);
        AttrReader {
            dir,
            dir_fd,
            bdf,
            warnings,
        }
    }

    fn dir_fd(&self) -> io::Result<BorrowedFd<'_>> {
        match &self.dir_fd {
            Ok(fd) => Ok(fd.as_fd()),
            Err(e) => Err(io::Error::new(e.kind(), e.to_string())),
        }
    }

    /// The bytes of attribute `name` (at most 64 KiB: sysfs attributes are one page,
    /// `config` 4 KiB; anything larger is not sysfs).
    fn read(&self, name: &str) -> io::Result<Vec<u8>> {
        let flags = OFlag::O_RDONLY | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW;
        let fd = nix::fcntl::openat(self.dir_fd()?, name, flags, Mode::empty())?;
        let mut bytes = Vec::with_capacity(256);
        fs::File::from(fd).take(64 << 10).read_to_end(&mut bytes)?;
        Ok(bytes)
    }

    /// The last component of symlink `name` (`driver` → `nvidia`).
    fn link_name(&self, name: &str) -> Option<String> {
        let target = nix::fcntl::readlinkat(self.dir_fd().ok()?, name).ok()?;
        Path::new(&target)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
    }

    fn warn(&mut self, name: &str, message: String) {
        self.warnings.push(ReadWarning {
            device: Some(self.bdf),
            file: Some(self.dir.join(name).display().to_string()),
            message,
        });
    }

    /// The file's text, `None` when absent (many attributes are optional).
    fn text(&mut self, name: &str) -> Option<String> {
        match self.read(name) {
            Ok(b) => match String::from_utf8(b) {
                Ok(s) => Some(s),
                Err(_) => {
                    self.warn(name, "not text".into());
                    None
                }
            },
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => {
                self.warn(name, format!("unreadable: {e}"));
                None
            }
        }
    }

    fn optional<T>(&mut self, name: &str, parse: impl Fn(&str) -> Option<T>) -> Option<T> {
        let t = self.text(name)?;
        let v = parse(&t);
        if v.is_none()
            && !t.trim().is_empty()
            && !matches!(name, "current_link_speed" | "max_link_speed")
        {
            self.warn(name, format!("unexpected content {:?}", t.trim()));
        }
        v
    }

    /// A required attribute: without it the device is skipped (with a warning).
    fn parsed<T>(&mut self, name: &str, parse: impl Fn(&str) -> Option<T>) -> Option<T> {
        let Some(t) = self.text(name) else {
            self.warn(name, "missing; device skipped".into());
            return None;
        };
        let v = parse(&t);
        if v.is_none() {
            self.warn(
                name,
                format!("unexpected content {:?}; device skipped", t.trim()),
            );
        }
        v
    }
}

fn read_iommu_groups(root: &Path, warnings: &mut Vec<ReadWarning>) -> BTreeMap<Bdf, u32> {
    let mut out = BTreeMap::new();
    let dir = root.join("sys/kernel/iommu_groups");
    let Ok(groups) = fs::read_dir(&dir) else {
        return out;
    };
    for g in groups.flatten() {
        let name = g.file_name().to_string_lossy().into_owned();
        let Ok(id) = name.parse::<u32>() else {
            warnings.push(ReadWarning {
                device: None,
                file: Some(g.path().display().to_string()),
                message: "not a group number; skipped".into(),
            });
            continue;
        };
        let Ok(members) = fs::read_dir(g.path().join("devices")) else {
            continue;
        };
        for m in members.flatten() {
            if let Ok(bdf) = m.file_name().to_string_lossy().parse::<Bdf>() {
                out.insert(bdf, id);
            }
        }
    }
    out
}

fn read_numa_nodes(root: &Path, warnings: &mut Vec<ReadWarning>) -> BTreeMap<u32, String> {
    let mut out = BTreeMap::new();
    let dir = root.join("sys/devices/system/node");
    let Ok(nodes) = fs::read_dir(&dir) else {
        return out;
    };
    for n in nodes.flatten() {
        let name = n.file_name().to_string_lossy().into_owned();
        let Some(id) = name
            .strip_prefix("node")
            .and_then(|i| i.parse::<u32>().ok())
        else {
            continue;
        };
        let path = n.path().join("cpulist");
        match fs::read_to_string(&path)
            .ok()
            .as_deref()
            .and_then(attr::cpulist)
        {
            Some(c) => {
                out.insert(id, c);
            }
            None => warnings.push(ReadWarning {
                device: None,
                file: Some(path.display().to_string()),
                message: "missing or not a CPU list".into(),
            }),
        }
    }
    out
}
