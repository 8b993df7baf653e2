//! A device's current driver binding, and whether the host is using it: what
//! `bind`/`unbind` read before they start and re-read after every device they move.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use pci_config::Bdf;
use serde::{Deserialize, Serialize};

use super::attr;
use super::sysfs::ReadError;
use vfio_p2p_files::{read_attribute_text, InputFileError};

/// The driver a device is bound to and its `driver_override`, as sysfs shows them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Binding {
    pub driver: Option<String>,
    pub driver_override: Option<String>,
}

/// `sys/bus/pci/devices/BDF`, relative to the sysfs root.
pub fn device_dir(bdf: Bdf) -> PathBuf {
    Path::new("sys/bus/pci/devices").join(bdf.to_string())
}

/// `sys/bus/pci/drivers/NAME`, relative to the sysfs root.
pub fn driver_dir(name: &str) -> PathBuf {
    Path::new("sys/bus/pci/drivers").join(name)
}

/// The device's binding right now.
pub fn read_binding(root: &Path, bdf: Bdf) -> Result<Binding, ReadError> {
    let dir = root.join(device_dir(bdf));
    if !dir.exists() {
        return Err(ReadError::Io {
            path: dir,
            source: io::Error::new(io::ErrorKind::NotFound, "no such PCI device"),
        });
    }
    let driver = match fs::read_link(dir.join("driver")) {
        // a link that names no driver (one to itself): refuse to guess what is bound
        Ok(t) => Some(attr::driver_link(&t).map_err(|why| ReadError::Io {
            path: dir.join("driver"),
            source: io::Error::new(io::ErrorKind::InvalidData, why),
        })?),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => {
            return Err(ReadError::Io {
                path: dir.join("driver"),
                source: e,
            })
        }
    };
    let override_path = dir.join("driver_override");
    let driver_override = match read_attribute_text(&override_path, "sysfs attribute") {
        Ok(t) => attr::driver_override(&t),
        Err(InputFileError::Read { err, .. }) if err.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(e.into()),
    };
    Ok(Binding {
        driver,
        driver_override,
    })
}

/// The device's `reset_method` right now: the methods the kernel will use, in order.
pub fn read_reset_method(root: &Path, bdf: Bdf) -> Result<Vec<String>, ReadError> {
    let path = root.join(device_dir(bdf)).join("reset_method");
    Ok(attr::reset_method(&read_attribute_text(
        &path,
        "sysfs attribute",
    )?))
}

/// Whether the PCI driver `name` is registered (its module loaded).
pub fn driver_registered(root: &Path, name: &str) -> bool {
    root.join(driver_dir(name)).is_dir()
}

/// A process holding one of the device's files open.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HostUser {
    pub pid: u32,
    pub command: String,
    pub file: String,
}

/// How the host is using a GPU: processes with its nvidia device file open, a display on it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct DeviceUse {
    pub processes: Vec<HostUser>,
    pub display: Option<String>,
}

impl DeviceUse {
    pub fn in_use(&self) -> bool {
        !self.processes.is_empty() || self.display.is_some()
    }
}

/// Reads how the host uses each of `gpus`: processes holding its `/dev/nvidiaN` open (N
/// from `proc/driver/nvidia/gpus/BDF/information`; any `/dev/nvidiaN` when that is
/// unknown), and an attached display (`boot_vga`, a connected DRM connector).
/// `proc` is scanned once for all of them.
pub fn devices_use(root: &Path, gpus: &[Bdf]) -> BTreeMap<Bdf, DeviceUse> {
    let holders = processes_holding(root, |file| {
        file.strip_prefix("/dev/nvidia")
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    });
    gpus.iter()
        .map(|bdf| {
            let minor = read_attribute_text(
                &root
                    .join("proc/driver/nvidia/gpus")
                    .join(bdf.to_string())
                    .join("information"),
                "nvidia GPU information",
            )
            .ok()
            .and_then(|t| nvidia_minor(&t));
            let processes = holders
                .iter()
                .filter(|u| minor.is_none_or(|m| u.file == format!("/dev/nvidia{m}")))
                .cloned()
                .collect();
            (
                *bdf,
                DeviceUse {
                    processes,
                    display: display_attached(root, *bdf),
                },
            )
        })
        .collect()
}

/// `Device Minor:      0` in the nvidia driver's per-GPU information file.
fn nvidia_minor(information: &str) -> Option<u32> {
    information.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k.trim() == "Device Minor").then(|| v.trim().parse().ok())?
    })
}

/// Each (process, open file) whose target satisfies `wanted` (scans `proc/PID/fd`;
/// processes it may not inspect are skipped).
fn processes_holding(root: &Path, wanted: impl Fn(&str) -> bool) -> Vec<HostUser> {
    let mut out = Vec::new();
    let Ok(procs) = fs::read_dir(root.join("proc")) else {
        return out;
    };
    for p in procs.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(fds) = fs::read_dir(p.path().join("fd")) else {
            continue;
        };
        let mut files: Vec<String> = fds
            .flatten()
            .filter_map(|fd| {
                let target = fs::read_link(fd.path()).ok()?;
                let target = target.to_string_lossy().into_owned();
                wanted(&target).then_some(target)
            })
            .collect();
        files.sort();
        files.dedup();
        if files.is_empty() {
            continue;
        }
        let command = read_attribute_text(&p.path().join("comm"), "process name")
            .map(|c| c.trim().to_string())
            .unwrap_or_else(|_| "?".into());
        for file in files {
            out.push(HostUser {
                pid,
                command: command.clone(),
                file,
            });
        }
    }
    out.sort_by_key(|u| u.pid);
    out
}

/// Why the device drives a display, if it does.
fn display_attached(root: &Path, bdf: Bdf) -> Option<String> {
    let dir = root.join(device_dir(bdf));
    if read_attribute_text(&dir.join("boot_vga"), "sysfs attribute").is_ok_and(|t| t.trim() == "1")
    {
        return Some("it is the boot VGA device (boot_vga = 1): the console is on it".into());
    }
    let cards = fs::read_dir(dir.join("drm")).ok()?;
    for card in cards.flatten() {
        let Ok(connectors) = fs::read_dir(card.path()) else {
            continue;
        };
        for c in connectors.flatten() {
            if read_attribute_text(&c.path().join("status"), "sysfs attribute")
                .is_ok_and(|s| s.trim() == "connected")
            {
                return Some(format!(
                    "DRM connector {} is connected",
                    c.file_name().to_string_lossy()
                ));
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_nvidia_minor() {
        let info = "Model: \t\t NVIDIA H100\nIRQ:   \t\t 123\nDevice Minor: \t 3\nBus Location: \t 0000:41:00.0\n";
        assert_eq!(nvidia_minor(info), Some(3));
        assert_eq!(nvidia_minor("Model: x\n"), None);
    }
}
