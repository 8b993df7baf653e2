//! Checks of a Grace host (an aarch64 host with superchip GPUs among those checked): the
//! VFIO driver its GPUs need, the kernel options, the QEMU and libvirt versions for each
//! piece of the guest `gen` writes, huge pages, the GPUs' NUMA nodes and SMMUs, and their
//! memory still online under `nvidia`. Nothing on any other host.

use std::collections::BTreeMap;

use pci_config::Bdf;

use super::facts::VmmFacts;
use super::report::{result, CheckResult, Status};
use crate::grace_guest::{self, SmmuForm, GI_NODES_PER_GPU, HUGEPAGE_64K_KERNEL_KIB};
use vfio_p2p_model::grace::c2c_gpus;
use vfio_p2p_model::host_facts::{HostFacts, KernelOption, ModuleState, NodeProbe};
use vfio_p2p_model::vmm::{LibvirtVersion, QemuVersion, ACPI_NODESET_SINCE};
use vfio_p2p_model::Topology;

/// The Grace rows for `gpus`; empty where they do not make a Grace guest.
pub fn grace_checks(
    topo: &Topology,
    gpus: &[Bdf],
    host: &HostFacts,
    vmm: &VmmFacts,
    libvirt: Option<&Result<LibvirtVersion, String>>,
) -> Vec<CheckResult> {
    if !grace_guest::is_grace(topo, gpus) {
        return Vec::new();
    }
    let mut out = vec![
        check_driver(&host.grace.nvgrace_module),
        check_kernel_config(host),
        check_qemu(topo, gpus, vmm),
    ];
    out.extend(libvirt.map(check_libvirt));
    out.push(check_hugepages(topo));
    out.extend(check_nodes(topo, gpus));
    out.push(check_smmus(topo, gpus));
    out.extend(check_gpu_memory(topo, gpus, &host.grace.nvidia_system_ram));
    out
}

fn check_driver(m: &ModuleState) -> CheckResult {
    let fix = "install a kernel with drivers/vfio/pci/nvgrace-gpu (CONFIG_NVGRACE_GPU_VFIO_PCI=m): vfio-pci alone does not expose a Grace GPU's memory to the guest";
    let (status, saw, fix) = match m {
        ModuleState::Loaded => (
            Status::Pass,
            "nvgrace_gpu_vfio_pci is loaded".to_string(),
            None,
        ),
        ModuleState::BuiltIn => (
            Status::Pass,
            "nvgrace_gpu_vfio_pci is built in".to_string(),
            None,
        ),
        ModuleState::Available(p) => (
            Status::Pass,
            format!("nvgrace_gpu_vfio_pci is loadable ({p})"),
            None,
        ),
        ModuleState::Missing(why) => (
            Status::Fail,
            format!("nvgrace_gpu_vfio_pci: {why}"),
            Some(fix.to_string()),
        ),
        ModuleState::Unknown(why) => (
            Status::Skip,
            format!("nvgrace_gpu_vfio_pci not looked for: {why}"),
            Some("run check on the host itself (--sysfs-root /)".to_string()),
        ),
    };
    result("grace-driver", None, status, saw, fix)
}

fn check_kernel_config(host: &HostFacts) -> CheckResult {
    let Some(c) = &host.iommu.kernel_config else {
        // No live host (an example, a snapshot file): nothing was read, nothing to warn of.
        if let NodeProbe::Unknown(why) = &host.iommu.dev_iommu {
            return result(
                "grace-kernel-config",
                None,
                Status::Skip,
                format!("the running kernel's config not read: {why}"),
                Some("run check on the host itself, where /boot/config-$(uname -r) or /proc/config.gz is readable".into()),
            );
        }
        return result(
            "grace-kernel-config",
            None,
            Status::Warn,
            "the running kernel's config was not readable (boot/config-<release>, proc/config.gz)".into(),
            Some("run check on the host itself, where /boot/config-$(uname -r) or /proc/config.gz is readable".into()),
        );
    };
    let off: Vec<&str> = [
        ("IOMMUFD", c.iommufd),
        ("VFIO_PCI_DMABUF", c.vfio_pci_dmabuf),
        ("PCI_P2PDMA", c.pci_p2pdma),
    ]
    .into_iter()
    .filter(|(_, o)| *o == KernelOption::Off)
    .map(|(n, _)| n)
    .collect();
    if off.is_empty() {
        return result(
            "grace-kernel-config",
            None,
            Status::Pass,
            format!("{}: IOMMUFD, VFIO_PCI_DMABUF and PCI_P2PDMA are on", c.path),
            None,
        );
    }
    result(
        "grace-kernel-config",
        None,
        Status::Warn,
        format!("{}: CONFIG_{} not set", c.path, off.join(", CONFIG_")),
        Some("build the host kernel with them: iommufd is what the nested (accel) SMMUv3 and the VFIO cdevs go through, VFIO_PCI_DMABUF with PCI_P2PDMA is how GPU BARs are mapped for peer DMA under iommufd".into()),
    )
}

