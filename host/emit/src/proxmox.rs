//! Proxmox VE VM configuration lines (`/etc/pve/qemu-server/VMID.conf`) for the planned
//! GPUs: one `hostpciN:` per GPU function and one `args:` line that sets the cliques.
//!
//! Proxmox's documented syntax (pve-docs `qm.conf(5)`, "Configuration File Format", and the
//! `hostpci[n]` option of qemu-server's `PVE/QemuServer/PCI.pm`):
//! - `OPTION: value` per line; lines starting with `#` are comments.
//! - `hostpci[n]: [[host=]<HOSTPCIID[;HOSTPCIID2...]>][,pcie=<1|0>][,rombar=…][,x-vga=<1|0>]…`,
//!   n in 0..=15. qemu-server names the `vfio-pci` device `hostpciN` when the entry holds
//!   one function, and `hostpciN.J` when it holds several (an id without `.F` takes every
//!   function of the slot). So each entry here names exactly one function, `.0` included.
//! - `pcie=1` puts the device behind a PCIe root port (needs `machine: q35`).
//! - `x-vga=1` makes qemu-server add `kvm=off` (the hypervisor is hidden) and `cpu: …,hidden=1`
//!   hides it too: with a hidden hypervisor the NVIDIA driver ignores the clique, so neither
//!   is ever written.
//! - `args:` is passed to QEMU as extra arguments (split like a shell line), where
//!   `-set device.hostpciN.x-nv-gpudirect-clique=K` reaches the device qemu-server made.

use super::qemu::shell_quote;
use super::vm::VmDefinition;
use vfio_p2p_config::vm_boot::Firmware;
use vfio_p2p_config::vm_devices::{Console, DiskBus, Network};
use vfio_p2p_contract::CLIQUE_PROPERTY;
use vfio_p2p_decide::mmio;

/// The QEMU device id qemu-server gives the single-function entry `hostpciN`.
pub fn hostpci_id(index: usize) -> String {
    format!("hostpci{index}")
}

/// The configuration lines (what qemu-server cannot take was refused before:
/// `decide::proxmox::refusal`).
pub fn config(vm: &VmDefinition) -> String {
    let mut functions = Vec::new();
    for g in vm.layout.passed() {
        functions.push((g.host, g.clique, true));
        functions.extend(g.other_functions.iter().map(|f| (f.host, None, false)));
    }
    let c = vm.config;
    let mut out = format!(
        "# vfio-p2p gen proxmox: merge into /etc/pve/qemu-server/VMID.conf of VM '{}'\n\
         # (replace its hostpciN and args lines; the VM must be stopped and started again).\n\
         # Never add x-vga=1 or cpu hidden=1: a hidden hypervisor makes the driver ignore the cliques.\n",
        c.name
    );
    // phys-bits=host: qemu-server writes `-cpu host,…,host-phys-bits=true` (CPUConfig.pm)
    out.push_str("machine: q35\ncpu: host,phys-bits=host\n");
    if c.firmware == Firmware::Uefi {
        out.push_str("bios: ovmf\n");
    }
    let mut args = Vec::new();
    for (i, (host, clique, is_gpu)) in functions.iter().enumerate() {
        out.push_str(&format!("hostpci{i}: {host},pcie=1\n"));
        if let (Some(k), true) = (clique, is_gpu) {
            args.push("-set".to_string());
            args.push(format!("device.{}.{CLIQUE_PROPERTY}={k}", hostpci_id(i)));
        }
    }
    args.push("-global".into());
    args.push(format!("q35-pcihost.pci-hole64-size={}G", vm.hole64_gib()));
    if c.firmware == Firmware::Uefi {
        args.push("-fw_cfg".into());
        args.push(format!(
            "name=opt/ovmf/X-PciMmio64Mb,string={}",
            mmio::ovmf_mmio64_mb(vm.hole64)
        ));
    }
    let line: Vec<String> = args.iter().map(|a| shell_quote(a)).collect();
    out.push_str(&format!("args: {}\n", line.join(" ")));
    guest_io(vm, &mut out);
    out
}

/// vm.yaml's disks (by absolute path, which qemu-server takes from root; the first boots),
/// the NIC (`net0`: a bridge, or Proxmox's user-mode NAT without one) and the serial console
/// (`qm terminal VMID`; qemu-server picks the socket's path).
fn guest_io(vm: &VmDefinition, out: &mut String) {
    let c = vm.config;
    let (mut virtio, mut sata) = (0, 0);
    let mut boot = None;
    for d in &c.devices.disks {
        let path = d.path.display().to_string();
        let key = match d.bus {
            DiskBus::Virtio => format!("virtio{virtio}"),
            DiskBus::Sata => format!("sata{sata}"),
        };
        match d.bus {
            DiskBus::Virtio => virtio += 1,
            DiskBus::Sata => sata += 1,
        }
        let ro = if d.readonly { ",ro=1" } else { "" };
        out.push_str(&format!("{key}: {path},format={}{ro}\n", d.format.as_str()));
        boot.get_or_insert(key);
    }
    if let Some(key) = boot {
        out.push_str(&format!("boot: order={key}\n"));
    }
    if let Some(n) = &c.devices.network {
        let mut line = String::from("net0: model=virtio");
        if let Network::Bridge { bridge, .. } = n {
            line.push_str(&format!(",bridge={bridge}"));
        }
        if let Some(mac) = n.mac() {
            line.push_str(&format!(",macaddr={}", mac.to_ascii_uppercase()));
        }
        out.push_str(&line);
        out.push('\n');
    }
    if c.devices.console != Console::None {
        out.push_str("serial0: socket\n");
    }
}
