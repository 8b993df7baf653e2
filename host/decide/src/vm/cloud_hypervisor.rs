//! What a VM is under Cloud Hypervisor, decided here and nowhere else: where CH puts
//! each passed device ([`layout`], from `decide::cloud_hypervisor`'s root bus), and what
//! it refuses or warns of ([`check`]: the home of every CH rule about a laid-out VM).
//! `emit::cloud_hypervisor` only renders the result.

use anyhow::Context as _;

use super::spec::VmSpec;
use super::{Said, Say};
use crate::guest_layout::GuestLayout;
use crate::{clique_offset, cloud_hypervisor as ch};
use vfio_p2p_config::vm::{IommuBackend, VmConfig};
use vfio_p2p_model::Topology;

/// `layout`'s devices on CH's root bus, numbered as CH creates them.
pub fn layout(config: &VmConfig, layout: &GuestLayout) -> anyhow::Result<GuestLayout> {
    ch::guest_layout(config, layout)
        .with_context(|| format!("laying out {} for Cloud Hypervisor", config.name))
}

/// CH's rules for the VM laid out: cliques under iommufd and the devices CH cannot take
/// are refused at vm.yaml's line; a clique capability whose offset CH has taken is
/// refused, a GPU whose config space could not be read warned of. (A VM that boots
/// nothing is refused earlier, with the boot keys: `vm_boot::refusal`.)
pub fn check(
    spec: &VmSpec,
    topo: &Topology,
    layout: &GuestLayout,
    backend: IommuBackend,
    say: Say,
) -> anyhow::Result<()> {
    ch::refusal(&spec.config, layout, backend).map_err(|r| spec.refused(r))?;
    for w in clique_offset::cloud_hypervisor(topo, layout)? {
        say(Said::Warning(w));
    }
    Ok(())
}
