//! What an Incus VM gets of the plan: how its cliques reach QEMU (the device key where
//! the server has the API extension, `raw.qemu.conf` where it has not), and what vm.yaml
//! asks that a profile cannot give.

use super::{IncusApi, Said, Say};
use crate::address_space::GuestAddressSpace;
use vfio_p2p_config::vm::VmConfig;
use vfio_p2p_config::vm_devices::Network;

/// The device key of a physical GPU's clique, and the API extension that brings it.
pub const CLIQUE_KEY: &str = "nvidia.clique";
pub const CLIQUE_EXTENSION: &str = "gpu_physical_clique";

/// How the cliques reach QEMU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CliqueForm {
    /// The device key `nvidia.clique` (the server has `gpu_physical_clique`).
    DeviceKey,
    /// `raw.qemu.conf` sections (older servers).
    RawQemuConf,
}

/// The clique form for what the server answered (`None`: not asked), with its warnings:
/// the key, with a warning, where no server answers.
pub fn clique_form(server: Option<&Result<IncusApi, String>>, say: Say) -> CliqueForm {
    let info = match server {
        Some(Ok(i)) => i,
        Some(Err(why)) => return unanswered(why, say),
        None => return unanswered("not asked", say),
    };
    if info.api_extensions.iter().any(|e| e == CLIQUE_EXTENSION) {
        return CliqueForm::DeviceKey;
    }
    say(Said::Warning(format!(
        "Incus {} lacks API extension {} (no `{}` device key): the cliques go in raw.qemu.conf as {} properties of its QEMU devices; upgrade Incus (7.0.2 has it) to have them checked by Incus itself",
        info.server_version.as_deref().unwrap_or("(version unknown)"),
        CLIQUE_EXTENSION,
        CLIQUE_KEY,
        vfio_p2p_contract::CLIQUE_PROPERTY
    )));
    CliqueForm::RawQemuConf
}

fn unanswered(why: &str, say: Say) -> CliqueForm {
    say(Said::Warning(format!(
        "{why}; writing `{CLIQUE_KEY}`, which needs Incus API extension {CLIQUE_EXTENSION} (Incus 7.0.2 has it): on an older server use --incus-server with its `incus query /1.0`"
    )));
    CliqueForm::DeviceKey
}

/// What vm.yaml asks that a profile cannot give (Incus boots the instance's root disk from
/// its storage pool, has no user-mode networking, and its console is `incus console`), and
/// where RAM and window end above QEMU's default 40 bits, what keeps the host's width in
/// an Incus VM (its `-cpu host`, whose host-phys-bits QEMU turns on) and what loses it.
pub fn warnings(c: &VmConfig, space: &GuestAddressSpace, hole64: u64, say: Say) {
    if let Some(d) = c.devices.disks.first() {
        say(Said::Warning(format!(
            "gen incus writes no disks: Incus boots the instance's root disk from its storage pool; bring {} in with `incus-migrate` (or `incus import`), then add this profile",
            d.path.display()
        )));
    }
    if let Some(Network::User { .. }) = c.devices.network {
        say(Said::Warning("Incus has no user-mode networking: the VM keeps the NIC its other profiles give (the default profile's eth0 on incusbr0); use `network: {bridge: NAME}` for a host bridge".into()));
    }
    if space.fits_qemu_default {
        return;
    }
    say(Said::Warning(format!(
        "{} MiB of RAM and the {} GiB 64-bit window end above QEMU's default 40 bits: Incus starts the VM with \
         `-cpu host`, which has the host's width, but in a cluster a VM with migration.stateful=true gets kvm64 \
         and 40 bits, and loses its GPUs (leave migration.stateful off); Incus also reserves memory hotplug room \
         between RAM and window (limits.memory.hotplug, the host's memory by default): set it to false or check \
         the sum with `vfio-p2p check --memory-gib`",
        c.memory_mib,
        hole64.div_ceil(1 << 30)
    )));
}
