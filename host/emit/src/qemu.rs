//! QEMU command line: q35, the guest PCIe tree of the layout, one `vfio-pci` per GPU
//! function with its clique, the 64-bit MMIO window and the fw_cfg expectation.
//!
//! Devices use QEMU's JSON `-device` syntax, which every QEMU since 6.0 takes and which
//! libvirt also uses, so the same properties work whichever way the VM is started.

use clap::ValueEnum;
use serde_json::{json, Value};

use super::vm::{cpulist, disk_places, VmDefinition, IOMMUFD_OBJECT_ID, NIC_SLOT};
use vfio_p2p_config::vm::IommuBackend;
use vfio_p2p_config::vm_boot::Firmware;
use vfio_p2p_config::vm_devices::{Console, DiskBus, Network};
use vfio_p2p_contract::CLIQUE_PROPERTY;
use vfio_p2p_decide::guest_layout::{GuestBridge, GuestBridgeKind, GuestGpu, ROOT_BUS};

pub const QEMU_BINARY: &str = "qemu-system-x86_64";

/// How `gen qemu` prints the command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum ArgvFormat {
    /// One argument per line.
    Argv,
    /// A shell command line, one option per line with `\` continuations.
    #[default]
    Shell,
    /// A JSON array of strings.
    Json,
}

