//! What the kernel offers for the iommufd backend: `/dev/iommu`, the VFIO device cdevs
//! under `/dev/vfio/devices`, and the options behind them, from `/boot/config-<release>` or
//! else the running kernel's own `/proc/config.gz`.

use std::fs;
use std::io::{self, Read};
use std::path::Path;

use super::node;
use crate::decide::check::{IommuFacts, KernelConfig, KernelOption};
use crate::read::input_file::read_input_file;

/// The most a kernel `.config` holds, plain or compressed (a distribution kernel's: ~300 KiB).
const MAX_KERNEL_CONFIG_BYTES: u64 = 4 << 20;

/// Probes `root` (the sysfs root: `/` on a live host).
pub fn probe(root: &Path) -> IommuFacts {
    let dev_iommu = root.join("dev/iommu");
    let cdev_dir = root.join("dev/vfio/devices");
    let kernel_release = fs::read_to_string(root.join("proc/sys/kernel/osrelease"))
        .ok()
        .map(|r| r.trim().to_string())
        .filter(|r| !r.is_empty());
    let kernel_config = kernel_release
        .as_deref()
        .and_then(|r| read_kernel_config(root, r));
    IommuFacts {
        dev_iommu: node(&dev_iommu, fs::metadata(&dev_iommu).map(|_| ())),
        vfio_cdevs: node(&cdev_dir, list_cdevs(&cdev_dir)),
        kernel_release,
        kernel_config,
    }
}

/// The running kernel's options: `/boot/config-<release>` (distribution kernels), else
/// `/proc/config.gz` (CONFIG_IKCONFIG_PROC: kernels built by hand often have only that);
/// neither readable, or not gzip: unknown.
fn read_kernel_config(root: &Path, release: &str) -> Option<KernelConfig> {
    let boot = root.join(format!("boot/config-{release}"));
    if let Ok(bytes) = read_input_file(&boot, MAX_KERNEL_CONFIG_BYTES, "kernel config") {
        let text = String::from_utf8_lossy(&bytes);
        return Some(parse_kernel_config(&text, &boot.display().to_string()));
    }
    let proc = root.join("proc/config.gz");
    let gz = read_input_file(&proc, MAX_KERNEL_CONFIG_BYTES, "kernel config").ok()?;
    let mut bytes = Vec::new();
    flate2::read::GzDecoder::new(gz.as_slice())
        .take(MAX_KERNEL_CONFIG_BYTES)
        .read_to_end(&mut bytes)
        .ok()?;
    let text = String::from_utf8_lossy(&bytes);
    Some(parse_kernel_config(&text, &proc.display().to_string()))
}

fn list_cdevs(dir: &Path) -> io::Result<Vec<String>> {
    let mut names: Vec<String> = fs::read_dir(dir)?
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("vfio"))
        .collect();
    names.sort();
    Ok(names)
}

