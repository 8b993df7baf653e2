//! A [`VmPlan`] as the text of its target: the VM definition (QEMU, libvirt, Cloud
//! Hypervisor, Proxmox, Incus) or the NCCL file, in the form the plan decided. No
//! decision is made here; the warnings returned are what a renderer says of its text.

use super::qemu::{self, ArgvFormat};
use super::qemu_grace::ArmVirt;
use super::vm::{ExpectationSource, VmDefinition};
use super::{cloud_hypervisor, incus, libvirt, libvirt_grace, nccl, proxmox, qemu_grace};
use incus::IncusOutput;
use vfio_p2p_decide::vm::{TargetForm, VmPlan};

/// How the text is laid out where a target has several forms.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TextOptions {
    /// Command-line layout for qemu and cloud-hypervisor.
    pub format: ArgvFormat,
    /// incus: a profile or commands.
    pub incus_output: IncusOutput,
}

/// The text of `plan`'s target, the expectation reaching the guest from `source`, and the
/// renderer's warnings about it.
pub fn render(
    plan: &VmPlan,
    source: ExpectationSource,
    options: TextOptions,
) -> (String, Vec<String>) {
    let vm = VmDefinition::of(plan, source);
    let format = options.format;
    let arm = match (plan.grace.as_ref(), plan.arm_pcie.as_ref()) {
        (Some(g), _) => Some(ArmVirt::Grace(g)),
        (None, Some(p)) => Some(ArmVirt::Pcie(p)),
        (None, None) => None,
    };
    let text = match (plan.form, arm) {
        (TargetForm::QemuGrace | TargetForm::QemuArmPcie, Some(arm)) => {
            qemu::render(&qemu_grace::argv(&vm, arm), format)
        }
        (TargetForm::LibvirtGrace(version) | TargetForm::LibvirtArmPcie(version), Some(arm)) => {
            libvirt_grace::domain(&vm, arm, version)
        }
        (TargetForm::Qemu | TargetForm::QemuGrace | TargetForm::QemuArmPcie, _) => {
            qemu::render(&qemu::argv(&vm), format)
        }
        (
            TargetForm::Libvirt(version)
            | TargetForm::LibvirtGrace(version)
            | TargetForm::LibvirtArmPcie(version),
            _,
        ) => libvirt::domain(&vm, version),
        (TargetForm::CloudHypervisor, _) => {
            let (argv, warnings) = cloud_hypervisor::argv(&vm);
            return (qemu::render(&argv, format), warnings);
        }
        (TargetForm::Nccl, _) => nccl::topology_xml(&vm, plan.topo),
        (TargetForm::Proxmox, _) => proxmox::config(&vm),
        (TargetForm::Incus(form), _) => match options.incus_output {
            IncusOutput::Profile => incus::profile(&vm, form),
            IncusOutput::Commands => incus::commands(&vm, form),
        },
    };
    (text, Vec::new())
}

#[cfg(test)]
mod tests;
