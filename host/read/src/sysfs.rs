//! The live sysfs reader. Everything is read below `ROOT/sys` (and `ROOT/proc`),
//! so real hosts, `snapshot` directories and test fixtures go through this code.

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Read};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use nix::fcntl::OFlag;
use nix::sys::stat::Mode;
use pci_config::{Bdf, ConfigSpace, HeaderType};

use super::attr;
use super::flat_json;
use vfio_p2p_files::read_attribute_text;
use vfio_p2p_model::record::{DeviceRecord, HostBridgeId, HostRecord, NicNames, ReadWarning};

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("{path}: no PCI devices directory here; pass --sysfs-root pointing at a directory that contains sys/bus/pci/devices (a live root '/' or a 'vfio-p2p snapshot' directory), or at a snapshot .json file")]
    NoSysfs { path: PathBuf },
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("{path}: {message}")]
    Snapshot { path: PathBuf, message: String },
    /// A file that is not a regular file, too large or unreadable (it names the file).
    #[error(transparent)]
    Input(#[from] vfio_p2p_files::InputFileError),
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
    host.nic_names = read_nic_names(root, &host.devices);
    host.kernel_cmdline = read_attribute_text(&root.join("proc/cmdline"), "kernel command line")
        .ok()
        .map(|s| s.trim().to_string());
    match super::cpuinfo::read(&root.join("proc/cpuinfo")) {
        Ok(cpu) => host.cpu = cpu,
        Err(message) => host.warnings.push(ReadWarning {
            device: None,
            file: Some(root.join("proc/cpuinfo").display().to_string()),
            message,
        }),
    }
    Ok(host)
}

/// Reads every device, in `bdfs` order. Hosts have thousands of functions and each
/// needs about 8 small reads, so the work is spread over one thread per core (at
/// most 8; below 64 devices one thread, as spawning would cost more than it saves).
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
    let config = r.config();
    let header = ConfigHeader::decode(&config);
    let (vendor, device, class) = match &header {
        Some(h) => {
            // The kernel's `class` can differ from config: quirks rewrite it
            // (drivers/pci/quirks.c, e.g. quirk_tw686x_class, quirk_amd_nl_class)
            // and the model classifies devices by it, so the file still decides.
            let class = r
                .optional("class", attr::hex_u32, "using the class code from config")
                .unwrap_or(h.class);
            (h.vendor, h.device, class)
        }
        None => (
            r.required("vendor", attr::hex_u16)?,
            r.required("device", attr::hex_u16)?,
            r.required("class", attr::hex_u32)?,
        ),
    };
    let (subsystem_vendor, subsystem_device) = match header.and_then(|h| h.subsystem) {
        Some((v, d)) => (Some(v), Some(d)),
        None => (
            r.optional("subsystem_vendor", attr::hex_u16, ""),
            r.optional("subsystem_device", attr::hex_u16, ""),
        ),
    };
    let numa_node = r.parsed("numa_node", attr::numa_node);
    let local_cpulist = r.optional("local_cpulist", attr::cpulist, "");
    let driver = r.driver();
    // `(null)` (no override) parses to None and is not worth a warning.
    let driver_override = r.parsed("driver_override", |t| Ok(attr::driver_override(t)));
    let resources = r
        .optional("resource", attr::resources, "")
        .unwrap_or_default();
    let link = match LinkSource::decode(&config) {
        LinkSource::Config(link) => link,
        LinkSource::NoPcieCapability => Link::default(),
        LinkSource::Files => Link {
            current_speed: r.optional("current_link_speed", attr::link_speed, ""),
            current_width: r
                .optional("current_link_width", attr::decimal_u8, "")
                .filter(|w| *w != 0),
            max_speed: r.optional("max_link_speed", attr::link_speed, ""),
            max_width: r
                .optional("max_link_width", attr::decimal_u8, "")
                .filter(|w| *w != 0),
        },
    };
    let reset_method = r.parsed("reset_method", |t| Ok(Some(attr::reset_method(t))));
    Some(DeviceRecord {
        bdf,
        host_bridge,
        ancestors,
        vendor,
        device,
        class,
        subsystem_vendor,
        subsystem_device,
        config,
        numa_node,
        local_cpulist,
        iommu_group: groups.get(&bdf).copied(),
        driver,
        driver_override,
        resources,
        current_link_speed: link.current_speed,
        current_link_width: link.current_width,
        max_link_speed: link.max_speed,
        max_link_width: link.max_width,
        reset_method,
    })
}