/// The three options the iommufd backend depends on, from a kernel `.config`.
pub fn parse_kernel_config(text: &str, path: &str) -> KernelConfig {
    let option = |name: &str| {
        let prefix = format!("{name}=");
        match text
            .lines()
            .find_map(|l| l.trim().strip_prefix(prefix.as_str()))
        {
            Some("y") => KernelOption::BuiltIn,
            Some("m") => KernelOption::Module,
            _ => KernelOption::Off,
        }
    };
    KernelConfig {
        path: path.to_string(),
        iommufd: option("CONFIG_IOMMUFD"),
        vfio_device_cdev: option("CONFIG_VFIO_DEVICE_CDEV"),
        vfio_pci_dmabuf: option("CONFIG_VFIO_PCI_DMABUF"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::check::NodeProbe;

    #[test]
    fn debian_kernel_without_iommufd_and_one_with_it() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        fs::create_dir_all(root.join("proc/sys/kernel")).unwrap();
        fs::create_dir_all(root.join("boot")).unwrap();
        fs::write(
            root.join("proc/sys/kernel/osrelease"),
            "6.12.57+deb13-amd64\n",
        )
        .unwrap();
        fs::write(
            root.join("boot/config-6.12.57+deb13-amd64"),
            "CONFIG_VFIO=m\n# CONFIG_IOMMUFD is not set\nCONFIG_VFIO_PCI=m\n",
        )
        .unwrap();
        let f = probe(root);
        assert!(matches!(f.dev_iommu, NodeProbe::Absent(ref p) if p.ends_with("dev/iommu")));
        assert!(matches!(f.vfio_cdevs, NodeProbe::Absent(_)));
        assert_eq!(f.kernel_release.as_deref(), Some("6.12.57+deb13-amd64"));
        let c = f.kernel_config.unwrap();
        assert_eq!(c.iommufd, KernelOption::Off);
        assert_eq!(c.vfio_device_cdev, KernelOption::Off);

        fs::create_dir_all(root.join("dev/vfio/devices")).unwrap();
        fs::write(root.join("dev/iommu"), "").unwrap();
        fs::write(root.join("dev/vfio/devices/vfio1"), "").unwrap();
        fs::write(root.join("dev/vfio/devices/vfio0"), "").unwrap();
        fs::write(
            root.join("boot/config-6.12.57+deb13-amd64"),
            "CONFIG_IOMMUFD=m\nCONFIG_VFIO_DEVICE_CDEV=y\nCONFIG_VFIO_PCI_DMABUF=y\n",
        )
        .unwrap();
        let f = probe(root);
        assert_eq!(f.dev_iommu, NodeProbe::Ok(()));
        assert_eq!(
            f.vfio_cdevs,
            NodeProbe::Ok(vec!["vfio0".into(), "vfio1".into()])
        );
        let c = f.kernel_config.unwrap();
        assert_eq!(
            (c.iommufd, c.vfio_device_cdev, c.vfio_pci_dmabuf),
            (
                KernelOption::Module,
                KernelOption::BuiltIn,
                KernelOption::BuiltIn
            )
        );
    }

    fn gzip(text: &str) -> Vec<u8> {
        use std::io::Write;
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(text.as_bytes()).unwrap();
        e.finish().unwrap()
    }

    #[test]
    fn a_kernel_without_boot_config_is_read_from_proc_config_gz() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        fs::create_dir_all(root.join("proc/sys/kernel")).unwrap();
        fs::write(
            root.join("proc/sys/kernel/osrelease"),
            "7.2.13-lab-iommufd\n",
        )
        .unwrap();
        assert!(probe(root).kernel_config.is_none(), "neither file: unknown");
        fs::write(
            root.join("proc/config.gz"),
            gzip("CONFIG_IOMMUFD=y\nCONFIG_VFIO_DEVICE_CDEV=y\nCONFIG_VFIO_PCI_DMABUF=y\n"),
        )
        .unwrap();
        let c = probe(root).kernel_config.unwrap();
        assert!(c.path.ends_with("proc/config.gz"), "{}", c.path);
        assert_eq!(
            (c.iommufd, c.vfio_device_cdev, c.vfio_pci_dmabuf),
            (
                KernelOption::BuiltIn,
                KernelOption::BuiltIn,
                KernelOption::BuiltIn
            )
        );
        // /boot's file, when there is one, is the one read
        fs::create_dir_all(root.join("boot")).unwrap();
        fs::write(
            root.join("boot/config-7.2.13-lab-iommufd"),
            "# CONFIG_IOMMUFD is not set\n",
        )
        .unwrap();
        assert_eq!(
            probe(root).kernel_config.unwrap().iommufd,
            KernelOption::Off
        );
    }

    #[test]
    fn a_proc_config_gz_that_is_not_gzip_or_a_bomb_stays_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        fs::create_dir_all(root.join("proc/sys/kernel")).unwrap();
        fs::write(root.join("proc/sys/kernel/osrelease"), "7.2.13\n").unwrap();
        fs::write(root.join("proc/config.gz"), b"CONFIG_IOMMUFD=y\n").unwrap();
        assert!(probe(root).kernel_config.is_none(), "not gzip: unknown");
        // 64 MiB of one option line compresses to ~64 KiB: read no further than the cap
        let line = "CONFIG_IOMMUFD=y\n".repeat(4 << 20);
        fs::write(root.join("proc/config.gz"), gzip(&line)).unwrap();
        let c = probe(root).kernel_config.unwrap();
        assert_eq!(c.iommufd, KernelOption::BuiltIn);
    }
}
