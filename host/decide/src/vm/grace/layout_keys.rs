//! The layout keys of vm.yaml (and `--guest-topology`) that a Grace guest does not take:
//! said as warnings where the operator gave them, with where and what the guest gets.

use crate::grace_guest::{GraceGuest, SmmuForm, GI_NODES_PER_GPU};
use crate::guest_layout::GuestLayout;
use crate::vm::spec::VmSpec;
use crate::vm::VmTarget;

/// `guest_topology` and `guest_numa` where the operator gave them (vm.yaml, said with where;
/// `--guest-topology`), never their defaults: a Grace guest's PCIe tree follows the host's
/// SMMUs and its NUMA nodes the GPUs' C2C memory (generic initiators), so neither applies;
/// each warning says what the guest gets instead.
pub(super) fn x86_layout_keys(spec: &VmSpec, layout: &GuestLayout, g: &GraceGuest) -> Vec<String> {
    let config = &spec.config;
    let mut said = Vec::new();
    let topology = match (spec.flags.guest_topology, config.guest_topology_at) {
        (Some(t), _) => Some(format!("--guest-topology {t}")),
        (None, Some(at)) => Some(format!(
            "{}guest_topology: {}",
            spec.at(Some(at)),
            config.guest_topology
        )),
        (None, None) => None,
    };
    if let Some(given) = topology {
        let tree = match (spec.flags.target, g.smmu_form) {
            (VmTarget::CloudHypervisor, _) => "each GPU on Cloud Hypervisor's root bus".to_string(),
            (_, SmmuForm::PerPhysical) => format!(
                "each GPU on a root port of its own, below a pxb-pcie with a vSMMU per physical SMMU ({} here)",
                g.smmus.len()
            ),
            (_, SmmuForm::MachineWide) => {
                "each GPU on a root port of its own on pcie.0, behind one SMMUv3 for the machine".to_string()
            }
        };
        said.push(format!("{given} does not apply to a Grace guest, whose PCIe tree follows the host's SMMUs: {tree}; guest_topology is for x86 guests, leave it out"));
    }
    if let Some(at) = config.guest_numa_at {
        said.push(format!(
            "{}guest_numa: {} does not apply to a Grace guest, whose NUMA nodes follow its GPUs' C2C memory: {} CPU node(s), one per host node the GPUs hang off, then {GI_NODES_PER_GPU} per GPU (its memory node and 7 generic-initiator companions), {} in all; guest_numa is for x86 guests, leave it out",
            spec.at(Some(at)),
            config.guest_numa,
            layout.numa_nodes.len(),
            g.node_count
        ));
    }
    said
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::vm::spec::{VmFlags, VmSpec};
    use crate::vm::{plan, Host, Said, VmInputs, VmTarget};
    use vfio_p2p_config::host::HostConfig;
    use vfio_p2p_config::vm::{GuestTopology, VmConfig};
    use vfio_p2p_model::fabric::Fabric;
    use vfio_p2p_model::vmm::OVERRIDE_SINCE;
    use vfio_p2p_model::Topology;
    use vfio_p2p_read::synth;

    /// The warnings `gen TARGET --config vm.yaml` (with `yaml`) says on `example`.
    fn warnings(example: &str, yaml: &str, flags: VmFlags) -> Vec<String> {
        let topo = Topology::from_record(&synth::example(example).unwrap());
        let config = VmConfig::parse(yaml, Path::new("vm.yaml")).unwrap();
        let flags = VmFlags {
            config_path: Some("vm.yaml".into()),
            ..flags
        };
        let spec = VmSpec::apply(config, flags).unwrap();
        let (fabric, host) = (Fabric::default(), HostConfig::default());
        let inputs = VmInputs {
            host: Host {
                topo: &topo,
                fabric: &fabric,
                config: &host,
            },
            iommu: None,
            qemu_version: None,
            libvirt_version: Ok(OVERRIDE_SINCE),
            incus: None,
        };
        let mut said = Vec::new();
        plan(&inputs, &spec, &mut |s| said.push(s)).unwrap();
        said.into_iter()
            .filter_map(|s| match s {
                Said::Warning(w) => Some(w),
                Said::Note(_) => None,
            })
            .collect()
    }

    fn about<'a>(said: &'a [String], key: &str) -> Vec<&'a String> {
        let needle = format!("{key} is for x86 guests");
        said.iter().filter(|w| w.contains(&needle)).collect()
    }

    #[test]
    fn layout_keys_given_in_vm_yaml_are_said_with_where_they_stand() {
        let yaml = "name: g1\nguest_topology: flat\nguest_numa: true\n";
        let said = warnings("gb200", yaml, VmFlags::new(VmTarget::Qemu));
        let topology = about(&said, "guest_topology");
        assert_eq!(topology.len(), 1, "{said:?}");
        assert!(
            topology[0]
                .starts_with("vm.yaml:2:17: guest_topology: flat does not apply to a Grace guest"),
            "{}",
            topology[0]
        );
        assert!(
            topology[0].contains("a vSMMU per physical SMMU (4 here)"),
            "{}",
            topology[0]
        );
        let numa = about(&said, "guest_numa");
        assert_eq!(numa.len(), 1, "{said:?}");
        assert!(
            numa[0].starts_with("vm.yaml:3:13: guest_numa: true does not apply to a Grace guest"),
            "{}",
            numa[0]
        );
        assert!(
            numa[0].contains("2 CPU node(s)") && numa[0].contains("34 in all"),
            "{}",
            numa[0]
        );
    }

    #[test]
    fn the_flag_is_said_as_the_flag_and_defaults_are_not_said() {
        let mut flags = VmFlags::new(VmTarget::Libvirt);
        flags.guest_topology = Some(GuestTopology::Mirror);
        let said = warnings("gh200", "name: g1\n", flags);
        let topology = about(&said, "guest_topology");
        assert_eq!(topology.len(), 1, "{said:?}");
        assert!(
            topology[0].starts_with("--guest-topology mirror does not apply"),
            "{}",
            topology[0]
        );
        assert!(about(&said, "guest_numa").is_empty(), "{said:?}");
        // nothing given: nothing said
        let said = warnings("gh200", "name: g1\n", VmFlags::new(VmTarget::Qemu));
        assert!(about(&said, "guest_topology").is_empty(), "{said:?}");
        assert!(about(&said, "guest_numa").is_empty(), "{said:?}");
        // an x86 guest takes both keys: nothing said there
        let yaml = "name: g1\nguest_topology: mirror\nguest_numa: true\n";
        let said = warnings("dual-socket-pcie", yaml, VmFlags::new(VmTarget::Qemu));
        assert!(about(&said, "guest_topology").is_empty(), "{said:?}");
        assert!(about(&said, "guest_numa").is_empty(), "{said:?}");
    }
}
