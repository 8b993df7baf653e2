//! The reset each passed GPU will get between tenants under host.yaml's `reset:`, as
//! `bind` and the hook will set it (`decide::reset`).

use std::collections::BTreeSet;

use pci_config::Bdf;

use super::report::{result, CheckResult, Status};
use crate::reset::{choose, ResetChoice};
use vfio_p2p_model::{ResetPolicy, Topology};

/// One `reset-policy` row per GPU: the method bind sets, or why it cannot. `passed` is
/// every device the VM gets (GPUs and NICs); their other functions go with them.
pub fn reset_checks(
    topo: &Topology,
    gpus: &[Bdf],
    passed: &[Bdf],
    policy: ResetPolicy,
) -> Vec<CheckResult> {
    let mut vm: BTreeSet<Bdf> = passed.iter().chain(gpus).copied().collect();
    for b in passed.iter().chain(gpus) {
        vm.extend(topo.sibling_functions(b).iter().map(|d| d.bdf));
    }
    gpus.iter()
        .map(|g| {
            let subject = Some(g.to_string());
            let offered = topo
                .device(g)
                .and_then(|d| d.reset_methods.as_ref())
                .map_or("unreadable".to_string(), |m| m.join(" "));
            match choose(topo, g, policy, &vm) {
                Ok(ResetChoice::KernelDefault) => result(
                    "reset-policy",
                    subject,
                    Status::Pass,
                    format!("reset: auto; bind leaves the kernel's order ({offered})"),
                    None,
                ),
                Ok(ResetChoice::Only(m)) => result(
                    "reset-policy",
                    subject,
                    Status::Pass,
                    format!(
                        "reset: {}; bind sets reset_method {m} (offered: {offered})",
                        policy.name()
                    ),
                    None,
                ),
                Err(e) => result(
                    "reset-policy",
                    subject,
                    Status::Fail,
                    e.to_string(),
                    Some(format!(
                        "make the kernel offer {m} for it, or change host.yaml's 'reset: {m}'",
                        m = policy.name()
                    )),
                ),
            }
        })
        .collect()
}