/// The IDs in the first 64 bytes of config space, which anyone may read: the
/// same values as the `vendor`, `device` and `subsystem_*` files, without opening them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ConfigHeader {
    vendor: u16,
    device: u16,
    /// Only a fallback: the `class` file is read (quirks may rewrite the class).
    class: u32,
    /// Type-0 headers: offset 0x2c. Bridges: the SSVID capability when the full config
    /// is readable, else `None` (then the files are read).
    subsystem: Option<(u16, u16)>,
}

impl ConfigHeader {
    /// `None` where the files must be read instead: config shorter than 64 bytes,
    /// or IDs of 0xffff (an SR-IOV virtual function reads 0xffff there and the kernel
    /// takes its IDs from the physical function; a device gone reads all ones).
    fn decode(bytes: &[u8]) -> Option<ConfigHeader> {
        if bytes.len() < pci_config::CONFIG_SPACE_UNPRIVILEGED {
            return None;
        }
        let config = ConfigSpace::new(bytes);
        let vendor = config.vendor_id().ok()?;
        let device = config.device_id().ok()?;
        if vendor == 0xffff || device == 0xffff {
            return None;
        }
        let subsystem = match config.header_type().ok()? {
            HeaderType::Endpoint => Some((config.u16_at(0x2c)?, config.u16_at(0x2e)?)),
            HeaderType::Bridge => bridge_subsystem(&config),
            _ => None,
        };
        Some(ConfigHeader {
            vendor,
            device,
            class: config.class_code().ok()?,
            subsystem,
        })
    }
}

/// A type-1 header's subsystem IDs, as the kernel sets them (drivers/pci/probe.c
/// `pci_setup_device`): from the SSVID capability, 0 without one. Known only when
/// the whole capability list was readable and walked cleanly.
fn bridge_subsystem(config: &ConfigSpace) -> Option<(u16, u16)> {
    let (caps, error) = full_capability_list(config)?;
    match caps.iter().find(|c| c.id == CAP_ID_SSVID) {
        Some(c) => {
            let at = usize::from(c.offset);
            Some((config.u16_at(at + 4)?, config.u16_at(at + 6)?))
        }
        None if error.is_none() => Some((0, 0)),
        None => None,
    }
}

/// Bridge subsystem vendor ID capability (`PCI_CAP_ID_SSVID` in linux/pci_regs.h).
const CAP_ID_SSVID: u8 = 0x0d;

/// The standard capability list, when config space holds all of it (256 bytes or more).
fn full_capability_list(
    config: &ConfigSpace,
) -> Option<(Vec<pci_config::Capability>, Option<pci_config::WalkError>)> {
    (config.len() >= pci_config::CONFIG_SPACE_LEGACY)
        .then(|| config.capabilities().collect_checked())
}

/// The four link attributes of a PCIe function.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Link {
    current_speed: Option<String>,
    current_width: Option<u8>,
    max_speed: Option<String>,
    max_width: Option<u8>,
}

/// Where a device's link facts come from.
#[derive(Debug, PartialEq, Eq)]
enum LinkSource {
    /// Decoded from the PCIe capability, as the kernel's attributes compute them.
    Config(Link),
    /// The full capability list has no PCIe capability: the kernel shows no link
    /// files for such a device (`pcie_dev_attrs_are_visible`).
    NoPcieCapability,
    /// Config space too short or damaged, or kernels disagree: read the files.
    Files,
}