/// What the QEMU given takes of a Grace guest ([`grace_guest::qemu_pieces`]).
fn check_qemu(topo: &Topology, gpus: &[Bdf], vmm: &VmmFacts) -> CheckResult {
    let version = match &vmm.qemu_version {
        Some(Ok(v)) => *v,
        Some(Err(why)) => return result("grace-qemu", None, Status::Fail, why.clone(), Some("point --qemu at the qemu-system-aarch64 that will run the VM".into())),
        None => {
            return result(
                "grace-qemu",
                None,
                Status::Warn,
                "no QEMU given: which pieces of the guest it takes is unknown".into(),
                Some(format!("check --qemu /usr/bin/qemu-system-aarch64: a Grace guest needs QEMU >= {} (generic initiators), >= {} for a vSMMU per physical SMMU", QemuVersion::GENERIC_INITIATOR, QemuVersion::SMMUV3_PER_BUS)),
            )
        }
    };
    let devices: Vec<_> = gpus.iter().filter_map(|b| topo.device(b)).collect();
    let window = crate::mmio::hole64_size(&devices)
        .next_power_of_two()
        .max(grace_guest::HIGHMEM_MMIO_DEFAULT);
    match grace_guest::qemu_pieces(Some(version), window) {
        Err(e) => result("grace-qemu", None, Status::Fail, format!("QEMU {version}"), Some(e.to_string())),
        Ok((p, warnings)) if p.smmu_form == SmmuForm::MachineWide || !warnings.is_empty() => result(
            "grace-qemu",
            None,
            Status::Warn,
            format!("QEMU {version}: generic initiators yes, one SMMUv3 for the whole machine"),
            Some(format!("QEMU >= {} gives each physical SMMU its own vSMMU (arm-smmuv3,primary-bus=)", QemuVersion::SMMUV3_PER_BUS)),
        ),
        Ok(_) => result(
            "grace-qemu",
            None,
            Status::Pass,
            format!("QEMU {version}: generic initiators, a vSMMU per physical SMMU, highmem-mmio-size (accel=on from {} is for real Grace hardware only and not written)", QemuVersion::SMMUV3_ACCEL),
            None,
        ),
    }
}

fn check_libvirt(v: &Result<LibvirtVersion, String>) -> CheckResult {
    match v {
        Err(why) => result("grace-libvirt", None, Status::Warn, why.clone(), Some("only `gen libvirt` needs libvirt; `gen qemu` does not".into())),
        Ok(v) if v.has_acpi_nodeset() => result("grace-libvirt", None, Status::Pass, format!("libvirt {v}: <acpi nodeset> on the GPU's hostdev"), None),
        Ok(v) => result(
            "grace-libvirt",
            None,
            Status::Warn,
            format!("libvirt {v}: the generic initiators go in <qemu:commandline> (unchecked before {ACPI_NODESET_SINCE})"),
            Some(format!("libvirt >= {ACPI_NODESET_SINCE} writes them from <acpi nodeset>; the <qemu:commandline> form works meanwhile")),
        ),
    }
}

fn check_hugepages(topo: &Topology) -> CheckResult {
    if topo.hugepage_sizes_kib.contains(&HUGEPAGE_64K_KERNEL_KIB) {
        return result(
            "grace-hugepages",
            None,
            Status::Pass,
            "512 MiB huge pages offered (a 64 KiB-page kernel): guest RAM is backed by them".into(),
            None,
        );
    }
    let sizes: Vec<String> = topo
        .hugepage_sizes_kib
        .iter()
        .map(|k| format!("{k} KiB"))
        .collect();
    result(
        "grace-hugepages",
        None,
        Status::Warn,
        format!("huge page sizes offered: {}", if sizes.is_empty() { "none seen".into() } else { sizes.join(", ") }),
        Some("boot the 64 KiB-page arm64 kernel NVIDIA recommends for Grace (its huge pages are 512 MiB); without it gen backs guest RAM with ordinary pages".into()),
    )
}

