//! Cloud Hypervisor command line: one `--device path=/sys/bus/pci/devices/BDF/` per GPU
//! function, with `x_nv_gpudirect_clique` on the GPU where the plan gives one.
//!
//! Cloud Hypervisor always writes the capability at 0xD4 and checks nothing, so a GPU
//! with a capability already starting there would get a corrupt capability list: that
//! is refused before rendering (`decide::clique_offset::cloud_hypervisor`). Cloud Hypervisor has no emulated switches or expander buses; every
//! device lands on PCI segment 0, whose 64-bit aperture covers all of the guest's
//! physical address space above RAM, so no `--platform`/`--pci-segment` knob is needed
//! for one segment; `max_phys_bits` must cover RAM plus the BARs.

use super::vm::VmDefinition;
use vfio_p2p_config::vm::IommuBackend;

pub const CLOUD_HYPERVISOR_BINARY: &str = "cloud-hypervisor";

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CloudHypervisorError {
    #[error("Cloud Hypervisor under iommufd cannot map peer BARs (it pins them with IOMMU_IOAS_MAP; the dma-buf path is cloud-hypervisor issue #8895): with vfio_p2p_dma=on the VM does not boot, with it off the {cliques} P2P clique(s) would be advertised and fault. Use --iommu-backend legacy for this VM, or leave it without cliques")]
    IommufdCliques { cliques: usize },
}

/// The command line, program first (the clique offsets decided, `decide::clique_offset`).
pub fn argv(vm: &VmDefinition) -> Result<Vec<String>, CloudHypervisorError> {
    let c = vm.config;
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
    Ok(a)
}

/// Where the Cloud Hypervisor vsock sockets go; `vfio-p2p collect --unix-socket` serves them.
pub const VSOCK_SOCKET_DIR: &str = "/run/vfio-p2p/vsock";