impl LinkSource {
    fn decode(bytes: &[u8]) -> LinkSource {
        let config = ConfigSpace::new(bytes);
        let Some((caps, error)) = full_capability_list(&config) else {
            return LinkSource::Files;
        };
        let Some(pcie) = caps.iter().find(|c| c.id == pci_config::CAP_ID_PCIE) else {
            return match error {
                None => LinkSource::NoPcieCapability,
                Some(_) => LinkSource::Files,
            };
        };
        match Self::registers(&config, usize::from(pcie.offset)) {
            Some(link) => LinkSource::Config(link),
            None => LinkSource::Files,
        }
    }

    /// drivers/pci/pci-sysfs.c: `current_link_*` from Link Status, `max_link_width`
    /// from Link Capabilities, `max_link_speed` from `pcie_get_speed_cap`, which takes
    /// the top Supported Link Speeds bit of Link Capabilities 2 when that register is
    /// set (newer kernels also cap it at the Link Capabilities speed). Where the two
    /// registers disagree the answer depends on the kernel, so `None`: read the file.
    fn registers(config: &ConfigSpace, base: usize) -> Option<Link> {
        let version = config.u16_at(base + 0x02)? & 0xf;
        let link_cap = config.u32_at(base + 0x0c)?;
        let link_status = config.u16_at(base + 0x12)?;
        let link_cap2 = if version >= 2 {
            config.u32_at(base + 0x2c)?
        } else {
            0
        };
        let max_code = (link_cap & 0xf) as u8;
        if link_cap2 != 0 {
            let vector = (link_cap2 >> 1) & 0x7f;
            if 32 - vector.leading_zeros() != u32::from(max_code) {
                return None;
            }
        }
        let width = |v: u32| Some(((v >> 4) & 0x3f) as u8).filter(|w| *w != 0);
        Some(Link {
            current_speed: attr::link_speed_text((link_status & 0xf) as u8),
            current_width: width(u32::from(link_status)),
            max_speed: attr::link_speed_text(max_code),
            max_width: width(link_cap),
        })
    }
}

/// Largest file read: `config` is at most 4 KiB and a sysfs text attribute one page.
const READ_BUFFER: usize = pci_config::CONFIG_SPACE_EXTENDED;

