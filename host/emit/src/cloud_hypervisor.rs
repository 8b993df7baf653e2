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
use vfio_p2p_config::vm_devices::{Console, Network};

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
    a.push("--memory".into());
    a.push(format!("size={}M", c.memory_mib));
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
