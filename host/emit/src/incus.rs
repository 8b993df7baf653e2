//! Incus: the planned GPUs, their cliques, the NICs and the NUMA placement of a VM as an
//! Incus profile (YAML for `incus profile edit`) or as `incus config` commands.
//!
//! What Incus expresses (lxc/incus `internal/server/device/gpu_physical.go`, `driver_qemu.go`,
//! `internal/instance/config.go`):
//! - a GPU is `type: gpu`, `gputype: physical`, `pci: DDDD:BB:DD.F`; Incus passes it with
//!   `vfio-pci` as QEMU device `dev-incus_NAME` and adds the other functions of its slot
//!   (audio) from its IOMMU group itself, so only the GPU function is named;
//! - `nvidia.clique: K` (API extension `gpu_physical_clique`, Incus 7.0.2) is its GPUDirect
//!   clique; a server without it takes the property through `raw.qemu.conf`, a
//!   `[device "dev-incus_NAME"]` section of the QEMU config file Incus writes;
//! - a NIC or VF is `type: pci`, `address:`;
//! - `limits.cpu` (vCPUs), `limits.memory`, `limits.cpu.nodes` (the host NUMA nodes that
//!   hold the vCPUs and the memory): Incus lays out the guest's PCIe tree itself (one root
//!   port per device) and has no key for guest NUMA nodes with devices in them;
//! - `raw.qemu` carries the 64-bit MMIO window (`-global q35-pcihost.pci-hole64-size=`,
//!   OVMF's `X-PciMmio64Mb`: Incus VMs always boot OVMF).

use std::fmt::Write as _;

use clap::ValueEnum;

use super::vm::VmDefinition;
use vfio_p2p_config::vm_devices::Network;
use vfio_p2p_contract::CLIQUE_PROPERTY;
use vfio_p2p_decide::guest_layout::GuestDevice;
use vfio_p2p_decide::mmio;
use vfio_p2p_decide::vm::incus::{CliqueForm, CLIQUE_KEY};

/// Incus names the QEMU device of instance device NAME `dev-incus_NAME`.
pub const QEMU_DEVICE_PREFIX: &str = "dev-incus_";

/// What `gen incus` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum IncusOutput {
    /// A profile for `incus profile edit NAME < FILE`.
    #[default]
    Profile,
    /// `incus config device add` / `incus config set` commands for the instance.
    Commands,
}