/// Reads one device's attribute files, turning problems into warnings that name the file.
///
/// Files are opened relative to the device directory's descriptor: a host has
/// thousands of functions, and walking the full (deep) path for every file was
/// most of `topo`'s time. Each file is read with one `read` into a stack buffer:
/// sysfs hands out a whole attribute in the first read (Documentation/filesystems/sysfs.rst),
/// as regular files of a snapshot do.
struct AttrReader<'a> {
    dir: &'a Path,
    /// The open error, when the directory cannot be opened, is what every read reports.
    dir_fd: Result<OwnedFd, io::Error>,
    bdf: Bdf,
    warnings: &'a mut Vec<ReadWarning>,
    buf: [u8; READ_BUFFER],
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
            buf: [0; READ_BUFFER],
        }
    }

    fn dir_fd(&self) -> io::Result<BorrowedFd<'_>> {
        match &self.dir_fd {
            Ok(fd) => Ok(fd.as_fd()),
            Err(e) => Err(io::Error::new(e.kind(), e.to_string())),
        }
    }

    /// Reads attribute `name` into the buffer with one `read`; the length read.
    /// Regular files only (sysfs attributes are), opened without blocking: a FIFO in a
    /// copied tree is an error instead of a hang.
    fn read(&mut self, name: &str) -> io::Result<usize> {
        let flags = OFlag::O_RDONLY | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK;
        let fd = nix::fcntl::openat(self.dir_fd()?, name, flags, Mode::empty()).map_err(|e| {
            match e {
                // O_NOFOLLOW on a symlink: say what it is, not "too many levels of links"
                nix::errno::Errno::ELOOP => io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "not a regular file but a symbolic link (sysfs attributes are regular files)",
                ),
                e => io::Error::from(e),
            }
        })?;
        let file = fs::File::from(fd);
        if !file.metadata()?.is_file() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a regular file (sysfs attributes are)",
            ));
        }
        (&file).read(&mut self.buf)
    }

    /// Config space as readable (empty, with a warning, when it is not).
    fn config(&mut self) -> Vec<u8> {
        match self.read("config") {
            Ok(n) => self.buf[..n].to_vec(),
            Err(e) => {
                self.warn("config", format!("unreadable: {e}"));
                Vec::new()
            }
        }
    }

    /// The driver the `driver` link names (`…/drivers/nvidia` → `nvidia`); a link that
    /// points elsewhere is a warning, not a driver.
    fn driver(&mut self) -> Option<String> {
        let target = nix::fcntl::readlinkat(self.dir_fd().ok()?, "driver").ok()?;
        match attr::driver_link(Path::new(&target)) {
            Ok(name) => Some(name),
            Err(why) => {
                self.warn("driver", why);
                None
            }
        }
    }

    fn warn(&mut self, name: &str, message: String) {
        self.warnings.push(ReadWarning {
            device: Some(self.bdf),
            file: Some(self.dir.join(name).display().to_string()),
            message,
        });
    }

    /// Reads text attribute `name` and parses it. `None` when absent (many attributes
    /// are optional, and not worth a warning); otherwise a warning says what went wrong.
    fn parsed<T>(
        &mut self,
        name: &str,
        parse: impl FnOnce(&str) -> Result<Option<T>, String>,
    ) -> Option<T> {
        let n = match self.read(name) {
            Ok(n) if n < READ_BUFFER => n,
            Ok(_) => {
                self.warn(
                    name,
                    format!("larger than {READ_BUFFER} bytes: not a sysfs attribute"),
                );
                return None;
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => return None,
            Err(e) => {
                self.warn(name, format!("unreadable: {e}"));
                return None;
            }
        };
        let result = match std::str::from_utf8(&self.buf[..n]) {
            Ok(text) => parse(text),
            Err(_) => Err("not text".into()),
        };
        result.unwrap_or_else(|message| {
            self.warn(name, message);
            None
        })
    }

    /// An attribute whose unparseable content is warned about; `fallback` (if not
    /// empty) says what is used instead.
    fn optional<T>(
        &mut self,
        name: &str,
        parse: impl Fn(&str) -> Option<T>,
        fallback: &str,
    ) -> Option<T> {
        let lenient = matches!(name, "current_link_speed" | "max_link_speed");
        self.parsed(name, |t| match parse(t) {
            Some(v) => Ok(Some(v)),
            None if lenient || t.trim().is_empty() => Ok(None),
            None if fallback.is_empty() => Err(format!("unexpected content {:?}", t.trim())),
            None => Err(format!("unexpected content {:?}; {fallback}", t.trim())),
        })
    }

    /// A required attribute: without it the device is skipped (with a warning).
    fn required<T>(&mut self, name: &str, parse: impl Fn(&str) -> Option<T>) -> Option<T> {
        let mut seen = false;
        let v = self.parsed(name, |t| {
            seen = true;
            match parse(t) {
                Some(v) => Ok(Some(v)),
                None => Err(format!("unexpected content {:?}; device skipped", t.trim())),
            }
        });
        if !seen {
            self.warn(name, "missing; device skipped".into());
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

/// The entries of a directory, sorted; none when it is absent or unreadable.
fn dir_names(dir: &Path) -> Vec<String> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut names: Vec<String> = entries
        .flatten()
        .filter_map(|e| e.file_name().to_str().map(str::to_string))
        .collect();
    names.sort();
    names
}

/// Each network function's interface and RDMA device names: the entries of its `net/`
/// and `infiniband/` directories (what `ip link` and `ibv_devices` list).
fn read_nic_names(root: &Path, devices: &[DeviceRecord]) -> BTreeMap<Bdf, NicNames> {
    let mut out = BTreeMap::new();
    for d in devices.iter().filter(|d| d.class >> 16 == 0x02) {
        let dir = root.join(format!("sys/bus/pci/devices/{}", d.bdf));
        let names = NicNames {
            net: dir_names(&dir.join("net")),
            rdma: dir_names(&dir.join("infiniband")),
        };
        if !names.net.is_empty() || !names.rdma.is_empty() {
            out.insert(d.bdf, names);
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
        match read_attribute_text(&path, "NUMA node CPU list")
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

#[cfg(test)]
mod tests {
    use super::*;

    /// 256 bytes with a capability list: PCIe (version `version`) at 0x40, then `next`.
    fn config_with_pcie(version: u8, next: u8) -> Vec<u8> {
        let mut c = vec![0u8; pci_config::CONFIG_SPACE_LEGACY];
        c[0..4].copy_from_slice(&[0xde, 0x10, 0x30, 0x23]);
        c[0x06] = 0x10;
        c[0x34] = 0x40;
        c[0x40] = pci_config::CAP_ID_PCIE;
        c[0x41] = next;
        c[0x42] = version;
        // Link Capabilities: 16 GT/s x16.
        c[0x4c..0x50].copy_from_slice(&(0x04u32 | (16 << 4)).to_le_bytes());
        c[0x52] = 0x03 | (8 << 4); // Link Status: 8 GT/s x8
        c[0x6c] = 0x1f << 1; // Link Capabilities 2: up to 32 GT/s
        c
    }

    #[test]
    fn link_from_config_follows_the_kernel() {
        // Version 1: the kernel ignores Link Capabilities 2.
        let LinkSource::Config(link) = LinkSource::decode(&config_with_pcie(1, 0)) else {
            panic!("expected link facts from config");
        };
        assert_eq!(link.current_speed.as_deref(), Some("8.0 GT/s PCIe"));
        assert_eq!(link.current_width, Some(8));
        assert_eq!(link.max_speed.as_deref(), Some("16.0 GT/s PCIe"));
        assert_eq!(link.max_width, Some(16));
        // Version 2 with a disagreeing Link Capabilities 2: the file decides.
        assert_eq!(
            LinkSource::decode(&config_with_pcie(2, 0)),
            LinkSource::Files
        );
        // The 64-byte view has no capability list to decode.
        let short = &config_with_pcie(1, 0)[..pci_config::CONFIG_SPACE_UNPRIVILEGED];
        assert_eq!(LinkSource::decode(short), LinkSource::Files);
    }

    #[test]
    fn damaged_capability_list_reads_the_files() {
        let mut c = config_with_pcie(1, 0);
        c[0x34] = 0x50;
        c[0x50] = pci_config::CAP_ID_MSI;
        c[0x51] = 0x50; // loops before reaching the PCIe capability
        assert_eq!(LinkSource::decode(&c), LinkSource::Files);
        c[0x51] = 0;
        assert_eq!(LinkSource::decode(&c), LinkSource::NoPcieCapability);
    }

    #[test]
    fn header_ids_and_bridge_subsystem() {
        let mut c = config_with_pcie(1, 0);
        c[0x2c..0x30].copy_from_slice(&[0xde, 0x10, 0xc1, 0x16]);
        let h = ConfigHeader::decode(&c).unwrap();
        assert_eq!(
            (h.vendor, h.device, h.subsystem),
            (0x10de, 0x2330, Some((0x10de, 0x16c1)))
        );
        c[0x0e] = 1; // a bridge: no SSVID capability means 0
        assert_eq!(ConfigHeader::decode(&c).unwrap().subsystem, Some((0, 0)));
        c[0x41] = 0x60;
        c[0x60] = CAP_ID_SSVID;
        c[0x64..0x68].copy_from_slice(&[0x86, 0x80, 0x34, 0x12]);
        assert_eq!(
            ConfigHeader::decode(&c).unwrap().subsystem,
            Some((0x8086, 0x1234))
        );
        let short = &c[..pci_config::CONFIG_SPACE_UNPRIVILEGED];
        assert_eq!(ConfigHeader::decode(short).unwrap().subsystem, None);
        c[0..2].fill(0xff);
        assert_eq!(ConfigHeader::decode(&c), None);
        assert_eq!(ConfigHeader::decode(&c[..63]), None);
    }
}
