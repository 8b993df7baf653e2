//! Test support: a host's sysfs as a directory tree, and a [`SysfsWriter`] that plays
//! the kernel's part in it — `driver/unbind` removes the `driver` link, `drivers_probe`
//! binds the driver `driver_override` names (or the host's default), `drivers/NAME/bind`
//! refuses a device whose override names another driver, `reset` takes `1`,
//! `reset_method` takes methods the device supports (or `default`) — and keeps `dev/vfio/N`.
//! Lets the decision and rollback logic be tested without root or a kernel, and gives
//! `--example` dry runs of bind, unbind and the hook a tree to read ([`SimRoot`]).

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::os::unix::fs::symlink;
use std::path::{Component, Path, PathBuf};

use pci_config::Bdf;

use super::apply::SysfsWriter;
use super::bind_plan::{is_vfio_driver, GRACE_GPU_IDS, NVGRACE_GPU_VFIO_PCI, VFIO_PCI};
use vfio_p2p_model::HostRecord;
use vfio_p2p_read::binding::{device_dir, driver_dir, read_binding};
use vfio_p2p_read::snapshot::write_sysfs_tree;

/// Writes `host` as a sysfs tree below `root` (the snapshot writer's), plus what only a
/// live kernel has: `drivers_probe`, each driver's `bind` and `unbind`, and vfio-pci.
pub fn write_tree(host: &HostRecord, root: &Path) -> io::Result<()> {
    write_sysfs_tree(host, root).map_err(io::Error::other)?;
    let drivers = root.join("sys/bus/pci/drivers");
    fs::write(root.join("sys/bus/pci/drivers_probe"), "")?;
    fs::create_dir_all(drivers.join(VFIO_PCI))?;
    // a Grace host's GPUs need the variant driver: loaded, as on a host prepared for VMs
    if host
        .devices
        .iter()
        .any(|d| d.vendor == 0x10de && GRACE_GPU_IDS.contains(&d.device))
    {
        fs::create_dir_all(drivers.join(NVGRACE_GPU_VFIO_PCI))?;
    }
    for d in fs::read_dir(&drivers)?.flatten() {
        fs::write(d.path().join("bind"), "")?;
        fs::write(d.path().join("unbind"), "")?;
    }
    for d in &host.devices {
        let dir = root.join(device_dir(d.bdf));
        if dir.is_dir() {
            fs::write(dir.join("reset"), "")?;
        }
    }
    Ok(())
}

/// An embedded example written as a simulated sysfs tree in a temporary directory, for
/// the dry runs of bind, unbind and the hook on `--example` hosts; removed on drop.
#[derive(Debug)]
pub struct SimRoot {
    path: PathBuf,
}

impl SimRoot {
    /// The example `name` as a tree ([`write_tree`]).
    pub fn of_example(name: &str) -> anyhow::Result<SimRoot> {
        use anyhow::Context as _;
        let host = vfio_p2p_read::synth::example(name).map_err(anyhow::Error::msg)?;
        let root = SimRoot {
            path: std::env::temp_dir().join(format!(
                "vfio-p2p-example-{name}-{}-{}",
                std::process::id(),
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos())
            )),
        };
        write_tree(&host, &root.path).with_context(|| {
            format!(
                "writing example {name} as a sysfs tree in {}",
                root.path.display()
            )
        })?;
        Ok(root)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for SimRoot {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.path);
    }
}

/// The kernel's reaction to binding writes, on a tree from [`write_tree`].
#[derive(Debug, Clone)]
pub struct SimKernel {
    /// The driver each device gets from `drivers_probe` without an override.
    pub default_driver: BTreeMap<Bdf, String>,
    /// Every write, in order (file relative to the root, value).
    pub log: Vec<(PathBuf, String)>,
    /// The reset methods each device supports (its `reset_method` as first read).
    pub supported_resets: BTreeMap<Bdf, Vec<String>>,
}

/// The errno the kernel answers with, as the real writer would see it.
fn err(errno: i32) -> io::Error {
    io::Error::from_raw_os_error(errno)
}

impl SimKernel {
    /// Default drivers are the ones `host` shows bound.
    pub fn new(host: &HostRecord) -> Self {
        SimKernel {
            default_driver: host
                .devices
                .iter()
                .filter_map(|d| Some((d.bdf, d.driver.clone()?)))
                .collect(),
            log: Vec::new(),
            supported_resets: host
                .devices
                .iter()
                .filter_map(|d| Some((d.bdf, d.reset_method.clone()?)))
                .collect(),
        }
    }

    /// `reset_method` takes `default`, nothing (no reset) or methods the device supports.
    fn set_reset_method(&self, root: &Path, bdf: Bdf, value: &str) -> io::Result<()> {
        let supported = self.supported_resets.get(&bdf).ok_or(err(libc::ENOENT))?;
        let methods: Vec<&str> = match value.trim() {
            "default" => supported.iter().map(String::as_str).collect(),
            v => v.split_whitespace().collect(),
        };
        if methods.iter().any(|m| !supported.iter().any(|s| s == m)) {
            return Err(err(libc::EINVAL));
        }
        let path = root.join(device_dir(bdf)).join("reset_method");
        fs::write(path, format!("{}\n", methods.join(" ")))
    }

