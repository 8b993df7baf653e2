//! What the kernel offers for the iommufd backend: `/dev/iommu`, the VFIO device cdevs
//! under `/dev/vfio/devices`, and the options behind them, from `/boot/config-<release>` or
//! else the running kernel's own `/proc/config.gz`.

use std::fs;
use std::io::{self, Read};
use std::path::Path;

use super::node;
use vfio_p2p_files::{read_attribute_text, read_input_file};
use vfio_p2p_model::host_facts::IommuFacts;
use vfio_p2p_model::host_facts::KernelConfig;
use vfio_p2p_model::host_facts::KernelOption;

/// The most a kernel `.config` holds, plain or compressed (a distribution kernel's: ~300 KiB).
const MAX_KERNEL_CONFIG_BYTES: u64 = 4 << 20;

/// Probes `root` (the sysfs root: `/` on a live host).
pub fn probe(root: &Path) -> IommuFacts {
    let dev_iommu = root.join("dev/iommu");
    let cdev_dir = root.join("dev/vfio/devices");
    // an attribute: bounded and non-blocking like every file the tools read
    let kernel_release =
        read_attribute_text(&root.join("proc/sys/kernel/osrelease"), "kernel release")
            .ok()
            .and_then(|r| Some(r.lines().next()?.trim().to_string()))
            .filter(|r| !r.is_empty() && !r.contains('/'));
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
/// `/proc/config.gz` (CONFIG_IKCONFIG_PROC: kernels built by hand often have only that).
/// Unknown (`None`), never "off", unless one of them is a whole kernel config: readable,
/// within the cap, one gzip member (what the kernel writes) and text with `CONFIG_` lines.
fn read_kernel_config(root: &Path, release: &str) -> Option<KernelConfig> {
    let boot = root.join(format!("boot/config-{release}"));
    if let Ok(bytes) = read_input_file(&boot, MAX_KERNEL_CONFIG_BYTES, "kernel config") {
        if let Some(c) = whole_config(&bytes, &boot) {
            return Some(c);
        }
    }
    let proc = root.join("proc/config.gz");
    let gz = read_input_file(&proc, MAX_KERNEL_CONFIG_BYTES, "kernel config").ok()?;
    let mut decoder = flate2::bufread::GzDecoder::new(gz.as_slice());
    let mut bytes = Vec::new();
    (&mut decoder)
        .take(MAX_KERNEL_CONFIG_BYTES + 1)
        .read_to_end(&mut bytes)
        .ok()?;
    if bytes.len() as u64 > MAX_KERNEL_CONFIG_BYTES || !decoder.into_inner().is_empty() {
        // past the cap, or more after the first member: the option may be there
        return None;
    }
    whole_config(&bytes, &proc)
}

/// `bytes` parsed when they look like a kernel `.config` (text, `CONFIG_` lines), else `None`.
fn whole_config(bytes: &[u8], path: &Path) -> Option<KernelConfig> {
    let text = std::str::from_utf8(bytes).ok()?;
    let configured = text
        .lines()
        .any(|l| l.starts_with("CONFIG_") || l.starts_with("# CONFIG_"));
    (configured && !text.contains('\0'))
        .then(|| parse_kernel_config(text, &path.display().to_string()))
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
        pci_p2pdma: option("CONFIG_PCI_P2PDMA"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vfio_p2p_model::host_facts::NodeProbe;

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
        // 64 MiB of one option line compresses to ~64 KiB: read no further than the cap,
        // and past it the answer is unknown, not "off"
        let line = "CONFIG_IOMMUFD=y\n".repeat(4 << 20);
        fs::write(root.join("proc/config.gz"), gzip(&line)).unwrap();
        assert!(probe(root).kernel_config.is_none(), "past the cap: unknown");
        let config = "CONFIG_VFIO=m\nCONFIG_IOMMUFD=y\n";
        fs::write(root.join("proc/config.gz"), gzip(config)).unwrap();
        assert_eq!(
            probe(root).kernel_config.unwrap().iommufd,
            KernelOption::BuiltIn,
            "one member within the cap: read"
        );
    }

    /// Issue 28: `check` said "built without CONFIG_IOMMUFD" where it could not know:
    /// the option in a second gzip member, after the cap, or a config.gz of zeros; and a
    /// kernel release that is a FIFO, /dev/zero or huge hung or exhausted memory.
    #[test]
    fn a_kernel_config_that_cannot_tell_is_unknown_not_off() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        fs::create_dir_all(root.join("proc/sys/kernel")).unwrap();
        fs::write(root.join("proc/sys/kernel/osrelease"), "7.2.13\n").unwrap();
        let mut two = gzip("CONFIG_VFIO=m\n");
        two.extend(gzip("CONFIG_IOMMUFD=y\n"));
        fs::write(root.join("proc/config.gz"), two).unwrap();
        assert!(
            probe(root).kernel_config.is_none(),
            "a second member: unknown"
        );
        let past = "# filler\n".repeat(500_000) + "CONFIG_IOMMUFD=y\n";
        fs::write(root.join("proc/config.gz"), gzip(&past)).unwrap();
        assert!(
            probe(root).kernel_config.is_none(),
            "after the cap: unknown"
        );
        fs::write(root.join("proc/config.gz"), gzip(&"\0".repeat(1 << 20))).unwrap();
        assert!(probe(root).kernel_config.is_none(), "zeros: unknown");
        fs::write(root.join("proc/config.gz"), gzip("CONFIG_VFIO=m\n")).unwrap();
        let os = root.join("proc/sys/kernel/osrelease");
        for kind in ["fifo", "zero", "huge"] {
            fs::remove_file(&os).unwrap();
            match kind {
                "fifo" => nix::unistd::mkfifo(&os, nix::sys::stat::Mode::from_bits_truncate(0o600))
                    .unwrap(),
                "zero" => std::os::unix::fs::symlink("/dev/zero", &os).unwrap(),
                _ => fs::File::create(&os).unwrap().set_len(1 << 30).unwrap(),
            }
            let f = probe(root);
            assert_eq!(f.kernel_release, None, "{kind}");
            assert!(f.kernel_config.is_none(), "{kind}");
        }
    }
}
