//! Reset between tenants: the reset method a GPU passed to a VM gets (host.yaml `reset:`),
//! whether the kernel offers it (`reset_method` lists the methods it will use, in order),
//! and whether a secondary bus reset stays inside the VM.
//!
//! A bus reset is asserted by the GPU's parent bridge and resets everything below it: every
//! function on the GPU's bus and behind bridges there. Confidential-computing GPUs need it
//! (a function-level reset leaves state behind); it is refused when it would also reset a
//! device that does not go to the same VM.

use std::collections::BTreeSet;

use pci_config::Bdf;

use vfio_p2p_model::{ResetPolicy, Topology};

/// What a GPU's `reset_method` becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResetChoice {
    /// Left as the kernel has it (`reset: auto`).
    KernelDefault,
    /// Set to this one method.
    Only(&'static str),
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResetError {
    #[error("{gpu}: its reset_method is unreadable (a kernel before 5.15, or not root), so host.yaml's 'reset: {method}' cannot be set; run a kernel ≥ 5.15 as root, or set 'reset: auto'")]
    Unreadable { gpu: Bdf, method: &'static str },
    #[error("{gpu}: the kernel offers no {method} reset for it (reset_method: {offered}); set host.yaml's 'reset:' to one it offers, or 'auto'")]
    NotOffered {
        gpu: Bdf,
        method: &'static str,
        offered: String,
    },
    #[error("{gpu}: a bus reset would also reset {others}, which this VM does not get; pass them to the same VM, or set host.yaml's 'reset: flr'")]
    TakesOthers { gpu: Bdf, others: String },
}

/// The reset method `gpu` gets under `policy`, given every device the VM gets (`vm`):
/// the method must be one the kernel lists, and a bus reset must reset nothing outside `vm`.
pub fn choose(
    topo: &Topology,
    gpu: &Bdf,
    policy: ResetPolicy,
    vm: &BTreeSet<Bdf>,
) -> Result<ResetChoice, ResetError> {
    let method = match policy {
        ResetPolicy::Auto => return Ok(ResetChoice::KernelDefault),
        ResetPolicy::Flr => "flr",
        ResetPolicy::Bus => "bus",
    };
    let offered = topo.device(gpu).and_then(|d| d.reset_methods.as_ref());
    let Some(offered) = offered else {
        return Err(ResetError::Unreadable { gpu: *gpu, method });
    };
    if !offered.iter().any(|m| m == method) {
        return Err(ResetError::NotOffered {
            gpu: *gpu,
            method,
            offered: match offered.is_empty() {
                true => "none".into(),
                false => offered.join(" "),
            },
        });
    }
    if policy == ResetPolicy::Bus {
        let others: Vec<String> = bus_reset_reaches(topo, gpu)
            .into_iter()
            .filter(|d| !vm.contains(d))
            .map(|d| d.to_string())
            .collect();
        if !others.is_empty() {
            return Err(ResetError::TakesOthers {
                gpu: *gpu,
                others: others.join(", "),
            });
        }
    }
    Ok(ResetChoice::Only(method))
}

/// The functions other than bridges that a secondary bus reset of `gpu`'s bus resets:
/// everything below its parent bridge (nothing when it sits on a root bus, where the
/// kernel offers no bus reset).
pub fn bus_reset_reaches(topo: &Topology, gpu: &Bdf) -> Vec<Bdf> {
    let Some(parent) = topo.device(gpu).and_then(|d| d.parent) else {
        return Vec::new();
    };
    topo.devices
        .values()
        .filter(|d| d.bridge_role().is_none() && topo.chain(&d.bdf).contains(&parent))
        .map(|d| d.bdf)
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use vfio_p2p_read::synth::{Attach, EndpointSpec, HostBuilder, ACS_ISOLATING};

    /// GPU A alone below its port; GPU B sharing its bus with a NIC (a PCI bridge's bus).
    fn host() -> (Topology, Bdf, Bdf, Bdf) {
        let mut b = HostBuilder::new("reset test host");
        let hb = b.host_bridge(0, 0x40);
        let rp = b.root_port(hb, Some(0), Some(ACS_ISOLATING));
        let gpu = EndpointSpec::gpu(0x10de, 0x2330, 80);
        let a = b.endpoint(Attach::Below(rp), 0, &gpu, None);
        let rp2 = b.root_port(hb, Some(0), Some(ACS_ISOLATING));
        let gpu_b = b.endpoint(Attach::Below(rp2), 0, &gpu, None);
        let nic = b.endpoint(
            Attach::Below(rp2),
            0,
            &EndpointSpec::nic(0x15b3, 0x1021),
            None,
        );
        (Topology::from_record(&b.build()), a, gpu_b, nic)
    }

    fn vm(bdfs: &[Bdf]) -> BTreeSet<Bdf> {
        bdfs.iter().copied().collect()
    }

    #[test]
    fn auto_leaves_the_kernel_alone_and_flr_needs_flr_listed() {
        let (mut topo, a, ..) = host();
        assert_eq!(
            choose(&topo, &a, ResetPolicy::Auto, &vm(&[a])),
            Ok(ResetChoice::KernelDefault)
        );
        assert_eq!(
            choose(&topo, &a, ResetPolicy::Flr, &vm(&[a])),
            Ok(ResetChoice::Only("flr"))
        );
        topo.devices.get_mut(&a).unwrap().reset_methods = Some(vec!["pm".into(), "bus".into()]);
        let e = choose(&topo, &a, ResetPolicy::Flr, &vm(&[a])).unwrap_err();
        assert!(
            e.to_string()
                .contains("no flr reset for it (reset_method: pm bus)"),
            "{e}"
        );
        topo.devices.get_mut(&a).unwrap().reset_methods = None;
        let e = choose(&topo, &a, ResetPolicy::Bus, &vm(&[a])).unwrap_err();
        assert!(matches!(e, ResetError::Unreadable { .. }), "{e}");
    }

    /// A GPU whose bus also holds a PCIe-to-PCI bridge with a NIC behind it (check's
    /// reset row is tested on it too: `check::tests`).
    pub(crate) fn deep_host() -> (Topology, Bdf, Bdf) {
        let mut b = HostBuilder::new("deep reset host");
        let hb = b.host_bridge(0, 0x40);
        let rp = b.root_port(hb, Some(0), Some(ACS_ISOLATING));
        let gpu = EndpointSpec::gpu(0x10de, 0x2330, 80);
        let a = b.endpoint(Attach::Below(rp), 0, &gpu, None);
        let bridge = b.bridge(Attach::Below(rp), 0x8, 0x12d8, 0xe113, None, None);
        let nic = EndpointSpec::nic(0x15b3, 0x1021);
        let behind = b.endpoint(Attach::Below(bridge), 0, &nic, None);
        (Topology::from_record(&b.build()), a, behind)
    }

    #[test]
    fn a_bus_reset_reaches_below_a_bridge_on_the_gpus_bus() {
        let (topo, a, behind) = deep_host();
        assert_eq!(bus_reset_reaches(&topo, &a), vec![a, behind]);
        assert_eq!(
            choose(&topo, &a, ResetPolicy::Bus, &vm(&[a])),
            Err(ResetError::TakesOthers {
                gpu: a,
                others: behind.to_string()
            })
        );
    }

    #[test]
    fn a_bus_reset_must_stay_inside_the_vm() {
        let (topo, a, b, nic) = host();
        assert_eq!(
            choose(&topo, &a, ResetPolicy::Bus, &vm(&[a])),
            Ok(ResetChoice::Only("bus"))
        );
        let e = choose(&topo, &b, ResetPolicy::Bus, &vm(&[b])).unwrap_err();
        assert_eq!(
            e,
            ResetError::TakesOthers {
                gpu: b,
                others: nic.to_string()
            }
        );
        assert_eq!(
            choose(&topo, &b, ResetPolicy::Bus, &vm(&[b, nic])),
            Ok(ResetChoice::Only("bus"))
        );
    }
}
