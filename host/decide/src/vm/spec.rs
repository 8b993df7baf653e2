//! The VM's spec: vm.yaml (or the defaults) merged once with the command line's flags,
//! the flags that only some targets take refused elsewhere (apply), then checked against
//! what the target can boot and the disks it names (validate), before the host is read.

use std::path::PathBuf;

use anyhow::bail;
use pci_config::{Bdf, PathKind};
use serde_saphyr::Location;

use super::{Said, Say, VmTarget};
use crate::clique_plan::PlanOptions;
use crate::vm_boot::{self, BootVmm};
use vfio_p2p_config::host::HostConfig;
use vfio_p2p_config::vm::{GuestTopology, IommuBackend, VmConfig};
use vfio_p2p_model::{NicRef, Topology};

/// What the command line says about the VM, over vm.yaml.
#[derive(Debug, Clone)]
pub struct VmFlags {
    pub target: VmTarget,
    /// The vm.yaml read, named in errors about its lines.
    pub config_path: Option<PathBuf>,
    pub name: Option<String>,
    pub gpus: Vec<Bdf>,
    pub nics: Vec<NicRef>,
    pub guest_topology: Option<GuestTopology>,
    pub iommu_backend: Option<IommuBackend>,
    pub p2p_level: Option<PathKind>,
    pub allow_untranslated_p2p: bool,
    /// `--format` given.
    pub format: bool,
    /// `--incus-output` or `--incus-server` given.
    pub incus_flags: bool,
    /// `--expect-out` given.
    pub expect_out: bool,
    pub as_is: bool,
    /// `--state-dir` given: the VM is registered for the collector.
    pub state_dir: bool,
}

impl VmFlags {
    /// No flag but the target: vm.yaml as it is written.
    pub fn new(target: VmTarget) -> VmFlags {
        VmFlags {
            target,
            config_path: None,
            name: None,
            gpus: Vec::new(),
            nics: Vec::new(),
            guest_topology: None,
            iommu_backend: None,
            p2p_level: None,
            allow_untranslated_p2p: false,
            format: false,
            incus_flags: false,
            expect_out: false,
            as_is: false,
            state_dir: false,
        }
    }
}

/// vm.yaml with the flags applied: what [`super::plan`] plans.
#[derive(Debug, Clone)]
pub struct VmSpec {
    pub config: VmConfig,
    pub flags: VmFlags,
}

impl VmSpec {
    /// `config` (vm.yaml, or the defaults) with the flags' overrides, and the flags that
    /// only some targets take refused elsewhere.
    pub fn apply(mut config: VmConfig, flags: VmFlags) -> anyhow::Result<VmSpec> {
        let target = flags.target;
        if let Some(n) = &flags.name {
            // the same rule as vm.yaml's `name:`: it goes into every config line
            if let Some(e) = vfio_p2p_config::vm_name_error(n) {
                bail!("--name: {e}");
            }
            config.name = n.clone();
        }
        if !flags.nics.is_empty() {
            config.nics = flags.nics.clone();
        }
        if let Some(t) = flags.guest_topology {
            config.guest_topology = t;
        }
        if target == VmTarget::Incus {
            config.guest_topology = GuestTopology::Flat;
        }
        if let Some(b) = flags.iommu_backend {
            config.iommu_backend = b;
        }
        use VmTarget::{Incus, Libvirt, Nccl, Proxmox};
        if flags.format && matches!(target, Libvirt | Nccl | Proxmox | Incus) {
            bail!("--format applies to qemu and cloud-hypervisor command lines; libvirt and nccl write XML, proxmox its config lines, incus a profile (--incus-output)");
        }
        if flags.incus_flags && target != Incus {
            bail!("--incus-output and --incus-server apply to `gen incus` only");
        }
        if target == Incus && (config.report.is_some() || flags.expect_out) {
            bail!("`gen incus` writes no expectation and no vsock device (Incus picks the guest addresses and the VM's vsock CID, volatile.vsock_id): leave out `verify: vsock` and --expect-out");
        }
        if target == Incus && flags.guest_topology == Some(GuestTopology::Mirror) {
            bail!("Incus lays out the guest's PCIe tree itself (one root port per device): `gen incus` takes no --guest-topology mirror");
        }
        if flags.as_is && target != Nccl {
            bail!("--as-is applies to `gen nccl` only");
        }
        Ok(VmSpec { config, flags })
    }