/// Each Grace GPU shows its memory node and 7 companions.
fn check_nodes(topo: &Topology, gpus: &[Bdf]) -> Vec<CheckResult> {
    let c2c = c2c_gpus(topo);
    gpus.iter()
        .filter_map(|b| Some((b, c2c.get(b)?)))
        .map(|(b, c)| {
            let n = c.memory_nodes.len();
            match n == GI_NODES_PER_GPU {
                true => result("grace-numa-nodes", Some(b.to_string()), Status::Pass, format!("memory node {}, companions {:?}", c.memory_nodes[0], c.companions()), None),
                false => result(
                    "grace-numa-nodes",
                    Some(b.to_string()),
                    Status::Fail,
                    format!("{n} NUMA node(s) without CPUs for this GPU: {:?}", c.memory_nodes),
                    Some(format!("a Grace GPU has {GI_NODES_PER_GPU} (its memory node and 7 generic-initiator companions): check the firmware's SRAT and that every node is online (`ls /sys/devices/system/node`)")),
                ),
            }
        })
        .collect()
}

/// The physical SMMUs behind the GPUs: one vSMMU each in the guest.
fn check_smmus(topo: &Topology, gpus: &[Bdf]) -> CheckResult {
    let mut by_unit: BTreeMap<&str, Vec<Bdf>> = BTreeMap::new();
    let mut unknown = Vec::new();
    for b in gpus {
        match topo.iommu_units.get(b) {
            Some(u) => by_unit.entry(u.as_str()).or_default().push(*b),
            None => unknown.push(b.to_string()),
        }
    }
    if !unknown.is_empty() {
        return result(
            "grace-smmu",
            None,
            Status::Warn,
            format!("no iommu link for {}: the SMMU behind them is unknown", unknown.join(", ")),
            Some("boot with the SMMU enabled (no iommu.passthrough alone is enough; arm-smmu-v3 must bind): each GPU then gets a vSMMU of its own".into()),
        );
    }
    let groups: Vec<String> = by_unit
        .iter()
        .map(|(u, g)| {
            format!(
                "{u}: {}",
                g.iter().map(Bdf::to_string).collect::<Vec<_>>().join(" ")
            )
        })
        .collect();
    result(
        "grace-smmu",
        None,
        Status::Pass,
        format!(
            "{} SMMU(s), one vSMMU each: {}",
            by_unit.len(),
            groups.join("; ")
        ),
        None,
    )
}