    fn group_of(root: &Path, bdf: Bdf) -> Option<String> {
        for g in fs::read_dir(root.join("sys/kernel/iommu_groups"))
            .ok()?
            .flatten()
        {
            if g.path().join("devices").join(bdf.to_string()).exists() {
                return Some(g.file_name().to_string_lossy().into_owned());
            }
        }
        None
    }

    fn attach(root: &Path, bdf: Bdf, driver: &str) -> io::Result<()> {
        if !root.join(driver_dir(driver)).is_dir() {
            return Err(err(libc::ENODEV));
        }
        symlink(
            root.join(driver_dir(driver)),
            root.join(device_dir(bdf)).join("driver"),
        )?;
        if is_vfio_driver(Some(driver)) {
            if let Some(g) = Self::group_of(root, bdf) {
                fs::create_dir_all(root.join("dev/vfio"))?;
                fs::write(root.join("dev/vfio").join(g), "")?;
            }
        }
        Ok(())
    }

    fn detach(root: &Path, bdf: Bdf) -> io::Result<()> {
        let was = read_binding(root, bdf).map_err(io::Error::other)?.driver;
        fs::remove_file(root.join(device_dir(bdf)).join("driver"))?;
        if is_vfio_driver(was.as_deref()) {
            if let Some(g) = Self::group_of(root, bdf) {
                let members =
                    fs::read_dir(root.join(format!("sys/kernel/iommu_groups/{g}/devices")))?;
                let still = members.flatten().any(|m| {
                    m.file_name()
                        .to_str()
                        .and_then(|n| n.parse::<Bdf>().ok())
                        .and_then(|b| read_binding(root, b).ok())
                        .is_some_and(|b| is_vfio_driver(b.driver.as_deref()))
                });
                if !still {
                    fs::remove_file(root.join("dev/vfio").join(g))?;
                }
            }
        }
        Ok(())
    }

    fn probe(&self, root: &Path, bdf: Bdf) -> io::Result<()> {
        let b = read_binding(root, bdf).map_err(io::Error::other)?;
        if b.driver.is_some() {
            return Ok(());
        }
        let wanted = b
            .driver_override
            .or_else(|| self.default_driver.get(&bdf).cloned());
        match wanted {
            Some(d) if root.join(driver_dir(&d)).is_dir() => Self::attach(root, bdf, &d),
            _ => Ok(()),
        }
    }
}

fn parse_bdf(value: &str) -> io::Result<Bdf> {
    value.trim().parse().map_err(|_| err(libc::EINVAL))
}

impl SysfsWriter for SimKernel {
    fn write(&mut self, root: &Path, file: &Path, value: &str) -> io::Result<()> {
        self.log.push((file.to_path_buf(), value.to_string()));
        let parts: Vec<String> = file
            .components()
            .filter_map(|c| match c {
                Component::Normal(s) => Some(s.to_string_lossy().into_owned()),
                _ => None,
            })
            .collect();
        let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
        match parts.as_slice() {
            ["sys", "bus", "pci", "devices", dev, "driver_override"] => {
                let t = value.trim();
                let text = if t.is_empty() { "(null)" } else { t };
                let path = root
                    .join(device_dir(parse_bdf(dev)?))
                    .join("driver_override");
                fs::write(path, format!("{text}\n"))
            }
            ["sys", "bus", "pci", "devices", dev, "driver", "unbind"] => {
                let bdf = parse_bdf(dev)?;
                if parse_bdf(value)? != bdf {
                    return Err(err(libc::ENODEV));
                }
                if read_binding(root, bdf)
                    .map_err(io::Error::other)?
                    .driver
                    .is_none()
                {
                    return Err(err(libc::ENODEV));
                }
                Self::detach(root, bdf)
            }
            ["sys", "bus", "pci", "devices", dev, "reset"] => {
                parse_bdf(dev)?;
                if value.trim() != "1" {
                    return Err(err(libc::EINVAL));
                }
                Ok(())
            }
            ["sys", "bus", "pci", "devices", dev, "reset_method"] => {
                self.set_reset_method(root, parse_bdf(dev)?, value)
            }
            ["sys", "bus", "pci", "drivers_probe"] => self.probe(root, parse_bdf(value)?),
            ["sys", "bus", "pci", "drivers", driver, "bind"] => {
                let bdf = parse_bdf(value)?;
                let b = read_binding(root, bdf).map_err(io::Error::other)?;
                if b.driver.is_some() {
                    return Err(err(libc::EBUSY));
                }
                if b.driver_override.as_deref().is_some_and(|o| o != *driver)
                    || self.default_driver.get(&bdf).map(String::as_str) != Some(*driver)
                        && !is_vfio_driver(Some(driver))
                {
                    return Err(err(libc::ENODEV));
                }
                Self::attach(root, bdf, driver)
            }
            _ => Err(err(libc::EACCES)),
        }
    }
}
