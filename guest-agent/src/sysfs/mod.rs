//! The guest's sysfs, read once below one root (`--sysfs-root`: `/`, a copy of a VM's
//! sysfs, or a flat sysfs JSON dump) into a [`GuestSysfs`] the commands take: the one
//! module of the agent that reads sysfs. Its readers: the NVIDIA GPUs and network
//! functions under `sys/bus/pci/devices` (`gpus`), where each GPU sits in the PCIe tree
//! (`place`), the NUMA nodes under `sys/devices/system/node` (`numa`), and the host's
//! expectation in QEMU's fw_cfg (`expectation`).

pub mod expectation;
pub mod gpus;
pub mod numa;
pub mod place;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use pci_config::Bdf;

use gpus::{NetFunction, Scan, ScanError};
use numa::NumaScan;
use place::Places;

/// What the agent reads of the guest's sysfs, read once, before anything is judged.
#[derive(Debug)]
pub struct GuestSysfs {
    /// The root it was read below.
    pub root: PathBuf,
    /// The NVIDIA GPUs (or why `sys/bus/pci/devices` could not be listed).
    pub gpus: Result<Scan, ScanError>,
    /// Where the scan's GPUs and the expected ones sit in the PCIe tree.
    pub places: Places,
    /// The NUMA nodes.
    pub numa: NumaScan,
    /// Every network function, by address (none when the devices cannot be listed).
    pub nics: BTreeMap<Bdf, NetFunction>,
}

impl GuestSysfs {
    /// Reads everything below `root`; `expected` are the guest addresses the host's
    /// expectation places GPUs at (their places are read too).
    pub fn read(root: &Path, expected: &[Bdf]) -> GuestSysfs {
        let gpus = gpus::scan(root);
        let scanned = gpus.iter().flat_map(|s| s.gpus.iter().map(|g| g.bdf));
        let places = Places::read(root, scanned.chain(expected.iter().copied()));
        GuestSysfs {
            root: root.to_path_buf(),
            places,
            numa: numa::scan(root),
            nics: gpus::network_functions(root),
            gpus,
        }
    }
}

/// The most read of any sysfs file here: config space is 4096 bytes, an attribute a page.
const MAX_SYSFS_FILE: u64 = 4096;

/// A sysfs file, read as the kernel serves them: a regular file, opened without blocking
/// (a FIFO planted there cannot hang the agent), at most [`MAX_SYSFS_FILE`] bytes (a huge
/// or sparse file is cut there, which is all config space can hold).
pub(crate) fn read_sysfs_file(path: &Path) -> std::io::Result<Vec<u8>> {
    read_regular_file(path, MAX_SYSFS_FILE)
}

/// At most `limit` bytes of the regular file `path`, opened without blocking: a FIFO is
/// an error ("not a regular file"), never a hang.
pub fn read_regular_file(path: &Path, limit: u64) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    if !file.metadata()?.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    let mut bytes = Vec::new();
    file.take(limit).read_to_end(&mut bytes)?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::symlink;

    /// `root/sys/devices/pci0000:00/BDF` with `config` (vendor, device, class) and its
    /// `sys/bus/pci/devices/BDF` link, as the kernel lays them out.
    fn device(root: &Path, bdf: &str, id: [u8; 4], class: [u8; 3]) -> PathBuf {
        let dir = root.join("sys/devices/pci0000:00").join(bdf);
        fs::create_dir_all(&dir).unwrap();
        let mut config = vec![0u8; 64];
        config[0..4].copy_from_slice(&id);
        config[0x09..0x0c].copy_from_slice(&class);
        fs::write(dir.join("config"), config).unwrap();
        fs::write(dir.join("numa_node"), "0\n").unwrap();
        let links = root.join("sys/bus/pci/devices");
        fs::create_dir_all(&links).unwrap();
        symlink(
            format!("../../../devices/pci0000:00/{bdf}"),
            links.join(bdf),
        )
        .unwrap();
        dir
    }

    #[test]
    fn everything_is_read_below_the_root_it_is_given() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path();
        device(
            root,
            "0000:00:06.0",
            [0xde, 0x10, 0x35, 0x23],
            [0x00, 0x02, 0x03],
        );
        let nic = device(
            root,
            "0000:00:08.0",
            [0xb3, 0x15, 0x1d, 0x10],
            [0x00, 0x00, 0x02],
        );
        fs::write(nic.join("class"), "0x020000\n").unwrap();
        fs::create_dir_all(nic.join("net/eth1")).unwrap();
        let node = root.join("sys/devices/system/node/node0");
        fs::create_dir_all(&node).unwrap();
        fs::write(node.join("cpulist"), "0-3\n").unwrap();
        let gpu: Bdf = "0000:00:06.0".parse().unwrap();
        let absent: Bdf = "0000:00:07.0".parse().unwrap();

        let guest = GuestSysfs::read(root, &[absent]);

        assert_eq!(guest.root, root);
        let scan = guest.gpus.as_ref().unwrap();
        assert_eq!(scan.gpus.len(), 1, "{scan:?}");
        assert_eq!(scan.gpus[0].bdf, gpu);
        let place = guest.places.get(gpu).unwrap();
        assert_eq!((place.root.domain, place.root.bus), (0, 0));
        // an expected GPU that is not there was looked for, not skipped
        let missing = guest.places.get(absent).unwrap_err();
        assert!(
            matches!(missing, place::TopoError::Resolve { .. }),
            "{missing}"
        );
        assert_eq!(guest.numa.nodes.len(), 1);
        assert_eq!(guest.numa.nodes[0].cpulist, "0-3");
        let nic: Bdf = "0000:00:08.0".parse().unwrap();
        assert_eq!(guest.nics[&nic].net, ["eth1"]);
    }
}
