//! libvirt domain XML: the same VM as [`super::qemu`], as a complete q35 `<domain>`.
//!
//! libvirt has no element for the clique: since 8.2 it goes in `<qemu:override>` on the
//! hostdev's user alias (`ua-…`); older libvirt only has `<qemu:commandline>` `-set`,
//! which stops working once libvirt passes `-device` as JSON (QEMU ≥ 6.2).

use std::fmt::Write;

use pci_config::Bdf;
use quick_xml::escape::escape;

use super::vm::{cpulist, disk_places, VmDefinition, FIRST_DISK_SLOT, IOMMUFD_OBJECT_ID, NIC_SLOT};
use vfio_p2p_config::vm::IommuBackend;
use vfio_p2p_config::vm_boot::Firmware;
use vfio_p2p_config::vm_devices::{Console, DiskBus, Network};
use vfio_p2p_decide::guest_layout::{GuestBridge, GuestBridgeKind, GuestGpu, ROOT_BUS};

use vfio_p2p_contract::CLIQUE_PROPERTY;
use vfio_p2p_model::domain::QEMU_NS;
use vfio_p2p_model::vmm::LibvirtVersion;

use vfio_p2p_decide::vm::libvirt::HOST_PHYS_BITS_GLOBAL;

/// The vsock device of `verify: vsock`, on pcie.0 at a fixed slot below the layout's
/// (otherwise libvirt adds a root port for it).
pub(crate) fn write_vsock(w: &mut String, vm: &VmDefinition) {
    if let Some(r) = vm.config.report {
        let _ = writeln!(
            w,
            "    <vsock model='virtio'>\n      <cid auto='no' address='{}'/>\n      {}\n    </vsock>",
            r.cid,
            pci_address(&Bdf::new(0, 0, VSOCK_SLOT, 0), Some(0), "")
        );
    }
}

/// The hostdev's user alias.
pub fn alias_for(id: &str) -> String {
    format!("ua-{id}")
}

/// `<qemu:device>` entries for `(alias, clique)` pairs, indented for `<qemu:override>`.
pub fn override_devices(entries: &[(String, u8)], indent: &str) -> String {
    let mut s = String::new();
    for (alias, clique) in entries {
        let _ = write!(
            s,
            "{indent}<qemu:device alias='{}'>\n{indent}  <qemu:frontend>\n{indent}    {}\n{indent}  </qemu:frontend>\n{indent}</qemu:device>\n",
            escape(alias.as_str()),
            clique_property(*clique)
        );
    }
    s
}

pub fn clique_property(clique: u8) -> String {
    format!("<qemu:property name='{CLIQUE_PROPERTY}' type='unsigned' value='{clique}'/>")
}

/// `<qemu:arg>` pairs setting the cliques the pre-8.2 way.
pub fn set_args(entries: &[(String, u8)]) -> Vec<String> {
    entries
        .iter()
        .flat_map(|(alias, c)| {
            [
                "-set".to_string(),
                format!("device.{alias}.{CLIQUE_PROPERTY}={c}"),
            ]
        })
        .collect()
}

/// `<address type='pci' …/>` of a guest function (`bus` is the parent controller's index).
pub fn pci_address(bdf: &Bdf, bus: Option<u32>, extra: &str) -> String {
    format!(
        "<address type='pci' domain='{:#06x}' bus='{:#04x}' slot='{:#04x}' function='{:#x}'{extra}/>",
        bdf.domain,
        bus.unwrap_or(u32::from(bdf.bus)),
        bdf.device,
        bdf.function
    )
}

/// `<address …/>` of a host function inside `<source>` (no `type` there).
pub fn host_address(bdf: &Bdf) -> String {
    format!(
        "<address domain='{:#06x}' bus='{:#04x}' slot='{:#04x}' function='{:#x}'/>",
        bdf.domain, bdf.bus, bdf.device, bdf.function
    )
}

/// The domain XML.
/// The pcie.0 slot of the vsock device (the layouts use 0x08 and up).
pub const VSOCK_SLOT: u8 = 0x07;