/// GPU memory onlined by `nvidia` ("System RAM (NVIDIA)" in /proc/iomem) must go offline
/// before the GPU goes to nvgrace_gpu_vfio_pci.
fn check_gpu_memory(
    topo: &Topology,
    gpus: &[Bdf],
    ram: &NodeProbe<Vec<(u64, u64)>>,
) -> Option<CheckResult> {
    let on_nvidia: Vec<String> = gpus
        .iter()
        .filter(|b| topo.device(b).and_then(|d| d.driver.as_deref()) == Some("nvidia"))
        .map(Bdf::to_string)
        .collect();
    match ram {
        NodeProbe::Ok(r) if r.is_empty() => Some(result("grace-gpu-memory", None, Status::Pass, "no System RAM (NVIDIA) in /proc/iomem: GPU memory is offline".into(), None)),
        NodeProbe::Ok(r) => Some(result(
            "grace-gpu-memory",
            None,
            Status::Warn,
            format!("{} range(s) of System RAM (NVIDIA) online in /proc/iomem (GPUs on nvidia: {})", r.len(), on_nvidia.join(" ")),
            Some("`vfio-p2p bind` offlines it and waits before unbinding nvidia; processes using that memory keep it online".into()),
        )),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vfio_p2p_model::host_facts::{GraceFacts, IommuFacts, KernelConfig};
    use vfio_p2p_read::synth;

    fn facts(module: ModuleState, ram: Vec<(u64, u64)>) -> HostFacts {
        let mut iommu = IommuFacts::not_probed("test");
        iommu.kernel_config = Some(KernelConfig {
            path: "/boot/config-7.3.4-arm64".into(),
            iommufd: KernelOption::Module,
            vfio_device_cdev: KernelOption::BuiltIn,
            vfio_pci_dmabuf: KernelOption::BuiltIn,
            pci_p2pdma: KernelOption::BuiltIn,
        });
        HostFacts {
            vfio_pci: ModuleState::Loaded,
            vfio_container: NodeProbe::Ok(0),
            groups: BTreeMap::new(),
            kvm: NodeProbe::Ok(12),
            deep: BTreeMap::new(),
            iommu,
            grace: GraceFacts {
                nvgrace_module: module,
                nvidia_system_ram: NodeProbe::Ok(ram),
            },
        }
    }

    fn vmm(qemu: Option<(u32, u32)>) -> VmmFacts {
        VmmFacts {
            qemu_version: qemu.map(|(a, b)| Ok(QemuVersion::release(a, b))),
            ..VmmFacts::default()
        }
    }

    fn status(rows: &[CheckResult], check: &str) -> Status {
        rows.iter()
            .find(|r| r.check == check)
            .unwrap_or_else(|| panic!("{check}: {rows:?}"))
            .status
    }

    fn run(
        host: &vfio_p2p_model::HostRecord,
        f: &HostFacts,
        qemu: Option<(u32, u32)>,
        libvirt: &str,
    ) -> Vec<CheckResult> {
        let topo = Topology::from_record(host);
        let gpus: Vec<Bdf> = topo.gpus().map(|g| g.bdf).collect();
        let lv = Ok(libvirt.parse().unwrap());
        grace_checks(&topo, &gpus, f, &vmm(qemu), Some(&lv))
    }

    #[test]
    fn nothing_on_an_x86_host() {
        let topo = Topology::from_record(&synth::example("hgx-h100").unwrap());
        let gpus: Vec<Bdf> = topo.gpus().map(|g| g.bdf).collect();
        let f = facts(ModuleState::Loaded, vec![]);
        assert!(grace_checks(&topo, &gpus, &f, &vmm(Some((11, 1))), None).is_empty());
    }

    #[test]
    fn a_ready_gb200_passes_every_row() {
        let host = synth::example("gb200").unwrap();
        let f = facts(
            ModuleState::Available("/lib/modules/7.3/nvgrace-gpu-vfio-pci.ko".into()),
            vec![],
        );
        let rows = run(&host, &f, Some((11, 1)), "12.8");
        assert!(rows.iter().all(|r| r.status == Status::Pass), "{rows:#?}");
        assert_eq!(
            rows.iter()
                .filter(|r| r.check == "grace-numa-nodes")
                .count(),
            4
        );
        let smmu = rows.iter().find(|r| r.check == "grace-smmu").unwrap();
        assert!(smmu.saw.starts_with("4 SMMU(s)"), "{}", smmu.saw);
    }

    #[test]
    fn an_unread_kernel_config_is_skipped_without_a_host_and_warned_of_on_one() {
        let host = synth::example("gh200").unwrap();
        let mut f = facts(ModuleState::Loaded, vec![]);
        f.iommu.kernel_config = None;
        let row = |f: &HostFacts| {
            let rows = run(&host, f, Some((11, 1)), "12.0");
            status(&rows, "grace-kernel-config")
        };
        assert_eq!(row(&f), Status::Skip);
        f.iommu.dev_iommu = NodeProbe::Absent("/dev/iommu".into());
        assert_eq!(row(&f), Status::Warn);
    }

    #[test]
    fn each_row_flips() {
        let host = synth::example("gh200").unwrap();
        let ready = facts(ModuleState::Loaded, vec![]);
        let missing = facts(
            ModuleState::Missing("not in modules.dep".into()),
            vec![(1, 2)],
        );
        let rows = run(&host, &missing, Some((8, 2)), "9.0");
        assert_eq!(status(&rows, "grace-driver"), Status::Fail);
        assert_eq!(status(&rows, "grace-qemu"), Status::Fail);
        assert!(rows.iter().any(|r| r
            .fix
            .as_deref()
            .is_some_and(|f| f.contains("QEMU >= 9.0.0"))));
        assert_eq!(status(&rows, "grace-libvirt"), Status::Warn);
        assert_eq!(status(&rows, "grace-gpu-memory"), Status::Warn);
        assert_eq!(
            status(&run(&host, &ready, Some((10, 1)), "12.0"), "grace-qemu"),
            Status::Warn
        );
        assert_eq!(
            status(&run(&host, &ready, None, "12.0"), "grace-qemu"),
            Status::Warn
        );
        let mut cfg = ready.clone();
        cfg.iommu.kernel_config.as_mut().unwrap().iommufd = KernelOption::Off;
        let row = run(&host, &cfg, Some((11, 1)), "12.0")
            .into_iter()
            .find(|r| r.check == "grace-kernel-config")
            .unwrap();
        assert_eq!(
            (row.status, row.saw.contains("CONFIG_IOMMUFD not set")),
            (Status::Warn, true),
            "{row:?}"
        );
        let mut bare = host.clone();
        bare.hugepage_sizes_kib = vec![2048, 1048576];
        bare.iommu_units.clear();
        bare.numa_nodes.remove(&8);
        let rows = run(&bare, &ready, Some((11, 1)), "12.0");
        assert_eq!(status(&rows, "grace-hugepages"), Status::Warn);
        assert_eq!(status(&rows, "grace-smmu"), Status::Warn);
        assert_eq!(status(&rows, "grace-numa-nodes"), Status::Fail);
    }
}