/// A JSON object with keys in the given order (`driver` first reads best).
#[derive(Debug, Default)]
pub struct DeviceJson(Vec<(&'static str, Value)>);

impl DeviceJson {
    pub fn insert(&mut self, key: &'static str, value: Value) {
        self.0.push((key, value));
    }
}

impl std::fmt::Display for DeviceJson {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("{")?;
        for (i, (k, v)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{}:{v}", json!(k))?;
        }
        f.write_str("}")
    }
}

/// The `-device` JSON object of a guest bridge.
pub fn bridge_device(b: &GuestBridge) -> DeviceJson {
    let mut m = DeviceJson::default();
    let driver = match b.kind {
        GuestBridgeKind::Expander { .. } => "pxb-pcie",
        GuestBridgeKind::RootPort { .. } => "pcie-root-port",
        GuestBridgeKind::SwitchUpstream => "x3130-upstream",
        GuestBridgeKind::SwitchDownstream { .. } => "xio3130-downstream",
    };
    m.insert("driver", json!(driver));
    m.insert("id", json!(b.id));
    m.insert("bus", json!(b.parent));
    m.insert("addr", json!(format!("{:#x}", b.slot)));
    match b.kind {
        GuestBridgeKind::Expander { numa_node, .. } => {
            m.insert("bus_nr", json!(b.bus));
            if let Some(n) = numa_node {
                m.insert("numa_node", json!(n));
            }
        }
        GuestBridgeKind::RootPort { chassis, port } => {
            m.insert("chassis", json!(chassis));
            m.insert("port", json!(port));
            // GPUs need no I/O space; without this each port takes 4 KiB of the 64 KiB.
            m.insert("io-reserve", json!(0));
        }
        GuestBridgeKind::SwitchUpstream => {}
        GuestBridgeKind::SwitchDownstream { chassis, port } => {
            m.insert("chassis", json!(chassis));
            m.insert("slot", json!(0));
            m.insert("port", json!(port));
        }
    }
    m
}

/// The `-device` JSON objects of a passed device (GPU or NIC): its own `vfio-pci` then its other functions;
/// under iommufd each names the `-object iommufd` (`iommufd` given).
pub fn gpu_devices(g: &GuestGpu, iommufd: Option<&str>) -> Vec<DeviceJson> {
    let mut out = Vec::new();
    let mut functions: Vec<(pci_config::Bdf, pci_config::Bdf, &str, bool)> =
        vec![(g.host, g.guest, g.id.as_str(), true)];
    functions.extend(
        g.other_functions
            .iter()
            .map(|f| (f.host, f.guest, f.id.as_str(), false)),
    );
    functions.sort_by_key(|f| f.1);
    for (host, guest, id, is_gpu) in functions {
        let mut m = DeviceJson::default();
        m.insert("driver", json!("vfio-pci"));
        m.insert("host", json!(host.to_string()));
        m.insert("id", json!(id));
        m.insert("bus", json!(g.parent));
        m.insert(
            "addr",
            json!(format!("{:#x}.{:x}", guest.device, guest.function)),
        );
        if guest.function == 0 && g.multifunction() {
            m.insert("multifunction", json!(true));
        }
        if let Some(id) = iommufd {
            m.insert("iommufd", json!(id));
        }
        if is_gpu {
            if let Some(c) = g.clique {
                m.insert(CLIQUE_PROPERTY, json!(c));
            }
        }
        out.push(m);
    }
    out
}

/// The whole command line, program first.
pub fn argv(vm: &VmDefinition) -> Vec<String> {
    let c = vm.config;
    let mut a: Vec<String> = vec![QEMU_BINARY.into()];
    let mut opt = |k: &str, v: String| {
        a.push(k.into());
        a.push(v);
    };
    opt("-name", format!("{},debug-threads=on", c.name));
    opt("-machine", "q35,accel=kvm,kernel-irqchip=on".into());
    // The hypervisor must stay visible (no kvm=off): the driver reads the clique only then.
    // The host's physical address width, not QEMU's default 40 bits: OVMF then places the
    // 64-bit window where the guest can address it (docs/gen.md, "Address space").
    opt("-cpu", "host,host-phys-bits=on".into());
    opt("-smp", c.vcpus.to_string());
    opt("-m", format!("{}M", c.memory_mib));
    for (i, node) in vm.layout.numa_nodes.iter().enumerate() {
        let (cpus, mem) = vm.numa_share(i);
        // Memory bound to the host node the guest node stands for; vCPU threads are
        // pinned from outside QEMU (libvirt's <cputune>, or taskset on its threads).
        opt(
            "-object",
            format!(
                "memory-backend-ram,id=mem{},size={mem}M,host-nodes={},policy=bind",
                node.id, node.host_node
            ),
        );
        let mut numa = format!("node,nodeid={},memdev=mem{}", node.id, node.id);
        if !cpus.is_empty() {
            numa.push_str(&format!(",cpus={}", cpulist(&cpus)));
        }
        opt("-numa", numa);
    }
    opt(
        "-global",
        format!("q35-pcihost.pci-hole64-size={}G", vm.hole64_gib()),
    );
    if c.firmware == Firmware::Uefi {
        opt(
            "-drive",
            format!(
                "if=pflash,format=raw,unit=0,readonly=on,file={}",
                c.ovmf_code.display().to_string().replace(',', ",,")
            ),
        );
        // this VM's copy of the template, never the template (decide::vm_boot refuses that)
        if let Some(vars) = &c.boot.ovmf_vars_copy {
            opt(
                "-drive",
                format!(
                    "if=pflash,format=raw,unit=1,file={}",
                    vars.display().to_string().replace(',', ",,")
                ),
            );
        }
        opt(
            "-fw_cfg",
            format!(
                "name=opt/ovmf/X-PciMmio64Mb,string={}",
                vfio_p2p_decide::mmio::ovmf_mmio64_mb(vm.hole64)
            ),
        );
    }
    let iommufd = (vm.iommu_backend == IommuBackend::Iommufd).then_some(IOMMUFD_OBJECT_ID);
    if let Some(id) = iommufd {
        // QEMU opens /dev/iommu once; each vfio-pci then opens its /dev/vfio/devices/vfioN
        opt("-object", format!("iommufd,id={id}"));
    }
    for b in &vm.layout.bridges {
        opt("-device", bridge_device(b).to_string());
    }
    for g in vm.layout.passed() {
        for d in gpu_devices(g, iommufd) {
            opt("-device", d.to_string());
        }
    }
    for (k, v) in guest_io(vm) {
        opt(k, v);
    }
    opt("-fw_cfg", vm.fw_cfg_expectation());
    if let Some(r) = c.report {
        // last, so QEMU's automatic slot on pcie.0 cannot take one the layout names
        opt(
            "-device",
            format!("vhost-vsock-pci,guest-cid={},id=vsock0", r.cid),
        );
    }
    service(c, &mut a);
    a
}

/// QEMU as a service (vm.yaml `qmp_socket:`, `daemonize:`): the QMP monitor on a UNIX
/// socket that waits for no client (`-qmp` takes a chardev, qemu-options.hx), detached
/// after initialization with its pid beside the socket (`-daemonize`, `-pidfile`).
fn service(c: &vfio_p2p_config::vm::VmConfig, a: &mut Vec<String>) {
    let Some(s) = &c.boot.qemu_service else {
        return;
    };
    let qmp = format!("unix:{},server=on,wait=off", opts_path(&s.qmp_socket));
    a.extend(["-qmp".into(), qmp]);
    if s.daemonize {
        if c.devices.console == Console::None {
            a.extend(["-display".into(), "none".into()]);
        }
        let pidfile = s.qmp_socket.with_extension("pid");
        a.extend([
            "-daemonize".into(),
            "-pidfile".into(),
            pidfile.display().to_string(),
        ]);
    }
}

/// A path inside a QemuOpts value (`file=`, `path=`): commas doubled.
fn opts_path(p: &std::path::Path) -> String {
    p.display().to_string().replace(',', ",,")
}

/// The disks (the first with bootindex 1), the NIC and the serial console of vm.yaml, as
/// option/value pairs; `network: none` is `-nic none`, so QEMU adds no NIC of its own.
pub fn guest_io(vm: &VmDefinition) -> Vec<(&'static str, String)> {
    let c = vm.config;
    let mut a: Vec<(&'static str, String)> = Vec::new();
    for (i, (d, at, boots)) in disk_places(&c.devices.disks).into_iter().enumerate() {
        let ro = if d.readonly { ",readonly=on" } else { "" };
        a.push((
            "-drive",
            format!(
                "file={},format={},if=none,id=disk{i}{ro}",
                opts_path(&d.path),
                d.format.as_str()
            ),
        ));
        let mut m = DeviceJson::default();
        match d.bus {
            DiskBus::Virtio => {
                m.insert("driver", json!("virtio-blk-pci"));
                m.insert("drive", json!(format!("disk{i}")));
                m.insert("id", json!(format!("disk{i}-dev")));
                m.insert("bus", json!(ROOT_BUS));
                m.insert("addr", json!(format!("{at:#x}")));
            }
            DiskBus::Sata => {
                m.insert("driver", json!("ide-hd"));
                m.insert("drive", json!(format!("disk{i}")));
                m.insert("id", json!(format!("disk{i}-dev")));
                // the q35 chipset's AHCI controller: one bus per port
                m.insert("bus", json!(format!("ide.{at}")));
            }
        }
        if boots {
            m.insert("bootindex", json!(1));
        }
        a.push(("-device", m.to_string()));
    }
    match &c.devices.network {
        None => a.push(("-nic", "none".into())),
        Some(n) => {
            a.push((
                "-netdev",
                match n {
                    Network::User { .. } => "user,id=net0".to_string(),
                    // qemu-bridge-helper adds the tap to the bridge (/etc/qemu/bridge.conf: allow BRIDGE)
                    Network::Bridge { bridge, .. } => format!("bridge,id=net0,br={bridge}"),
                },
            ));
            let mut m = DeviceJson::default();
            m.insert("driver", json!("virtio-net-pci"));
            m.insert("netdev", json!("net0"));
            m.insert("id", json!("nic0"));
            m.insert("bus", json!(ROOT_BUS));
            m.insert("addr", json!(format!("{NIC_SLOT:#x}")));
            if let Some(mac) = n.mac() {
                m.insert("mac", json!(mac));
            }
            a.push(("-device", m.to_string()));
        }
    }
    match &c.devices.console {
        Console::None => {}
        Console::Serial => {
            // the guest's ttyS0 on the terminal, QEMU's monitor behind Ctrl-a c
            a.push(("-display", "none".into()));
            a.push(("-serial", "mon:stdio".into()));
        }
        Console::Socket(_) => {
            let path = c.devices.console.socket_path(&c.name).unwrap_or_default();
            a.push(("-display", "none".into()));
            a.push((
                "-chardev",
                format!(
                    "socket,id=console0,path={},server=on,wait=off",
                    opts_path(&path)
                ),
            ));
            a.push(("-serial", "chardev:console0".into()));
        }
    }
    a
}

/// Renders an argv in the chosen format.
pub fn render(argv: &[String], format: ArgvFormat) -> String {
    match format {
        ArgvFormat::Argv => argv.iter().map(|a| format!("{a}\n")).collect(),
        ArgvFormat::Json => serde_json::to_string_pretty(argv).expect("strings serialize") + "\n",
        ArgvFormat::Shell => {
            let mut out = String::new();
            let mut i = 0;
            while i < argv.len() {
                if i > 0 {
                    out.push_str(" \\\n    ");
                }
                out.push_str(&shell_quote(&argv[i]));
                // Keep an option and its value on one line.
                if argv[i].starts_with('-') && i + 1 < argv.len() && !argv[i + 1].starts_with('-') {
                    out.push(' ');
                    out.push_str(&shell_quote(&argv[i + 1]));
                    i += 1;
                }
                i += 1;
            }
            out.push('\n');
            out
        }
    }
}

/// Quotes `s` for a POSIX shell: bare when safe, else single-quoted.
pub fn shell_quote(s: &str) -> String {
    let safe = !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_@%+=:,./-".contains(&b));
    if safe {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shell_quoting() {
        assert_eq!(shell_quote("-m"), "-m");
        assert_eq!(shell_quote(r#"{"a":1}"#), r#"'{"a":1}'"#);
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote(""), "''");
    }

    #[test]
    fn shell_keeps_option_and_value_together() {
        let argv: Vec<String> = ["qemu", "-m", "4G", "-S", "-device", "{\"x\":1}"]
            .map(String::from)
            .to_vec();
        assert_eq!(
            render(&argv, ArgvFormat::Shell),
            "qemu \\\n    -m 4G \\\n    -S \\\n    -device '{\"x\":1}'\n"
        );
        assert_eq!(render(&argv, ArgvFormat::Argv).lines().count(), 6);
    }
}
