//! Which IOMMU backend a VM gets, and whether P2P between its GPUs survives it.
//!
//! With the legacy VFIO type1 container QEMU maps each peer's BARs into the IOMMU with
//! `VFIO_IOMMU_MAP_DMA`, which takes PFNMAP memory. With iommufd, `IOMMU_IOAS_MAP` pins
//! pages and cannot pin a BAR's PFNMAP: QEMU warns and goes on, the guest still sees the
//! cliques, and peer writes fault in the IOMMU. The way through is to export each BAR as a
//! dma-buf (`VFIO_DEVICE_FEATURE_DMA_BUF`, Linux >= 6.19 with `CONFIG_VFIO_PCI_DMABUF`) and
//! map that with `IOMMU_IOAS_MAP_FILE` (QEMU >= 11.0); see
//! [`KernelVersion::BAR_DMABUF`] and [`QemuVersion::BAR_DMABUF`] for the sources.

use vfio_p2p_model::host_facts::IommuFacts;
use vfio_p2p_model::host_facts::KernelOption;
use vfio_p2p_model::host_facts::NodeProbe;
use vfio_p2p_model::vmm::{KernelVersion, QemuVersion};

use vfio_p2p_config::vm::IommuBackend;

/// Whether the host offers the iommufd backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Offered {
    /// Yes: what showed it.
    Yes(String),
    /// No: why, and the fix.
    No { why: String, fix: String },
    /// Not probed (an example, a snapshot).
    Unknown(String),
}

/// Whether peer BARs can be mapped into an iommufd IOAS (kernel and QEMU together).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BarMapping {
    Works(String),
    Fails(String),
    Unknown(String),
}

/// The fix for a kernel without iommufd.
pub const NO_IOMMUFD_FIX: &str = "use the legacy backend (--iommu-backend legacy, `iommu_backend: legacy`), \
     or boot a kernel built with CONFIG_IOMMUFD and CONFIG_VFIO_DEVICE_CDEV (Debian's kernels have neither; RHEL 9/10 and Ubuntu's do)";

/// What the host offers: `/dev/iommu` and the VFIO cdevs, explained from the kernel config
/// when they are missing.
pub fn iommufd_offered(f: &IommuFacts) -> Offered {
    let release = f.kernel_release.as_deref().unwrap_or("this kernel");
    let config = f.kernel_config.as_ref();
    match (&f.dev_iommu, &f.vfio_cdevs) {
        (NodeProbe::Unknown(why), _) => Offered::Unknown(why.clone()),
        (NodeProbe::Ok(()), NodeProbe::Ok(cdevs)) if !cdevs.is_empty() => Offered::Yes(format!(
            "/dev/iommu and {} VFIO device cdev(s) in /dev/vfio/devices",
            cdevs.len()
        )),
        (NodeProbe::Ok(()), cdevs) => {
            let cdev_off = config.is_some_and(|c| c.vfio_device_cdev == KernelOption::Off);
            if cdev_off {
                Offered::No {
                    why: format!(
                        "/dev/iommu exists but {release} is built without CONFIG_VFIO_DEVICE_CDEV ({}): no /dev/vfio/devices",
                        config.map_or("", |c| c.path.as_str())
                    ),
                    fix: NO_IOMMUFD_FIX.into(),
                }
            } else {
                let seen = match cdevs {
                    NodeProbe::Ok(_) => "no VFIO device cdev yet".to_string(),
                    other => format!("{} ", probe_words(other)),
                };
                Offered::Yes(format!(
                    "/dev/iommu; {seen}(each device gets /dev/vfio/devices/vfioN once bound to vfio-pci)"
                ))
            }
        }
        (absent, _) => {
            let saw = probe_words(absent);
            match config.map(|c| (c.iommufd, c.path.as_str())) {
                Some((KernelOption::Module, path)) => Offered::No {
                    why: format!("{saw}; {path} has CONFIG_IOMMUFD=m but the module is not loaded"),
                    fix: "`modprobe iommufd` (and add it to /etc/modules-load.d), or use --iommu-backend legacy".into(),
                },
                Some((KernelOption::Off, path)) => Offered::No {
                    why: format!("{saw}: {release} is built without CONFIG_IOMMUFD ({path})"),
                    fix: NO_IOMMUFD_FIX.into(),
                },
                Some((KernelOption::BuiltIn, _)) => Offered::No {
                    why: format!("{saw}: {release} offers no iommufd"),
                    fix: NO_IOMMUFD_FIX.into(),
                },
                None => Offered::No {
                    why: format!(
                        "{saw}: {release} offers no iommufd; whether it is built with CONFIG_IOMMUFD \
                         could not tell (no complete kernel config in /boot/config-<release> or /proc/config.gz)"
                    ),
                    fix: NO_IOMMUFD_FIX.into(),
                },
            }
        }
    }
}