pub fn domain(vm: &VmDefinition, version: LibvirtVersion) -> String {
    let mut x = String::new();
    let w = &mut x;
    let _ = writeln!(w, "<domain type='kvm' xmlns:qemu='{QEMU_NS}'>");
    write_machine(w, vm);
    write_numa_tune(w, vm);
    write_cpu(w, vm, version);
    let _ = writeln!(w, "  <devices>");
    write_root_bus(w, vm);
    write_bridges(w, vm);
    let native_iommufd = vm.iommu_backend == IommuBackend::Iommufd && version.has_iommufd();
    for g in vm.layout.passed() {
        write_hostdevs(w, g, controller_index(vm, &g.parent), native_iommufd, None);
    }
    write_vsock(w, vm);
    write_guest_io(w, vm);
    let _ = writeln!(w, "    <memballoon model='none'/>");
    let _ = writeln!(w, "  </devices>");
    write_qemu_elements(w, vm, version);
    let _ = writeln!(w, "</domain>");
    x
}

/// The disks (the first with boot order 1), the NIC and the serial console of vm.yaml;
/// virtio devices at fixed pcie.0 slots below the layout's, as libvirt would otherwise add a
/// root port for each.
fn write_guest_io(w: &mut String, vm: &VmDefinition) {
    write_disks_and_nic(w, vm);
    // `virsh console NAME` reaches the guest's ttyS0
    write_console(
        w,
        vm,
        "<target type='isa-serial' port='0'>\n        <model name='isa-serial'/>\n      </target>",
    );
}

/// The disks and the NIC of vm.yaml (see [`write_guest_io`]).
pub(crate) fn write_disks_and_nic(w: &mut String, vm: &VmDefinition) {
    let c = vm.config;
    for (i, (d, at, boots)) in disk_places(&c.devices.disks).into_iter().enumerate() {
        let path = escape(d.path.to_str().unwrap_or_default()).into_owned();
        let (kind, source) = if d.is_block_device() {
            ("block", format!("<source dev='{path}'/>"))
        } else {
            ("file", format!("<source file='{path}'/>"))
        };
        let _ = writeln!(
            w,
            "    <disk type='{kind}' device='disk'>\n      <driver name='qemu' type='{}'/>\n      {source}",
            d.format.as_str()
        );
        let (target, address) = match d.bus {
            DiskBus::Virtio => (
                format!(
                    "<target dev='vd{}' bus='virtio'/>",
                    char::from(b'a' + at - FIRST_DISK_SLOT)
                ),
                pci_address(&Bdf::new(0, 0, at, 0), Some(0), ""),
            ),
            DiskBus::Sata => (
                format!("<target dev='sd{}' bus='sata'/>", char::from(b'a' + at)),
                format!("<address type='drive' controller='0' bus='0' target='0' unit='{at}'/>"),
            ),
        };
        let _ = writeln!(w, "      {target}");
        if boots {
            let _ = writeln!(w, "      <boot order='1'/>");
        }
        if d.readonly {
            let _ = writeln!(w, "      <readonly/>");
        }
        let _ = writeln!(
            w,
            "      <alias name='ua-disk{i}'/>\n      {address}\n    </disk>"
        );
    }
    if let Some(n) = &c.devices.network {
        match n {
            Network::User { .. } => {
                let _ = writeln!(w, "    <interface type='user'>");
            }
            Network::Bridge { bridge, .. } => {
                let _ = writeln!(
                    w,
                    "    <interface type='bridge'>\n      <source bridge='{}'/>",
                    escape(bridge.as_str())
                );
            }
        }
        if let Some(mac) = n.mac() {
            let _ = writeln!(w, "      <mac address='{mac}'/>");
        }
        let _ = writeln!(
            w,
            "      <model type='virtio'/>\n      <alias name='ua-nic0'/>\n      {}\n    </interface>",
            pci_address(&Bdf::new(0, 0, NIC_SLOT, 0), Some(0), "")
        );
    }
}

/// vm.yaml's console as a `<serial>` with `target` (the machine's serial port model) and
/// its `<console>`.
pub(crate) fn write_console(w: &mut String, vm: &VmDefinition, target: &str) {
    let c = vm.config;
    let (kind, source) = match &c.devices.console {
        Console::None => return,
        Console::Serial => ("pty", String::new()),
        Console::Socket(_) => {
            let path = c.devices.console.socket_path(&c.name).unwrap_or_default();
            (
                "unix",
                format!(
                    "\n      <source mode='bind' path='{}'/>",
                    escape(path.to_str().unwrap_or_default())
                ),
            )
        }
    };
    let _ = writeln!(
        w,
        "    <serial type='{kind}'>{source}\n      {target}\n    </serial>"
    );
    let _ = writeln!(
        w,
        "    <console type='{kind}'>{source}\n      <target type='serial' port='0'/>\n    </console>"
    );
}

