//! Cloud Hypervisor command line: one `--device path=/sys/bus/pci/devices/BDF/` per GPU
//! function, with `x_nv_gpudirect_clique` on the GPU where the plan gives one, in the
//! order of the guest addresses `decide::cloud_hypervisor::guest_layout` gave them (CH
//! numbers them in `--device` order). What CH cannot take is refused there
//! (`decide::cloud_hypervisor::refusal`); this only renders.
//!
//! Cloud Hypervisor always writes the capability at 0xD4 and checks nothing, so a GPU
//! with a capability already starting there would get a corrupt capability list: that
//! is refused before rendering (`decide::clique_offset::cloud_hypervisor`). Cloud Hypervisor has no emulated switches or expander buses; every
//! device lands on PCI segment 0, whose 64-bit aperture covers all of the guest's
//! physical address space above RAM, so no `--platform`/`--pci-segment` knob is needed
//! for one segment; `max_phys_bits` must cover RAM plus the BARs (CH gives the guest the
//! smaller of it and the host's width, 46 when not given: vmm/src/vm.rs `physical_bits`).

use super::vm::VmDefinition;
use vfio_p2p_config::vm::IommuBackend;
use vfio_p2p_config::vm_boot::Firmware;
use vfio_p2p_config::vm_devices::{Console, Network};
use vfio_p2p_decide::grace_guest::GraceGuest;

pub const CLOUD_HYPERVISOR_BINARY: &str = "cloud-hypervisor";

/// The command line, program first (the clique offsets decided, `decide::clique_offset`;
/// the layout and what CH takes, `decide::cloud_hypervisor`), and warnings about what the
/// operator must add (the NIC's tap to its bridge).
pub fn argv(vm: &VmDefinition) -> (Vec<String>, Vec<String>) {
    let c = vm.config;
    let mut warnings = Vec::new();
    let mut a: Vec<String> = vec![CLOUD_HYPERVISOR_BINARY.into()];
    // the width that holds RAM and the 64-bit window (decide::address_space::for_vm)
    a.push("--cpus".into());
    a.push(format!(
        "boot={},max_phys_bits={}",
        c.vcpus, vm.address_space.max_phys_bits
    ));
    match vm.grace {
        Some(g) => a.extend(grace_memory(vm, g)),
        None => {
            a.push("--memory".into());
            a.push(format!("size={}M", c.memory_mib));
        }
    }
    boot(c, &mut a);
    if vm.iommu_backend == IommuBackend::Iommufd {
        // without cliques (refused with them) no peer DMA is promised, and BAR mapping
        // (which fails) is off
        a.push("--platform".into());
        a.push("iommufd=on,vfio_p2p_dma=off".into());
    }
    let mut functions = Vec::new();
    for g in vm.layout.passed() {
        functions.push((g.guest, g.host, &g.id, g.clique));
        functions.extend(
            g.other_functions
                .iter()
                .map(|f| (f.guest, f.host, &f.id, None)),
        );
    }
    functions.sort_by_key(|f| f.0);
    for (_, host, id, clique) in functions {
        let mut d = format!("path=/sys/bus/pci/devices/{host}/,id={id}");
        if let Some(c) = clique {
            d.push_str(&format!(",x_nv_gpudirect_clique={c}"));
        }
        a.push("--device".into());
        a.push(d);
    }
    if let Some(g) = vm.grace {
        a.extend(grace_numa(vm, g));
    }
    guest_io(vm, &mut a, &mut warnings);
    if let Some(r) = c.report {
        // hybrid vsock: the guest's connections to CID 2 port P arrive at SOCKET_P on the host
        a.push("--vsock".into());
        a.push(format!(
            "cid={},socket={VSOCK_SOCKET_DIR}/{}.sock",
            r.cid, c.name
        ));
    }
    (a, warnings)
}

/// A Grace guest's RAM: one memory zone per CPU node, on the host node it stands for, in
/// huge pages where decided (CH: `--memory size=0` with `--memory-zone`, docs/memory.md).
fn grace_memory(vm: &VmDefinition, g: &GraceGuest) -> Vec<String> {
    let mut a: Vec<String> = vec!["--memory".into(), "size=0".into()];
    for (i, n) in vm.layout.numa_nodes.iter().enumerate() {
        let (_, mib) = vm.numa_share(i);
        let mut zone = format!("id=mem{},size={mib}M,host_numa_node={}", n.id, n.host_node);
        if let Some(kib) = g.hugepage_kib {
            zone.push_str(&format!(",hugepages=on,hugepage_size={}M", kib / 1024));
        }
        a.extend(["--memory-zone".into(), zone]);
    }
    a
}

