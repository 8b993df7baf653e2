//! Cloud Hypervisor command line: one `--device path=/sys/bus/pci/devices/BDF/` per GPU
//! function, with `x_nv_gpudirect_clique` on the GPU where the plan gives one.
//!
//! Cloud Hypervisor always writes the capability at 0xD4 and checks nothing, so a GPU
//! with a capability already starting there would get a corrupt capability list: that
//! is refused here. Cloud Hypervisor has no emulated switches or expander buses; every
//! device lands on PCI segment 0, whose 64-bit aperture covers all of the guest's
//! physical address space above RAM, so no `--platform`/`--pci-segment` knob is needed
//! for one segment; `max_phys_bits` must cover RAM plus the BARs.

use pci_config::clique::OFFSET_FALLBACK;

use super::vm::VmDefinition;
use vfio_p2p_config::vm::IommuBackend;
use vfio_p2p_model::Topology;

pub const CLOUD_HYPERVISOR_BINARY: &str = "cloud-hypervisor";

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CloudHypervisorError {
    #[error("{gpu}: a capability already starts at {offset:#x}, where Cloud Hypervisor puts the clique; it would corrupt the GPU's capability list. Use QEMU >= 8.1 (it moves the clique) or leave this GPU without a clique (no --p2p-level for it)")]
    CapabilityTaken { gpu: pci_config::Bdf, offset: u8 },
    #[error("Cloud Hypervisor under iommufd cannot map peer BARs (it pins them with IOMMU_IOAS_MAP; the dma-buf path is cloud-hypervisor issue #8895): with vfio_p2p_dma=on the VM does not boot, with it off the {cliques} P2P clique(s) would be advertised and fault. Use --iommu-backend legacy for this VM, or leave it without cliques")]
    IommufdCliques { cliques: usize },
}

/// The command line, program first, and warnings for GPUs whose config space could not be checked.
pub fn argv(
    vm: &VmDefinition,
    topo: &Topology,
) -> Result<(Vec<String>, Vec<String>), CloudHypervisorError> {
    let c = vm.config;
    let mut warnings = Vec::new();
    let mut a: Vec<String> = vec![CLOUD_HYPERVISOR_BINARY.into()];
    // Guest physical space must hold RAM (below and above 4 GiB) and the 64-bit window.
    let needed = (c.memory_mib << 20) + vm.hole64 + (4 << 30);
    let phys_bits = (64 - needed.leading_zeros()).max(40);
    a.push("--cpus".into());
    a.push(format!("boot={},max_phys_bits={phys_bits}", c.vcpus));
    a.push("--memory".into());
    a.push(format!("size={}M", c.memory_mib));
    if vm.iommu_backend == IommuBackend::Iommufd {
        let ids: std::collections::BTreeSet<u8> =
            vm.layout.gpus.iter().filter_map(|g| g.clique).collect();
        let cliques = ids.len();
        if cliques > 0 {
            return Err(CloudHypervisorError::IommufdCliques { cliques });
        }
        // without cliques no peer DMA is promised, and BAR mapping (which fails) is off
        a.push("--platform".into());
        a.push("iommufd=on,vfio_p2p_dma=off".into());
    }
    for g in vm.layout.passed() {
        if let Some(clique) = g.clique {
            match topo.device(&g.host) {
                Some(d) if d.config_complete() => {
                    if d.config().capability_starts_at(OFFSET_FALLBACK) {
                        return Err(CloudHypervisorError::CapabilityTaken {
                            gpu: g.host,
                            offset: OFFSET_FALLBACK,
                        });
                    }
                }
                _ => warnings.push(format!(
                    "{}: config space not readable (run as root): could not check that {OFFSET_FALLBACK:#x} is free for clique {clique}",
                    g.host
                )),
            }
        }
        let mut functions = vec![(g.host, g.id.clone(), g.clique)];
        functions.extend(
            g.other_functions
                .iter()
                .map(|f| (f.host, f.id.clone(), None)),
        );
        functions.sort_by_key(|f| f.0);
        for (host, id, clique) in functions {
            let mut d = format!("path=/sys/bus/pci/devices/{host}/,id={id}");
            if let Some(c) = clique {
                d.push_str(&format!(",x_nv_gpudirect_clique={c}"));
            }
            a.push("--device".into());
            a.push(d);
        }
    }
    if let Some(r) = c.report {
        // hybrid vsock: the guest's connections to CID 2 port P arrive at SOCKET_P on the host
        a.push("--vsock".into());
        a.push(format!(
            "cid={},socket={VSOCK_SOCKET_DIR}/{}.sock",
            r.cid, c.name
        ));
    }
    Ok((a, warnings))
}

/// Where the Cloud Hypervisor vsock sockets go; `vfio-p2p collect --unix-socket` serves them.
pub const VSOCK_SOCKET_DIR: &str = "/run/vfio-p2p/vsock";