/// Name, memory, vCPUs, firmware and features.
fn write_machine(w: &mut String, vm: &VmDefinition) {
    let c = vm.config;
    let _ = writeln!(w, "  <name>{}</name>", escape(c.name.as_str()));
    let _ = writeln!(w, "  <memory unit='MiB'>{}</memory>", c.memory_mib);
    let _ = writeln!(w, "  <vcpu placement='static'>{}</vcpu>", c.vcpus);
    let _ = writeln!(w, "  <os>");
    let _ = writeln!(w, "    <type arch='x86_64' machine='q35'>hvm</type>");
    if c.firmware == Firmware::Uefi {
        let _ = writeln!(
            w,
            "    <loader readonly='yes' type='pflash'>{}</loader>",
            escape(c.ovmf_code.display().to_string().as_str())
        );
        // libvirt copies the template to the VM's nvram file: vm.yaml's copy when named
        match (&c.ovmf_vars, &c.boot.ovmf_vars_copy) {
            (Some(vars), Some(copy)) => {
                let _ = writeln!(
                    w,
                    "    <nvram template='{}'>{}</nvram>",
                    escape(vars.display().to_string().as_str()),
                    escape(copy.display().to_string().as_str())
                );
            }
            (Some(vars), None) => {
                let _ = writeln!(
                    w,
                    "    <nvram template='{}'/>",
                    escape(vars.display().to_string().as_str())
                );
            }
            _ => {}
        }
    }
    let _ = writeln!(w, "  </os>");
    let _ = writeln!(w, "  <features>\n    <acpi/>\n    <apic/>\n  </features>");
}

/// With guest NUMA nodes: each node's vCPUs pinned to its host node's CPUs, and its
/// memory bound to that host node (`strict`: QEMU's `policy=bind`).
pub(crate) fn write_numa_tune(w: &mut String, vm: &VmDefinition) {
    let nodes = &vm.layout.numa_nodes;
    if nodes.is_empty() {
        return;
    }
    let pins: Vec<(u32, &str)> = nodes
        .iter()
        .enumerate()
        .filter_map(|(i, n)| Some((i, n.host_cpus.as_deref()?)))
        .flat_map(|(i, cpus)| vm.numa_share(i).0.map(move |v| (v, cpus)))
        .collect();
    if !pins.is_empty() {
        let _ = writeln!(w, "  <cputune>");
        for (vcpu, cpus) in pins {
            let _ = writeln!(w, "    <vcpupin vcpu='{vcpu}' cpuset='{}'/>", escape(cpus));
        }
        let _ = writeln!(w, "  </cputune>");
    }
    let host_nodes: Vec<String> = nodes.iter().map(|n| n.host_node.to_string()).collect();
    let _ = writeln!(
        w,
        "  <numatune>\n    <memory mode='strict' nodeset='{}'/>",
        host_nodes.join(",")
    );
    for n in nodes {
        let _ = writeln!(
            w,
            "    <memnode cellid='{}' mode='strict' nodeset='{}'/>",
            n.id, n.host_node
        );
    }
    let _ = writeln!(w, "  </numatune>");
}

/// host-passthrough keeps the hypervisor CPUID bit: the driver reads the clique only then.
/// `<maxphysaddr mode='passthrough'/>` (libvirt ≥ 8.7) gives the guest the host's width
/// (`host-phys-bits=on`). With guest NUMA nodes, one cell each.
fn write_cpu(w: &mut String, vm: &VmDefinition, version: LibvirtVersion) {
    let l = vm.layout;
    if l.numa_nodes.is_empty() && !version.has_maxphysaddr() {
        let _ = writeln!(w, "  <cpu mode='host-passthrough'/>");
        return;
    }
    let _ = writeln!(w, "  <cpu mode='host-passthrough'>");
    if version.has_maxphysaddr() {
        let _ = writeln!(w, "    <maxphysaddr mode='passthrough'/>");
    }
    if !l.numa_nodes.is_empty() {
        let _ = writeln!(w, "    <numa>");
        for (i, n) in l.numa_nodes.iter().enumerate() {
            let (cpus, mem) = vm.numa_share(i);
            let _ = writeln!(
                w,
                "      <cell id='{}' cpus='{}' memory='{mem}' unit='MiB'/>",
                n.id,
                cpulist(&cpus)
            );
        }
        let _ = writeln!(w, "    </numa>");
    }
    let _ = writeln!(w, "  </cpu>");
}