/// A Grace guest's nodes: each CPU node with its vCPUs and zone, then each GPU's nodes as
/// Generic Initiator nodes (`device_id=` the GPU's `--device id`, Cloud Hypervisor >= 51),
/// each with its distances to the others where they are the host's.
fn grace_numa(vm: &VmDefinition, g: &GraceGuest) -> Vec<String> {
    let distances = |id: u32| -> String {
        let Some(row) = g
            .distances
            .get(id as usize)
            .filter(|_| g.distances_from_host)
        else {
            return String::new();
        };
        let list: Vec<String> = row
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != id as usize)
            .map(|(j, d)| format!("{j}@{d}"))
            .collect();
        format!(",distances=[{}]", list.join(","))
    };
    let mut a = Vec::new();
    for (i, n) in vm.layout.numa_nodes.iter().enumerate() {
        let (cpus, _) = vm.numa_share(i);
        let cpus = super::vm::cpulist(&cpus);
        a.push("--numa".into());
        a.push(format!(
            "guest_numa_id={},cpus=[{cpus}],memory_zones=mem{}{}",
            n.id,
            n.id,
            distances(n.id)
        ));
    }
    for gpu in &g.gpus {
        for n in &gpu.nodes {
            a.push("--numa".into());
            a.push(format!(
                "guest_numa_id={},device_id={}{}",
                n.id,
                gpu.gpu,
                distances(n.id)
            ));
        }
    }
    a
}

/// What CH boots (decide::vm_boot refused UEFI without its firmware named): the kernel of
/// vm.yaml, else its UEFI firmware (`ovmf_code:`, CLOUDHV.fd), else nothing (warned of).
fn boot(c: &vfio_p2p_config::vm::VmConfig, a: &mut Vec<String>) {
    if let Some(k) = &c.boot.kernel {
        a.extend(["--kernel".into(), k.kernel.display().to_string()]);
        if let Some(i) = &k.initramfs {
            a.extend(["--initramfs".into(), i.display().to_string()]);
        }
        if let Some(line) = &k.cmdline {
            a.extend(["--cmdline".into(), line.clone()]);
        }
    } else if c.firmware == Firmware::Uefi {
        a.extend(["--firmware".into(), c.ovmf_code.display().to_string()]);
    }
}

/// The tap Cloud Hypervisor creates for the VM's NIC: `tap-NAME` where that fits Linux's 15
/// bytes (IFNAMSIZ), else `tap-` + the name's first 6 characters + `-` + 4 hex digits of a
/// hash of the whole name, so that `gpu-worker-01` and `gpu-worker-02` get two taps.
pub fn tap_name(vm: &str) -> String {
    let plain = format!("tap-{vm}");
    if plain.len() <= 15 {
        return plain;
    }
    // FNV-1a, 32 bits, folded to 16: stable across builds and platforms.
    let h = vm.bytes().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    });
    let prefix: String = vm.chars().filter(char::is_ascii).take(6).collect();
    format!("tap-{prefix}-{:04x}", (h >> 16) ^ (h & 0xffff))
}

/// vm.yaml's disks (Cloud Hypervisor boots the first and reads its format itself), the
/// NIC (a tap it creates; adding it to the bridge is the operator's) and the serial console;
/// SATA disks, user networking and paths with commas were refused before.
fn guest_io(vm: &VmDefinition, a: &mut Vec<String>, warnings: &mut Vec<String>) {
    let c = vm.config;
    for d in &c.devices.disks {
        let ro = if d.readonly { ",readonly=on" } else { "" };
        a.push("--disk".into());
        a.push(format!("path={}{ro}", d.path.display()));
    }
    match &c.devices.network {
        None | Some(Network::User { .. }) => {}
        Some(n @ Network::Bridge { bridge, .. }) => {
            let tap = tap_name(&c.name);
            let mut v = format!("tap={tap}");
            if let Some(mac) = n.mac() {
                v.push_str(&format!(",mac={mac}"));
            }
            a.push("--net".into());
            a.push(v);
            warnings.push(format!(
                "Cloud Hypervisor creates tap {tap} but adds it to no bridge: once the VM runs, `ip link set {tap} master {bridge} up`"
            ));
        }
    }
    let serial = match &c.devices.console {
        // nothing: CH's defaults (no serial port, the virtio console on its terminal)
        Console::None => return,
        Console::Serial => "tty".to_string(),
        Console::Socket(_) => format!(
            "socket={}",
            c.devices
                .console
                .socket_path(&c.name)
                .unwrap_or_default()
                .display()
        ),
    };
    // the guest's ttyS0; the virtio console would take the terminal too
    a.extend(["--serial".into(), serial, "--console".into(), "off".into()]);
}

/// Where the Cloud Hypervisor vsock sockets go; `vfio-p2p collect --unix-socket` serves them.
pub const VSOCK_SOCKET_DIR: &str = "/run/vfio-p2p/vsock";

#[cfg(test)]
mod tap_tests {
    use super::tap_name;

    #[test]
    fn long_names_get_taps_of_their_own_within_15_bytes() {
        assert_eq!(tap_name("train-01"), "tap-train-01");
        let (a, b) = (tap_name("gpu-worker-01"), tap_name("gpu-worker-02"));
        assert_ne!(a, b);
        assert!(a.len() <= 15 && b.len() <= 15, "{a} {b}");
        assert!(a.starts_with("tap-gpu-wo-"), "{a}");
    }
}
