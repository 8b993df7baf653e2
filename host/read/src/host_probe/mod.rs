//! Live probes for `check`: files under `ROOT/dev`, `ROOT/sys/module`, `ROOT/lib/modules`,
//! the VFIO group and KVM ioctls. Everything is taken relative to the sysfs root, so
//! tests can point it at a directory tree; the VFIO ioctls are the FFI crate `vfio-p2p-vfio-ioctl`'s,
//! KVM's [`kvm_probe`] (through kvm-ioctls), the decisions in `vfio_p2p_decide::check`.

pub mod iommufd;
pub mod kvm_probe;
pub mod nvlsm;

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::Path;

use pci_config::Bdf;

use vfio_p2p_files::{read_attribute_text, read_input_file};
use vfio_p2p_model::host_facts::GraceFacts;
use vfio_p2p_model::host_facts::HostFacts;
use vfio_p2p_model::host_facts::IommuFacts;
use vfio_p2p_model::host_facts::ModuleState;
use vfio_p2p_model::host_facts::NodeProbe;
use vfio_p2p_model::Topology;

/// The most `modules.dep` or `modules.builtin` may hold (a few hundred KiB on a distribution kernel).
const MAX_MODULE_LIST_BYTES: u64 = 64 << 20;

/// Facts when there is no host to probe (an embedded example, a snapshot file).
pub fn not_probed(why: &str, topo: &Topology, gpus: &[Bdf]) -> HostFacts {
    HostFacts {
        vfio_pci: ModuleState::Unknown(why.to_string()),
        vfio_container: NodeProbe::Unknown(why.to_string()),
        groups: groups_of(topo, gpus)
            .into_iter()
            .map(|g| (g, NodeProbe::Unknown(why.to_string())))
            .collect(),
        kvm: NodeProbe::Unknown(why.to_string()),
        deep: BTreeMap::new(),
        iommu: IommuFacts::not_probed(why),
        grace: GraceFacts::not_probed(why),
    }
}

fn groups_of(topo: &Topology, gpus: &[Bdf]) -> Vec<u32> {
    let mut g: Vec<u32> = gpus
        .iter()
        .filter_map(|b| topo.device(b).and_then(|d| d.iommu_group))
        .collect();
    g.sort();
    g.dedup();
    g
}

pub(crate) fn node<T>(path: &Path, r: io::Result<T>) -> NodeProbe<T> {
    match r {
        Ok(v) => NodeProbe::Ok(v),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            NodeProbe::Absent(path.display().to_string())
        }
        Err(e) => NodeProbe::Error(format!("{}: {e}", path.display())),
    }
}

/// Where vfio-pci is: loaded (`sys/module/vfio_pci`), built in or available as a module
/// (`lib/modules/<release>/modules.builtin` / `modules.dep`; `<release>` from
/// `proc/sys/kernel/osrelease`, else any release under the root).
pub fn vfio_pci_module(root: &Path) -> ModuleState {
    module_state(root, "vfio_pci", "vfio-pci")
}

/// Where nvgrace_gpu_vfio_pci is (module file `nvgrace-gpu-vfio-pci.ko`), as [`vfio_pci_module`].
pub fn nvgrace_module(root: &Path) -> ModuleState {
    module_state(root, "nvgrace_gpu_vfio_pci", "nvgrace-gpu-vfio-pci")
}

/// Where vhost_vsock is, as [`vfio_pci_module`] looks (QEMU's and Cloud Hypervisor's vsock
/// device open `/dev/vhost-vsock`, which loads it: `devname:vhost-vsock`).
pub fn vhost_vsock_module(root: &Path) -> ModuleState {
    module_state(root, "vhost_vsock", "vhost_vsock")
}

/// Where module `name` (its file `file.ko`, `-` or `_` as the kernel's build wrote it) is:
/// loaded, built in, available or missing.
fn module_state(root: &Path, name: &str, file: &str) -> ModuleState {
    let loaded = root.join("sys/module").join(name);
    if loaded.is_dir() {
        return ModuleState::Loaded;
    }
    let modules = root.join("lib/modules");
    let running =
        read_attribute_text(&root.join("proc/sys/kernel/osrelease"), "kernel release").ok();
    let releases: Vec<std::path::PathBuf> = match running {
        Some(r) => vec![modules.join(r.trim())],
        None => fs::read_dir(&modules)
            .map(|rd| rd.filter_map(Result::ok).map(|e| e.path()).collect())
            .unwrap_or_default(),
    };
    for rel in &releases {
        let lists = |name: &str| {
            let t = read_input_file(&rel.join(name), MAX_MODULE_LIST_BYTES, "module list").ok()?;
            String::from_utf8_lossy(&t)
                .lines()
                .map(|l| l.split(':').next().unwrap_or(""))
                .find(|m| {
                    m.ends_with(&format!("/{file}.ko")) || m.contains(&format!("/{file}.ko."))
                })
                .map(str::to_string)
        };
        if lists("modules.builtin").is_some() {
            return ModuleState::BuiltIn;
        }
        if let Some(m) = lists("modules.dep") {
            return ModuleState::Available(rel.join(m).display().to_string());
        }
    }
    ModuleState::Missing(format!(
        "not loaded ({} absent) and not in modules.dep/modules.builtin under {}",
        loaded.display(),
        modules.display()
    ))
}

