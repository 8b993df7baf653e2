//! Test support: a host's sysfs as a directory tree, and a [`SysfsWriter`] that plays
//! the kernel's part in it — `driver/unbind` removes the `driver` link, `drivers_probe`
//! binds the driver `driver_override` names (or the host's default), `drivers/NAME/bind`
//! refuses a device whose override names another driver — and keeps `dev/vfio/N`.
//! Lets the decision and rollback logic be tested without root or a kernel.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::os::unix::fs::symlink;
use std::path::{Component, Path, PathBuf};

use pci_config::Bdf;

use super::apply::SysfsWriter;
use super::plan::VFIO_PCI;
use crate::read::binding::{device_dir, driver_dir, read_binding};
use crate::read::HostRecord;

/// Writes `host` as a sysfs tree below `root`: device directories under `sys/devices`
/// (identity, config space, NUMA node, `driver_override`), NUMA nodes,
/// `sys/bus/pci/devices` links, `driver` links, driver directories (vfio-pci among
/// them), IOMMU groups and `drivers_probe`.
pub fn write_tree(host: &HostRecord, root: &Path) -> io::Result<()> {
    let drivers = root.join("sys/bus/pci/drivers");
    fs::create_dir_all(root.join("sys/bus/pci/devices"))?;
    fs::write(root.join("sys/bus/pci/drivers_probe"), "")?;
    let mut names: Vec<&str> = host
        .devices
        .iter()
        .filter_map(|d| d.driver.as_deref())
        .collect();
    names.push(VFIO_PCI);
    for n in names {
        fs::create_dir_all(drivers.join(n))?;
        fs::write(drivers.join(n).join("bind"), "")?;
        fs::write(drivers.join(n).join("unbind"), "")?;
    }
    for (id, cpus) in &host.numa_nodes {
        let node = root.join(format!("sys/devices/system/node/node{id}"));
        fs::create_dir_all(&node)?;
        fs::write(node.join("cpulist"), format!("{cpus}\n"))?;
    }
    for d in &host.devices {
        let mut rel = PathBuf::from(d.host_bridge.to_string());
        for a in &d.ancestors {
            rel.push(a.to_string());
        }
        rel.push(d.bdf.to_string());
        let dir = root.join("sys/devices").join(&rel);
        fs::create_dir_all(&dir)?;
        fs::write(dir.join("vendor"), format!("{:#06x}\n", d.vendor))?;
        fs::write(dir.join("device"), format!("{:#06x}\n", d.device))?;
        fs::write(dir.join("class"), format!("{:#08x}\n", d.class))?;
        fs::write(dir.join("config"), &d.config)?;
        let numa = d.numa_node.map_or("-1".to_string(), |n| n.to_string());
        fs::write(dir.join("numa_node"), numa + "\n")?;
        fs::write(
            dir.join("driver_override"),
            d.driver_override.as_deref().unwrap_or("(null)").to_string() + "\n",
        )?;
        if let Some(n) = &d.driver {
            symlink(drivers.join(n), dir.join("driver"))?;
        }
        symlink(
            Path::new("../../../devices").join(&rel),
            root.join(device_dir(d.bdf)),
        )?;
        if let Some(g) = d.iommu_group {
            let gdir = root.join(format!("sys/kernel/iommu_groups/{g}/devices"));
            fs::create_dir_all(&gdir)?;
            symlink(&dir, gdir.join(d.bdf.to_string()))?;
        }
    }
    Ok(())
}

/// The kernel's reaction to binding writes, on a tree from [`write_tree`].
#[derive(Debug, Clone)]
pub struct SimKernel {
    /// The driver each device gets from `drivers_probe` without an override.
    pub default_driver: BTreeMap<Bdf, String>,
    /// Every write, in order (file relative to the root, value).
    pub log: Vec<(PathBuf, String)>,
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
        }
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
        if driver == VFIO_PCI {
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
        if was.as_deref() == Some(VFIO_PCI) {
            if let Some(g) = Self::group_of(root, bdf) {
                let members =
                    fs::read_dir(root.join(format!("sys/kernel/iommu_groups/{g}/devices")))?;
                let still = members.flatten().any(|m| {
                    m.file_name()
                        .to_str()
                        .and_then(|n| n.parse::<Bdf>().ok())
                        .and_then(|b| read_binding(root, b).ok())
                        .is_some_and(|b| b.driver.as_deref() == Some(VFIO_PCI))
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
            ["sys", "bus", "pci", "drivers_probe"] => self.probe(root, parse_bdf(value)?),
            ["sys", "bus", "pci", "drivers", driver, "bind"] => {
                let bdf = parse_bdf(value)?;
                let b = read_binding(root, bdf).map_err(io::Error::other)?;
                if b.driver.is_some() {
                    return Err(err(libc::EBUSY));
                }
                if b.driver_override.as_deref().is_some_and(|o| o != *driver)
                    || self.default_driver.get(&bdf).map(String::as_str) != Some(*driver)
                        && *driver != VFIO_PCI
                {
                    return Err(err(libc::ENODEV));
                }
                Self::attach(root, bdf, driver)
            }
            _ => Err(err(libc::EACCES)),
        }
    }
}