/// pcie.0 with the 64-bit hole; no automatic USB controller or balloon: they would add
/// root ports before ours.
fn write_root_bus(w: &mut String, vm: &VmDefinition) {
    let _ = writeln!(w, "    <controller type='usb' model='none'/>");
    let _ = writeln!(w, "    <controller type='pci' index='0' model='pcie-root'>");
    let _ = writeln!(
        w,
        "      <pcihole64 unit='KiB'>{}</pcihole64>",
        vm.hole64.div_ceil(1024)
    );
    let _ = writeln!(w, "    </controller>");
}

/// libvirt's controller index is its bus name; children refer to the parent's index.
pub(crate) fn controller_index(vm: &VmDefinition, id: &str) -> u32 {
    if id == ROOT_BUS {
        return 0;
    }
    vm.layout
        .bridges
        .iter()
        .position(|b| b.id == id)
        .map_or(0, |p| p as u32 + 1)
}

/// One `<controller>` per guest bridge (expanders, root ports, switch ports).
pub(crate) fn write_bridges(w: &mut String, vm: &VmDefinition) {
    for (i, b) in vm.layout.bridges.iter().enumerate() {
        let (model, name) = match b.kind {
            GuestBridgeKind::Expander { .. } => ("pcie-expander-bus", "pxb-pcie"),
            GuestBridgeKind::RootPort { .. } => ("pcie-root-port", "pcie-root-port"),
            GuestBridgeKind::SwitchUpstream => ("pcie-switch-upstream-port", "x3130-upstream"),
            GuestBridgeKind::SwitchDownstream { .. } => {
                ("pcie-switch-downstream-port", "xio3130-downstream")
            }
        };
        let _ = writeln!(
            w,
            "    <controller type='pci' index='{}' model='{model}'>\n      <model name='{name}'/>",
            i + 1
        );
        write_bridge_target(w, b);
        let _ = writeln!(w, "      <alias name='{}'/>", alias_for(&b.id));
        let _ = writeln!(
            w,
            "      {}\n    </controller>",
            pci_address(
                &Bdf::new(0, 0, b.slot, 0),
                Some(controller_index(vm, &b.parent)),
                ""
            )
        );
    }
}

fn write_bridge_target(w: &mut String, b: &GuestBridge) {
    match b.kind {
        GuestBridgeKind::Expander {
            numa_node: Some(n), ..
        } => {
            let _ = writeln!(
                w,
                "      <target busNr='{}'>\n        <node>{n}</node>\n      </target>",
                b.bus
            );
        }
        GuestBridgeKind::Expander {
            numa_node: None, ..
        } => {
            let _ = writeln!(w, "      <target busNr='{}'/>", b.bus);
        }
        GuestBridgeKind::RootPort { chassis, port }
        | GuestBridgeKind::SwitchDownstream { chassis, port } => {
            let _ = writeln!(w, "      <target chassis='{chassis}' port='{port:#x}'/>");
        }
        GuestBridgeKind::SwitchUpstream => {}
    }
}

/// The fw_cfg expectation (and OVMF's window) in `<qemu:commandline>`, and the cliques in
/// `<qemu:override>` (libvirt ≥ 8.2) or as `-set` arguments.
fn write_qemu_elements(w: &mut String, vm: &VmDefinition, version: LibvirtVersion) {
    let cliques = clique_entries(&vm.layout.gpus);
    let mut args: Vec<String> = vec!["-fw_cfg".into(), vm.fw_cfg_expectation()];
    if !version.has_maxphysaddr() {
        args.push("-global".into());
        args.push(HOST_PHYS_BITS_GLOBAL.into());
    }
    if vm.config.firmware == Firmware::Uefi {
        args.push("-fw_cfg".into());
        args.push(format!(
            "name=opt/ovmf/X-PciMmio64Mb,string={}",
            vfio_p2p_decide::mmio::ovmf_mmio64_mb(vm.hole64)
        ));
    }
    // libvirt without the iommufd backend: the same through QEMU's own options
    let iommufd_aliases = if vm.iommu_backend == IommuBackend::Iommufd && !version.has_iommufd() {
        args.push("-object".into());
        args.push(format!("iommufd,id={IOMMUFD_OBJECT_ID}"));
        hostdev_aliases(vm.layout.passed())
    } else {
        Vec::new()
    };
    if !version.has_override() {
        args.extend(set_args(&cliques));
        args.extend(iommufd_aliases.iter().flat_map(|a| {
            [
                "-set".to_string(),
                format!("device.{a}.iommufd={IOMMUFD_OBJECT_ID}"),
            ]
        }));
    }
    let _ = writeln!(w, "  <qemu:commandline>");
    for a in &args {
        let _ = writeln!(w, "    <qemu:arg value='{}'/>", escape(a.as_str()));
    }
    let _ = writeln!(w, "  </qemu:commandline>");
    if version.has_override() && (!cliques.is_empty() || !iommufd_aliases.is_empty()) {
        let _ = writeln!(w, "  <qemu:override>");
        if iommufd_aliases.is_empty() {
            w.push_str(&override_devices(&cliques, "    "));
        } else {
            w.push_str(&iommufd_override_devices(&iommufd_aliases, &cliques));
        }
        let _ = writeln!(w, "  </qemu:override>");
    }
}