/// One Incus device: its name and keys in the order they are written.
struct Device {
    name: String,
    keys: Vec<(&'static str, String)>,
}

fn devices(vm: &VmDefinition, form: CliqueForm) -> Vec<Device> {
    let gpu = |g: &GuestDevice| {
        let mut keys = vec![
            ("type", "gpu".to_string()),
            ("gputype", "physical".to_string()),
            ("pci", g.host.to_string()),
        ];
        if let (Some(k), CliqueForm::DeviceKey) = (g.clique, form) {
            keys.push((CLIQUE_KEY, k.to_string()));
        }
        Device {
            name: g.id.clone(),
            keys,
        }
    };
    let nic = |n: &GuestDevice| Device {
        name: n.id.clone(),
        keys: vec![("type", "pci".to_string()), ("address", n.host.to_string())],
    };
    let mut list: Vec<Device> = vm
        .layout
        .gpus
        .iter()
        .map(gpu)
        .chain(vm.layout.nics.iter().map(nic))
        .collect();
    // vm.yaml's network: a bridged NIC named like the default profile's, which it replaces
    if let Some(n @ Network::Bridge { bridge, .. }) = &vm.config.devices.network {
        let mut keys = vec![
            ("type", "nic".to_string()),
            ("nictype", "bridged".to_string()),
            ("parent", bridge.clone()),
        ];
        if let Some(mac) = n.mac() {
            keys.push(("hwaddr", mac.to_string()));
        }
        list.push(Device {
            name: "eth0".into(),
            keys,
        });
    }
    list
}

/// Instance keys: vCPUs, memory, host NUMA nodes, the 64-bit window, and the cliques'
/// `raw.qemu.conf` when the server lacks the device key.
fn config_keys(vm: &VmDefinition, form: CliqueForm) -> Vec<(&'static str, String)> {
    let c = vm.config;
    let mut keys = vec![
        ("limits.cpu", c.vcpus.to_string()),
        ("limits.memory", format!("{}MiB", c.memory_mib)),
    ];
    let mut nodes: Vec<u32> = vm
        .layout
        .passed()
        .filter_map(|d| d.host_numa_node)
        .collect();
    nodes.sort_unstable();
    nodes.dedup();
    if !nodes.is_empty() {
        let list: Vec<String> = nodes.iter().map(u32::to_string).collect();
        keys.push(("limits.cpu.nodes", list.join(",")));
    }
    keys.push((
        "raw.qemu",
        format!(
            "-global q35-pcihost.pci-hole64-size={}G -fw_cfg name=opt/ovmf/X-PciMmio64Mb,string={}",
            vm.hole64_gib(),
            mmio::ovmf_mmio64_mb(vm.hole64)
        ),
    ));
    if form == CliqueForm::RawQemuConf {
        let mut conf = String::new();
        for g in &vm.layout.gpus {
            if let Some(k) = g.clique {
                let _ = writeln!(
                    conf,
                    "[device \"{QEMU_DEVICE_PREFIX}{}\"]\n{CLIQUE_PROPERTY} = \"{k}\"",
                    g.id
                );
            }
        }
        if !conf.is_empty() {
            keys.push(("raw.qemu.conf", conf));
        }
    }
    keys
}

/// A YAML double-quoted scalar.
fn yaml_str(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The profile, for `incus profile create NAME && incus profile edit NAME < FILE`.
pub fn profile(vm: &VmDefinition, form: CliqueForm) -> String {
    let name = &vm.config.name;
    let mut out = format!(
        "# vfio-p2p gen incus: profile for VM '{name}'\n\
         #   incus profile create vfio-p2p-{name} && incus profile edit vfio-p2p-{name} < THIS_FILE\n\
         #   incus profile add {name} vfio-p2p-{name}    (the VM stopped; then incus start {name})\n\
         # Never add raw.qemu -cpu ...,kvm=off: a hidden hypervisor makes the driver ignore the cliques.\n"
    );
    let _ = writeln!(
        out,
        "description: {}\nconfig:",
        yaml_str(&format!("vfio-p2p: GPUs with P2P cliques for {name}"))
    );
    for (k, v) in config_keys(vm, form) {
        let _ = writeln!(out, "  {k}: {}", yaml_str(&v));
    }
    out.push_str("devices:\n");
    for d in devices(vm, form) {
        let _ = writeln!(out, "  {}:", d.name);
        for (k, v) in d.keys {
            let _ = writeln!(out, "    {k}: {}", yaml_str(&v));
        }
    }
    out
}

/// The same as commands on the instance itself.
pub fn commands(vm: &VmDefinition, form: CliqueForm) -> String {
    let name = super::qemu::shell_quote(&vm.config.name);
    let mut out =
        format!("# vfio-p2p gen incus: for VM {name} (stopped); then incus start {name}\n");
    for (k, v) in config_keys(vm, form) {
        let _ = writeln!(
            out,
            "incus config set {name} {k}={}",
            super::qemu::shell_quote(&v)
        );
    }
    for d in devices(vm, form) {
        let mut line = format!("incus config device add {name} {}", d.name);
        for (k, v) in &d.keys {
            match *k {
                "type" => {
                    let _ = write!(line, " {v}");
                }
                _ => {
                    let _ = write!(line, " {k}={}", super::qemu::shell_quote(v));
                }
            }
        }
        out.push_str(&line);
        out.push('\n');
    }
    out
}
