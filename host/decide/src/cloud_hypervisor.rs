//! What Cloud Hypervisor makes of a VM: which of vm.yaml's devices it can take, and where
//! it puts each passed device in the guest. `gen cloud-hypervisor` decides both here; its
//! emitter (`emit::cloud_hypervisor`) only renders the result.
//!
//! Guest addresses, read from CH's source (v54.0.0, `vmm/src/device_manager.rs`
//! `create_devices` and `add_pci_devices`, `vmm/src/pci_segment.rs`, `pci/src/bus.rs`):
//! every device sits on the root bus of PCI segment 0 (no bridges, and CH gives a device
//! another segment only when told, `pci_segment=`), at function 0 of its own device number
//! (each passed function is a device of its own), the lowest number free when CH creates it;
//! 0 is CH's host bridge and there are 32. CH creates the virtio devices first, in this
//! order: the console (unless `--console off`; `--console` defaults to `tty`), the disks in
//! `--disk` order, the NICs in `--net` order, the entropy device (always: `--rng` defaults to
//! `src=/dev/urandom`), vhost-user devices, virtio-fs, pmem, vsock, virtio-mem, balloon,
//! watchdog, vDPA, rtc; then the VFIO devices in `--device` order; after them vfio-user
//! devices, the virtio-iommu, pvpanic and ivshmem. A device given `pci_device_id=` has that
//! number reserved before any is handed out. The serial port (`--serial`), the kernel,
//! `--api-socket`, `--cpus`, `--memory` and `--platform` take no PCI device number.
//! So what an operator adds to gen's arguments moves the GPUs by one number for each
//! virtio device it adds (a disk, a NIC, a vsock, `--fs`, `--pmem`, `--balloon`,
//! `--watchdog`, …) and back by one for `--console off` when gen wrote no console; nothing
//! else moves them.

use pci_config::Bdf;

use crate::guest_layout::{GuestLayout, ROOT_BUS};
use vfio_p2p_config::vm::{GuestTopology, IommuBackend, VmConfig};
use vfio_p2p_config::vm_devices::{Console, DiskBus, Network};

/// Device numbers on CH's root bus (`pci::NUM_DEVICE_IDS`); 0 is its host bridge.
pub const ROOT_BUS_DEVICES: u8 = 32;

/// The virtio devices gen's arguments for `config` make CH create before the VFIO
/// devices, in CH's order (see the module's text).
pub fn virtio_devices(config: &VmConfig) -> Vec<&'static str> {
    let d = &config.devices;
    let mut v = Vec::new();
    // gen writes `--console off` with a serial console of vm.yaml's, nothing for `none`
    if d.console == Console::None {
        v.push("console");
    }
    v.extend(d.disks.iter().map(|_| "disk"));
    v.extend(d.network.iter().map(|_| "net"));
    v.push("rng");
    if config.report.is_some() {
        v.push("vsock");
    }
    v
}

/// More devices than CH's root bus has numbers for.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("Cloud Hypervisor's root bus has {} device numbers: its virtio devices ({}) and {passed} passed function(s) need {}; pass fewer GPUs or NICs", ROOT_BUS_DEVICES - 1, .virtio.join(", "), .virtio.len() + .passed)]
pub struct RootBusFull {
    pub virtio: Vec<&'static str>,
    pub passed: usize,
}

/// `layout`'s GPUs and NICs where CH puts them for gen's arguments: on the root bus, in
/// the order gen passes them (each device's functions by host address, the GPUs then the
/// NICs), after the virtio devices. The layout has no bridges and no NUMA nodes (CH has
/// none to mirror), so the emitter writes `--device` in guest address order.
pub fn guest_layout(config: &VmConfig, layout: &GuestLayout) -> Result<GuestLayout, RootBusFull> {
    let virtio = virtio_devices(config);
    let passed: usize = layout.passed().map(|g| 1 + g.other_functions.len()).sum();
    if 1 + virtio.len() + passed > ROOT_BUS_DEVICES as usize {
        return Err(RootBusFull { virtio, passed });
    }
    let mut next = 1 + virtio.len() as u8;
    let mut slot = || {
        next += 1;
        Bdf::new(0, 0, next - 1, 0)
    };
    let mut out = layout.clone();
    out.topology = GuestTopology::Flat;
    out.bridges.clear();
    out.numa_nodes.clear();
    for d in out.gpus.iter_mut().chain(out.nics.iter_mut()) {
        d.parent = ROOT_BUS.to_string();
        d.numa_node = None;
        let first = d.host;
        let mut hosts: Vec<Bdf> = d.other_functions.iter().map(|f| f.host).collect();
        hosts.push(first);
        hosts.sort();
        for host in hosts {
            let guest = slot();
            match d.other_functions.iter_mut().find(|f| f.host == host) {
                Some(f) => f.guest = guest,
                None => d.guest = guest,
            }
        }
    }
    Ok(out)
}

