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
use super::device_record::{build_record, split_device_path, AttrSource, Placement};
use vfio_p2p_files::read_attribute_text;
use vfio_p2p_model::record::{DeviceRecord, HostRecord, NicNames, ReadWarning};

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

/// Reads the host below the directory `root` (a flat JSON dump is
/// [`super::flat_json::read_file`]'s; which one a run reads is decided once, by the context's
/// `HostSource`). Logged at debug level (`-vv`), where tests count the reads of one run.
pub fn read_host(root: &Path) -> Result<HostRecord, ReadError> {
    tracing::debug!("reading the host below {}", root.display());
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
    host.numa_distances = crate::numa_sysfs::read_numa_distances(root, &mut host.warnings);
    host.hugepage_sizes_kib = crate::numa_sysfs::read_hugepage_sizes(root);
    host.iommu_units = crate::iommu_unit::read_iommu_units(root, &bdfs);
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
    let place = Placement {
        bdf,
        host_bridge,
        ancestors,
        iommu_group: groups.get(&bdf).copied(),
    };
    build_record(place, &mut AttrReader::open(&dir, bdf, warnings))
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
}

impl AttrSource for AttrReader<'_> {
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
    for (id, dir) in crate::numa_sysfs::node_dirs(root) {
        let path = dir.join("cpulist");
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