    /// vm.yaml's disks and boot keys against the target. `unusable`: per disk, why its
    /// image cannot be used (read before); `here`: the VM runs on the host read, where a
    /// missing image is an error naming it, its line and the fix (else a warning). A
    /// complete VM without disks is warned of, unless it boots a kernel with its initramfs
    /// (`kernel:` + `initramfs:`, Cloud Hypervisor's direct boot: the initramfs is its root);
    /// boot keys the VMM cannot honour are refused at their line.
    pub fn validate(&self, unusable: &[Option<&str>], here: bool, say: Say) -> anyhow::Result<()> {
        let config = &self.config;
        let whole_vm = matches!(
            self.flags.target,
            VmTarget::Qemu | VmTarget::Libvirt | VmTarget::CloudHypervisor
        );
        let initramfs_root = config
            .boot
            .kernel
            .as_ref()
            .is_some_and(|k| k.initramfs.is_some());
        if whole_vm && config.devices.disks.is_empty() && !initramfs_root {
            say(Said::Warning(format!(
                "{} has no disks: the VM has nothing to boot from; add `disks: [{{path: /var/lib/images/{}.qcow2}}]` to its vm.yaml (docs/gen.md)",
                config.name,
                config.name
            )));
        }
        for (d, why) in config.devices.disks.iter().zip(unusable) {
            let Some(why) = why else { continue };
            let at = self.at(d.at);
            let path = d.path.display();
            let text = format!(
                "{at}disks: {path} {why}: create it (`qemu-img create -f {} {path} 64G`) or copy the guest's image there",
                d.format.as_str()
            );
            if here {
                bail!("{text}");
            }
            say(Said::Warning(format!("{text} (generating from an example or snapshot: it must exist on the machine that runs the VM)")));
        }
        let vmm = match self.flags.target {
            VmTarget::Qemu => BootVmm::Qemu,
            VmTarget::Libvirt => BootVmm::Libvirt,
            VmTarget::CloudHypervisor => BootVmm::CloudHypervisor,
            VmTarget::Proxmox => BootVmm::Other("Proxmox VE"),
            VmTarget::Incus => BootVmm::Other("Incus"),
            VmTarget::Nccl => return Ok(()),
        };
        vm_boot::refusal(config, vmm).map_err(|r| self.refused(r))
    }

    /// `vm.yaml:LINE:COL: ` for a refusal about that place of the config file, else nothing.
    pub fn at(&self, at: Option<Location>) -> String {
        match (&self.flags.config_path, at) {
            (Some(p), Some(a)) => format!("{}:{}:{}: ", p.display(), a.line(), a.column()),
            _ => String::new(),
        }
    }

    /// A VMM's refusal as it is said: `vm.yaml:LINE:COL: why` where a line is known.
    pub fn refused<W: std::fmt::Display>(&self, r: crate::vm_refusal::Refusal<W>) -> anyhow::Error {
        anyhow::anyhow!("{}{}", self.at(r.at), r.why)
    }

    /// The VM's GPUs: the flag's, else vm.yaml's, else every GPU of the host.
    pub fn gpus(&self, topo: &Topology) -> Vec<Bdf> {
        let requested = match self.flags.gpus.is_empty() {
            true => &self.config.gpus,
            false => &self.flags.gpus,
        };
        if requested.is_empty() {
            topo.gpus().map(|d| d.bdf).collect()
        } else {
            requested.clone()
        }
    }

    /// The flags over vm.yaml's level over the host config's policy.
    pub fn plan_options(&self, host: &HostConfig) -> PlanOptions {
        PlanOptions {
            p2p_level: (self.flags.p2p_level)
                .or(self.config.p2p_level)
                .unwrap_or(host.p2p_level),
            allow_untranslated_p2p: self.flags.allow_untranslated_p2p,
        }
    }

    /// The NICs to pass, where they sit on the host; an error names `--nics` or vm.yaml.
    pub fn nics(&self, topo: &Topology) -> anyhow::Result<Vec<Bdf>> {
        topo.resolve_nics(&self.config.nics).map_err(|e| {
            let path = self.flags.config_path.as_ref();
            match path.filter(|_| self.flags.nics.is_empty()) {
                Some(path) => anyhow::anyhow!("{}: nics: {e}", path.display()),
                None => anyhow::anyhow!("--nics: {e}"),
            }
        })
    }
}
