//! Host preflight: everything that will stop pass-through or P2P from working, with
//! the fix. Pure: the live probes (VFIO and KVM ioctls, files under `/dev`, the QEMU
//! binary) are gathered into [`vfio_p2p_model::host_facts::HostFacts`] and [`VmmFacts`] first.
//!
//! `facts` holds what the checks look at, `host_rules` and `vm_rules` the checks,
//! `report` their outcome.

mod address_rules;
mod backend_rules;
mod bar_mmap_rules;
mod domain_rules;
mod fabric_rules;
mod facts;
mod grace_rules;
mod host_rules;
mod nvlsm_rules;
mod report;
mod reset_rules;
mod vm_rules;

pub use domain_rules::{clique_checks, domain_checks, patch_fix, reserved_hostdevs};
pub use fabric_rules::fabric_checks;
pub use facts::{ConfigSyntax, StartBinding, Vmm, VmmFacts};
pub use grace_rules::grace_checks;
pub use host_rules::check_vsock_module;
pub use nvlsm_rules::nvlsm_checks;
pub use report::{CheckReport, CheckResult, Status};
pub use reset_rules::reset_checks;

use pci_config::Bdf;

use crate::clique_plan::{CliquePlan, PlanError};
use vfio_p2p_model::host_facts::HostFacts;
use vfio_p2p_model::{Device, Topology};

/// Runs every check for `gpus` on `topo` with the probed facts and the plan's outcome.
pub fn run_checks(
    topo: &Topology,
    gpus: &[Bdf],
    host: &HostFacts,
    vmm: &VmmFacts,
    plan: &Result<CliquePlan, PlanError>,
) -> CheckReport {
    let mut out = Vec::new();
    out.extend(host_rules::check_iommu(topo));
    out.push(host_rules::check_vfio_module(&host.vfio_pci));
    out.push(host_rules::check_container(&host.vfio_container));
    let selected: Vec<&Device> = gpus.iter().filter_map(|b| topo.device(b)).collect();
    for g in &selected {
        let start = &vmm.bound_at_start;
        out.push(host_rules::check_group_members(topo, g, gpus, start));
        out.push(host_rules::check_group_viable(topo, g, host, start));
        if let Some(d) = host.deep.get(&g.bdf) {
            out.push(host_rules::check_deep(g, d));
        }
    }
    out.push(host_rules::check_kvm(&host.kvm));
    out.extend(backend_rules::check_backend(host, vmm, plan.as_ref().ok()));
    for g in &selected {
        out.push(host_rules::check_reset(topo, g));
    }
    let arm_host = topo.is_arm64();
    out.push(vm_rules::check_bars(&selected, vmm, arm_host));
    out.extend(bar_mmap_rules::check_bar_mmap(&selected, vmm));
    out.extend(address_rules::check_address_space(topo, &selected, vmm));
    let assigned = |g: &Device| match plan {
        Ok(p) => p.clique_of(&g.bdf).is_some(),
        Err(_) => g.is_nvidia_gpu(),
    };
    for g in selected.iter().filter(|g| assigned(g)) {
        out.push(vm_rules::check_clique_placement(g, vmm));
    }
    out.push(vm_rules::check_hidden(vmm));
    out.push(vm_rules::check_plan(plan));
    CheckReport::new(out)
}

/// NICs passed with the GPUs (the domain's network hostdevs): like a GPU, each one's
/// IOMMU group must be whole and viable and it must reset between VMs; it never gets a
/// clique, so no placement check. Group members that are passed GPUs or NICs are ours;
/// `start` binds what the VM's starter binds.
pub fn nic_checks(
    topo: &Topology,
    gpus: &[Bdf],
    nics: &[Bdf],
    host: &HostFacts,
    start: &StartBinding,
) -> Vec<CheckResult> {
    let passed: Vec<Bdf> = gpus.iter().chain(nics).copied().collect();
    let mut out = Vec::new();
    for n in nics.iter().filter_map(|b| topo.device(b)) {
        out.push(host_rules::check_group_members(topo, n, &passed, start));
        out.push(host_rules::check_group_viable(topo, n, host, start));
        out.push(host_rules::check_reset(topo, n));
    }
    out
}

#[cfg(test)]
mod tests;