fn probe_words<T>(p: &NodeProbe<T>) -> String {
    match p {
        NodeProbe::Ok(_) => "present".into(),
        NodeProbe::Absent(path) => format!("{path} does not exist"),
        NodeProbe::Error(e) => e.clone(),
        NodeProbe::Unknown(why) => format!("not probed: {why}"),
    }
}

/// Whether this kernel and `qemu` can map peer BARs through iommufd.
pub fn bar_mapping(f: &IommuFacts, qemu: Option<&Result<QemuVersion, String>>) -> BarMapping {
    let need = KernelVersion::BAR_DMABUF;
    let q_need = QemuVersion::BAR_DMABUF;
    let mut fails = Vec::new();
    let mut unknown = Vec::new();
    let mut works = Vec::new();
    match f
        .kernel_release
        .as_deref()
        .map(|r| (r, KernelVersion::parse(r)))
    {
        Some((r, Some(v))) if v < need => fails.push(format!(
            "Linux {r} has no VFIO_DEVICE_FEATURE_DMA_BUF (needs {need})"
        )),
        Some((r, Some(_))) => match f.kernel_config.as_ref() {
            Some(c) if c.vfio_pci_dmabuf == KernelOption::Off => fails.push(format!(
                "Linux {r}: CONFIG_VFIO_PCI_DMABUF is not set in {}",
                c.path
            )),
            Some(_) => works.push(format!("Linux {r} with CONFIG_VFIO_PCI_DMABUF")),
            None => works.push(format!("Linux {r} (>= {need})")),
        },
        Some((r, None)) => unknown.push(format!("kernel release '{r}' has no version number")),
        None => unknown.push("the kernel release is not known here".into()),
    }
    match qemu {
        Some(Ok(v)) if *v < q_need => fails.push(format!(
            "QEMU {v} maps BARs with IOMMU_IOAS_MAP, which cannot pin them (dma-buf BAR mapping needs QEMU {q_need})"
        )),
        Some(Ok(v)) => works.push(format!("QEMU {v} maps BARs as dma-bufs")),
        Some(Err(e)) => unknown.push(e.clone()),
        None => unknown.push("the QEMU version is not known (pass --qemu PATH)".into()),
    }
    if !fails.is_empty() {
        BarMapping::Fails(fails.join("; "))
    } else if !unknown.is_empty() {
        BarMapping::Unknown(unknown.join("; "))
    } else {
        BarMapping::Works(works.join(", "))
    }
}

