//! Whether the VMM gen writes for starts the guest as vm.yaml says (`config::vm_boot`):
//! decided before anything is rendered, so no key is ignored silently.
//!
//! - Cloud Hypervisor loads either firmware (`--firmware`: for UEFI the CloudHv build of
//!   edk2, CLOUDHV.fd; QEMU's OVMF_CODE does not boot under it) or a kernel (`--kernel`,
//!   `--initramfs`, `--cmdline`; cloud-hypervisor `src/main.rs`, `docs/uefi.md`: edk2's
//!   `OvmfPkg/CloudHv` build, CLOUDHV.fd, CLOUDHV_EFI.fd on aarch64); with neither it boots
//!   nothing, so gen refuses a vm.yaml that names neither.
//! - QEMU writes the guest's UEFI variables into the second pflash drive: it gets this
//!   VM's copy (`ovmf_vars_copy:`), never the shared template; a split OVMF_CODE image
//!   needs that drive.
//! - `kernel:` and QEMU as a service (`qmp_socket:`, `daemonize:`) are for the VMMs gen
//!   writes a command line for: Cloud Hypervisor's and QEMU's respectively.

use vfio_p2p_config::vm::VmConfig;
use vfio_p2p_config::vm_boot::Firmware;

/// What gen writes for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BootVmm {
    Qemu,
    Libvirt,
    CloudHypervisor,
    /// Proxmox VE, Incus: their own tools start QEMU and keep its firmware files.
    Other(&'static str),
}

/// Why the guest would not start as written.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BootProblem {
    #[error("{vm}: Cloud Hypervisor boots nothing without a kernel or firmware, and the VM's vm.yaml (gen --config) names neither: add kernel: PATH (with initramfs: and cmdline:), or firmware: uefi with ovmf_code: set to Cloud Hypervisor's UEFI build (CLOUDHV.fd, edk2's CloudHv platform)")]
    ChBootsNothing { vm: String },
    #[error("firmware: uefi under Cloud Hypervisor needs its own UEFI build, not QEMU's OVMF: set ovmf_code: to Cloud Hypervisor's firmware (CLOUDHV.fd, edk2's CloudHv platform), or boot a kernel: instead")]
    ChUefiWithoutFirmware,
    #[error("firmware: uefi needs OVMF's variable store for QEMU: set ovmf_vars: to the template (e.g. /usr/share/OVMF/OVMF_VARS_4M.fd) and ovmf_vars_copy: to this VM's copy (gen makes it)")]
    NoVarsStore,
    #[error("ovmf_vars: {template} is the template every VM starts from, and QEMU writes the VM's variables into its drive: add ovmf_vars_copy: PATH, this VM's copy (gen makes it)")]
    TemplateInPlace { template: String },
    #[error("ovmf_vars: Cloud Hypervisor takes no separate UEFI variable store (its firmware image is loaded whole, --firmware): remove ovmf_vars and ovmf_vars_copy for this VM")]
    ChVarsStore,
    #[error("kernel: is booted by Cloud Hypervisor only; {vmm} boots the disk through its firmware: remove kernel:, initramfs: and cmdline:")]
    KernelElsewhere { vmm: &'static str },
    #[error("qmp_socket: and daemonize: are for gen qemu's command line; {vmm} starts QEMU itself: remove them")]
    ServiceElsewhere { vmm: &'static str },
}

pub type Refusal = crate::vm_refusal::Refusal<BootProblem>;

fn vmm_name(vmm: BootVmm) -> &'static str {
    match vmm {
        BootVmm::Qemu => "QEMU",
        BootVmm::Libvirt => "libvirt",
        BootVmm::CloudHypervisor => "Cloud Hypervisor",
        BootVmm::Other(name) => name,
    }
}

/// The first boot key `vmm` cannot honour, at its vm.yaml line.
pub fn refusal(config: &VmConfig, vmm: BootVmm) -> Result<(), Refusal> {
    let b = &config.boot;
    let refuse = |at, why| Err(Refusal { at, why });
    let uefi = config.firmware == Firmware::Uefi;
    if b.kernel.is_some() && vmm != BootVmm::CloudHypervisor {
        let why = BootProblem::KernelElsewhere { vmm: vmm_name(vmm) };
        return refuse(b.kernel_at, why);
    }
    if b.qemu_service.is_some() && vmm != BootVmm::Qemu {
        let why = BootProblem::ServiceElsewhere { vmm: vmm_name(vmm) };
        return refuse(b.qemu_service_at, why);
    }
    match vmm {
        // at `firmware:` when it says bios, else nowhere: the key to add is not there
        BootVmm::CloudHypervisor if !uefi && b.kernel.is_none() => {
            let why = BootProblem::ChBootsNothing {
                vm: config.name.clone(),
            };
            refuse(b.firmware_at, why)
        }
        BootVmm::CloudHypervisor if uefi && b.ovmf_code_at.is_none() => {
            refuse(b.firmware_at, BootProblem::ChUefiWithoutFirmware)
        }
        BootVmm::CloudHypervisor if config.ovmf_vars.is_some() => {
            refuse(b.ovmf_vars_at, BootProblem::ChVarsStore)
        }
        BootVmm::Qemu if uefi && config.ovmf_vars.is_none() => {
            refuse(b.firmware_at, BootProblem::NoVarsStore)
        }
        BootVmm::Qemu if uefi && b.ovmf_vars_copy.is_none() => {
            let template = config.ovmf_vars.as_ref().map(|t| t.display().to_string());
            let why = BootProblem::TemplateInPlace {
                template: template.unwrap_or_default(),
            };
            refuse(b.ovmf_vars_at, why)
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests;