/// Probes the host below `root` for `gpus`. With `deep`, each GPU is opened through
/// VFIO, which resets it.
pub fn gather(root: &Path, topo: &Topology, gpus: &[Bdf], deep: bool) -> HostFacts {
    let dev = root.join("dev");
    let container = dev.join("vfio/vfio");
    let groups = groups_of(topo, gpus)
        .into_iter()
        .map(|g| {
            let p = dev.join(format!("vfio/{g}"));
            (g, node(&p, vfio_p2p_vfio_ioctl::group_viable(&p)))
        })
        .collect();
    let kvm_path = dev.join("kvm");
    let kvm = if !kvm_path.exists() {
        NodeProbe::Absent(kvm_path.display().to_string())
    } else {
        match kvm_probe::probe(&kvm_path) {
            kvm_probe::KvmProbe::Usable { api_version } => NodeProbe::Ok(api_version),
            kvm_probe::KvmProbe::Failed { step, error } => {
                NodeProbe::Error(format!("{}: {step}: {error}", kvm_path.display()))
            }
        }
    };
    let mut deep_results = BTreeMap::new();
    if deep {
        for g in gpus {
            let Some(group) = topo.device(g).and_then(|d| d.iommu_group) else {
                continue;
            };
            let gp = dev.join(format!("vfio/{group}"));
            let probe = if !container.exists() {
                NodeProbe::Absent(container.display().to_string())
            } else {
                let r = vfio_p2p_vfio_ioctl::open_device(&container, &gp, &g.to_string())
                    .map(|i| i.resettable);
                node(&gp, r)
            };
            deep_results.insert(*g, probe);
        }
    }
    HostFacts {
        vfio_pci: vfio_pci_module(root),
        vfio_container: node(
            &container,
            vfio_p2p_vfio_ioctl::container_api_version(&container),
        ),
        groups,
        kvm,
        deep: deep_results,
        iommu: iommufd::probe(root),
        grace: GraceFacts {
            nvgrace_module: nvgrace_module(root),
            nvidia_system_ram: crate::iomem::nvidia_system_ram(root),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synth;

    #[test]
    fn module_states() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        assert!(matches!(vfio_pci_module(root), ModuleState::Missing(_)));
        let rel = root.join("lib/modules/6.1.0-28-amd64");
        fs::create_dir_all(&rel).unwrap();
        fs::write(
            rel.join("modules.dep"),
            "kernel/drivers/vfio/pci/vfio-pci.ko.xz: kernel/drivers/vfio/pci/vfio-pci-core.ko.xz\n",
        )
        .unwrap();
        assert!(
            matches!(vfio_pci_module(root), ModuleState::Available(p) if p.ends_with("vfio-pci.ko.xz"))
        );
        fs::write(
            rel.join("modules.builtin"),
            "kernel/drivers/vfio/pci/vfio-pci.ko\n",
        )
        .unwrap();
        assert_eq!(vfio_pci_module(root), ModuleState::BuiltIn);
        fs::create_dir_all(root.join("sys/module/vfio_pci")).unwrap();
        assert_eq!(vfio_pci_module(root), ModuleState::Loaded);
        assert!(
            matches!(nvgrace_module(root), ModuleState::Missing(p) if p.contains("nvgrace_gpu_vfio_pci"))
        );
        fs::write(
            rel.join("modules.dep"),
            "kernel/drivers/vfio/pci/nvgrace-gpu/nvgrace-gpu-vfio-pci.ko.zst: kernel/drivers/vfio/pci/vfio-pci-core.ko.zst\n",
        )
        .unwrap();
        assert!(
            matches!(nvgrace_module(root), ModuleState::Available(p) if p.ends_with("nvgrace-gpu-vfio-pci.ko.zst"))
        );
    }

    #[test]
    fn vhost_vsock_is_looked_for_like_vfio_pci() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        assert!(
            matches!(vhost_vsock_module(root), ModuleState::Missing(w) if w.contains("sys/module/vhost_vsock"))
        );
        let rel = root.join("lib/modules/6.1.0-28-amd64");
        fs::create_dir_all(&rel).unwrap();
        fs::write(
            rel.join("modules.dep"),
            "kernel/drivers/vhost/vhost_vsock.ko.xz: kernel/drivers/vhost/vhost.ko.xz\n",
        )
        .unwrap();
        assert!(
            matches!(vhost_vsock_module(root), ModuleState::Available(p) if p.ends_with("vhost_vsock.ko.xz"))
        );
        // vfio-pci is not vhost_vsock
        assert!(matches!(vfio_pci_module(root), ModuleState::Missing(_)));
        fs::create_dir_all(root.join("sys/module/vhost_vsock")).unwrap();
        assert_eq!(vhost_vsock_module(root), ModuleState::Loaded);
    }

    #[test]
    fn missing_dev_is_reported_absent_with_paths() {
        let dir = tempfile::tempdir().unwrap();
        let topo = Topology::from_record(&synth::example("dual-socket-pcie").unwrap());
        let gpus: Vec<Bdf> = topo.gpus().map(|d| d.bdf).take(2).collect();
        let facts = gather(dir.path(), &topo, &gpus, true);
        let vfio = dir.path().join("dev/vfio/vfio").display().to_string();
        assert_eq!(facts.vfio_container, NodeProbe::Absent(vfio));
        assert_eq!(facts.groups.len(), 2);
        assert!(facts
            .groups
            .values()
            .all(|g| matches!(g, NodeProbe::Absent(p) if p.contains("/dev/vfio/"))));
        assert!(matches!(facts.kvm, NodeProbe::Absent(ref p) if p.ends_with("dev/kvm")));
        assert_eq!(facts.deep.len(), 2);
    }
}