/// The backend a VM gets: `auto` becomes iommufd only where the host offers it and, when
/// the VM has P2P cliques, peer BARs can be mapped through it. The string says why.
pub fn resolve(
    requested: IommuBackend,
    offered: &Offered,
    bars: &BarMapping,
    has_cliques: bool,
) -> (IommuBackend, String) {
    match requested {
        IommuBackend::Legacy | IommuBackend::Iommufd => (requested, "as requested".into()),
        IommuBackend::Auto => match (offered, bars) {
            (Offered::Yes(_), _) if !has_cliques => (
                IommuBackend::Iommufd,
                "the host offers iommufd and the VM has no P2P cliques".into(),
            ),
            (Offered::Yes(_), BarMapping::Works(w)) => (
                IommuBackend::Iommufd,
                format!("the host offers iommufd and {w}"),
            ),
            (Offered::Yes(_), BarMapping::Fails(why) | BarMapping::Unknown(why)) => (
                IommuBackend::Legacy,
                format!("P2P cliques need peer BARs in the IOMMU: {why}"),
            ),
            (Offered::No { why, .. } | Offered::Unknown(why), _) => {
                (IommuBackend::Legacy, format!("no iommufd: {why}"))
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vfio_p2p_model::host_facts::KernelConfig;

    fn facts(
        release: &str,
        iommu: bool,
        cdevs: &[&str],
        cfg: Option<(KernelOption, KernelOption, KernelOption)>,
    ) -> IommuFacts {
        IommuFacts {
            dev_iommu: if iommu {
                NodeProbe::Ok(())
            } else {
                NodeProbe::Absent("/dev/iommu".into())
            },
            vfio_cdevs: if cdevs.is_empty() {
                NodeProbe::Absent("/dev/vfio/devices".into())
            } else {
                NodeProbe::Ok(cdevs.iter().map(|s| s.to_string()).collect())
            },
            kernel_release: Some(release.into()),
            kernel_config: cfg.map(|(a, b, c)| KernelConfig {
                path: format!("/boot/config-{release}"),
                iommufd: a,
                vfio_device_cdev: b,
                vfio_pci_dmabuf: c,
                pci_p2pdma: c,
            }),
        }
    }

    use KernelOption::{BuiltIn as Y, Module as M, Off as N};

    fn qemu(s: &str) -> Option<Result<QemuVersion, String>> {
        Some(Ok(vfio_p2p_read::vmm::parse_qemu_version(&format!(
            "QEMU emulator version {s}"
        ))
        .unwrap()))
    }

    #[test]
    fn debian_kernels_offer_no_iommufd_and_say_why() {
        let f = facts("6.12.57+deb13-amd64", false, &[], Some((N, N, N)));
        let Offered::No { why, fix } = iommufd_offered(&f) else {
            panic!()
        };
        assert!(why.contains("built without CONFIG_IOMMUFD"), "{why}");
        assert!(fix.contains("--iommu-backend legacy"), "{fix}");
        let f = facts("7.2.13+deb14-amd64", false, &[], Some((M, Y, Y)));
        let Offered::No { fix, .. } = iommufd_offered(&f) else {
            panic!()
        };
        assert!(fix.contains("modprobe iommufd"), "{fix}");
        let f = facts("7.2.0-lab", true, &["vfio0"], Some((Y, Y, Y)));
        assert!(matches!(iommufd_offered(&f), Offered::Yes(_)));
        let f = facts("7.2.0-lab", true, &[], Some((Y, N, Y)));
        assert!(
            matches!(iommufd_offered(&f), Offered::No { why, .. } if why.contains("CONFIG_VFIO_DEVICE_CDEV"))
        );
    }

    #[test]
    fn bar_mapping_needs_linux_6_19_and_qemu_11() {
        let new = facts("7.2.0-lab", true, &["vfio0"], Some((Y, Y, Y)));
        assert!(matches!(
            bar_mapping(&new, qemu("11.1.3").as_ref()),
            BarMapping::Works(_)
        ));
        let BarMapping::Fails(why) = bar_mapping(&new, qemu("10.0.3").as_ref()) else {
            panic!()
        };
        assert!(
            why.contains("QEMU 10.0.3") && why.contains("11.0.0"),
            "{why}"
        );
        let old = facts("6.12.57+deb13-amd64", true, &["vfio0"], Some((Y, Y, N)));
        let BarMapping::Fails(why) = bar_mapping(&old, qemu("11.1.3").as_ref()) else {
            panic!()
        };
        assert!(why.contains("6.19"), "{why}");
        let no_dmabuf = facts("7.2.0-lab", true, &["vfio0"], Some((Y, Y, N)));
        assert!(
            matches!(bar_mapping(&no_dmabuf, qemu("11.1.3").as_ref()), BarMapping::Fails(w) if w.contains("CONFIG_VFIO_PCI_DMABUF"))
        );
        assert!(matches!(bar_mapping(&new, None), BarMapping::Unknown(w) if w.contains("--qemu")));
    }

    #[test]
    fn auto_takes_iommufd_only_where_p2p_survives_it() {
        let new = facts("7.2.0-lab", true, &["vfio0"], Some((Y, Y, Y)));
        let off = iommufd_offered(&new);
        let ok = bar_mapping(&new, qemu("11.1.3").as_ref());
        let bad = bar_mapping(&new, qemu("10.0.3").as_ref());
        assert_eq!(
            resolve(IommuBackend::Auto, &off, &ok, true).0,
            IommuBackend::Iommufd
        );
        assert_eq!(
            resolve(IommuBackend::Auto, &off, &bad, true).0,
            IommuBackend::Legacy
        );
        assert_eq!(
            resolve(IommuBackend::Auto, &off, &bad, false).0,
            IommuBackend::Iommufd
        );
        let debian = iommufd_offered(&facts("6.12.57+deb13-amd64", false, &[], Some((N, N, N))));
        assert_eq!(
            resolve(IommuBackend::Auto, &debian, &ok, false).0,
            IommuBackend::Legacy
        );
        assert_eq!(
            resolve(IommuBackend::Iommufd, &debian, &bad, true).0,
            IommuBackend::Iommufd
        );
    }
}