/// Every hostdev's alias (all functions of every passed GPU and NIC).
pub(crate) fn hostdev_aliases<'a>(devices: impl Iterator<Item = &'a GuestGpu>) -> Vec<String> {
    devices
        .flat_map(|g| {
            std::iter::once(g.id.as_str()).chain(g.other_functions.iter().map(|f| f.id.as_str()))
        })
        .map(alias_for)
        .collect()
}

/// `<qemu:device>` entries naming the iommufd object on every hostdev, with the clique
/// on the GPUs that have one.
pub(crate) fn iommufd_override_devices(aliases: &[String], cliques: &[(String, u8)]) -> String {
    let mut s = String::new();
    for alias in aliases {
        let _ = writeln!(
            s,
            "    <qemu:device alias='{}'>\n      <qemu:frontend>\n        <qemu:property name='iommufd' type='string' value='{IOMMUFD_OBJECT_ID}'/>",
            escape(alias.as_str())
        );
        if let Some((_, c)) = cliques.iter().find(|(a, _)| a == alias) {
            let _ = writeln!(s, "        {}", clique_property(*c));
        }
        let _ = writeln!(s, "      </qemu:frontend>\n    </qemu:device>");
    }
    s
}

/// (alias, clique) of every GPU that has a clique.
pub fn clique_entries(gpus: &[GuestGpu]) -> Vec<(String, u8)> {
    gpus.iter()
        .filter_map(|g| g.clique.map(|c| (alias_for(&g.id), c)))
        .collect()
}

/// The hostdevs of a passed device's functions; `acpi`, an element the GPU's own function
/// carries after its source (a Grace GPU's `<acpi nodeset='…'/>`).
pub(crate) fn write_hostdevs(
    w: &mut String,
    g: &GuestGpu,
    bus_index: u32,
    iommufd: bool,
    acpi: Option<&str>,
) {
    let driver = if iommufd {
        "<driver name='vfio' iommufd='yes'/>"
    } else {
        "<driver name='vfio'/>"
    };
    let mut functions = vec![(g.host, g.guest, g.id.as_str())];
    functions.extend(
        g.other_functions
            .iter()
            .map(|f| (f.host, f.guest, f.id.as_str())),
    );
    functions.sort_by_key(|f| f.1);
    for (host, guest, id) in functions {
        let multi = if guest.function == 0 && g.multifunction() {
            " multifunction='on'"
        } else {
            ""
        };
        let acpi = match acpi {
            Some(a) if id == g.id => format!("\n      {a}"),
            _ => String::new(),
        };
        let _ = writeln!(
            w,
            "    <hostdev mode='subsystem' type='pci' managed='yes'>\n      {driver}\n      <source>\n        {}\n      </source>{acpi}\n      <alias name='{}'/>\n      {}\n    </hostdev>",
            host_address(&host),
            alias_for(id),
            pci_address(&guest, Some(bus_index), multi)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions() {
        let v: LibvirtVersion = "9.0.0".parse().unwrap();
        assert!(v.has_override());
        assert!(!"8.1".parse::<LibvirtVersion>().unwrap().has_override());
        assert!("8.2.0".parse::<LibvirtVersion>().unwrap().has_override());
        assert!("10.10.0".parse::<LibvirtVersion>().unwrap().has_override());
        assert!("nine".parse::<LibvirtVersion>().is_err());
        assert!("9".parse::<LibvirtVersion>().is_err());
        assert!("9.0.0.1".parse::<LibvirtVersion>().is_err());
        assert!("8.7".parse::<LibvirtVersion>().unwrap().has_maxphysaddr());
        assert!(!"8.6.0".parse::<LibvirtVersion>().unwrap().has_maxphysaddr());
    }
}