/// What CH cannot do that vm.yaml (or the IOMMU backend) asks for.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Unsupported {
    #[error("Cloud Hypervisor under iommufd cannot map peer BARs (it pins them with IOMMU_IOAS_MAP; the dma-buf path is cloud-hypervisor issue #8895): with vfio_p2p_dma=on the VM does not boot, with it off the {cliques} P2P clique(s) would be advertised and fault. Use --iommu-backend legacy for this VM, or leave it without cliques")]
    IommufdCliques { cliques: usize },
    #[error("Cloud Hypervisor has only virtio disks: {path} has `bus: sata`; use `bus: virtio` (the guest needs virtio-blk, which every Linux has)")]
    SataDisk { path: String },
    #[error("Cloud Hypervisor cannot take a path with a comma in its options: {path}; rename the file or link it from a path without one")]
    CommaInPath { path: String },
    #[error("Cloud Hypervisor cannot take a path with {c:?} in its options (its option parser reads '\"' as a quote and '[ ]' as a list, option_parser's split_commas): {path}; rename the file or link it from a path without one")]
    QuoteInPath { path: String, c: char },
    #[error("Cloud Hypervisor has no user-mode networking: use `network: {{bridge: br0}}` (a tap in a host bridge) or `mode: none`")]
    UserNetwork,
}

/// A refusal of CH's and the vm.yaml line it is about.
pub type Refusal = crate::vm_refusal::Refusal<Unsupported>;

/// Refuses what CH cannot run: cliques under iommufd (`backend`, resolved), then
/// vm.yaml's disks (a SATA one, a path with a comma: CH splits its options at commas),
/// a user-mode network, a console socket path with a comma; the first found.
pub fn refusal(
    config: &VmConfig,
    layout: &GuestLayout,
    backend: IommuBackend,
) -> Result<(), Refusal> {
    let refuse = |at, why| Err(Refusal { at, why });
    let cliques: std::collections::BTreeSet<u8> =
        layout.gpus.iter().filter_map(|g| g.clique).collect();
    if backend == IommuBackend::Iommufd && !cliques.is_empty() {
        let why = Unsupported::IommufdCliques {
            cliques: cliques.len(),
        };
        return refuse(None, why);
    }
    let d = &config.devices;
    for disk in &d.disks {
        let path = disk.path.display().to_string();
        if disk.bus == DiskBus::Sata {
            return refuse(disk.at, Unsupported::SataDisk { path });
        }
        if let Some(why) = option_syntax(path) {
            return refuse(disk.at, why);
        }
    }
    if let Some(Network::User { .. }) = d.network {
        return refuse(d.network_at, Unsupported::UserNetwork);
    }
    if let Some(socket) = d.console.socket_path(&config.name) {
        let path = socket.display().to_string();
        if let Some(why) = option_syntax(path) {
            return refuse(d.console_socket_at, why);
        }
    }
    Ok(())
}

/// A path CH's option parser would split or unquote: a comma, a '"', a '[' or ']'.
fn option_syntax(path: String) -> Option<Unsupported> {
    match path.chars().find(|c| matches!(c, ',' | '"' | '[' | ']'))? {
        ',' => Some(Unsupported::CommaInPath { path }),
        c => Some(Unsupported::QuoteInPath { path, c }),
    }
}

#[cfg(test)]
mod tests;
