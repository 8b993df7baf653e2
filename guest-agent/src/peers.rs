//! `peers`: the driver's view of every ordered GPU pair, and enabling peer access.

use pci_config::Bdf;
use serde::{Deserialize, Serialize};

use vfio_p2p_cuda_driver::{self as cuda, peers, CudaError, Gpu};
use vfio_p2p_nvml::{Link, Nvml};

/// A GPU as CUDA sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuInfo {
    pub bus_id: Bdf,
    pub ordinal: i32,
    pub name: String,
    pub uuid: String,
    pub sm_count: u32,
}

impl From<&Gpu> for GpuInfo {
    fn from(g: &Gpu) -> Self {
        GpuInfo {
            bus_id: g.bus_id,
            ordinal: g.ordinal,
            name: g.name.clone(),
            uuid: g.uuid.clone(),
            sm_count: g.sm_count,
        }
    }
}

/// One ordered pair: can `src` reach `dst`'s memory?
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerCheck {
    pub src: Bdf,
    pub dst: Bdf,
    pub can_access: bool,
    pub performance_rank: i32,
    pub access_supported: bool,
    pub native_atomics: bool,
    /// Peer access was enabled (`cuCtxEnablePeerAccess` succeeded).
    pub enabled: bool,
    pub enable_error: Option<String>,
    /// NVLink or PCIe, when NVML is present.
    pub link: Option<Link>,
}

/// Probes every ordered pair and enables peer access where the driver allows it.
pub fn probe(gpus: &[Gpu], nvml: Option<&Nvml>) -> Result<Vec<PeerCheck>, CudaError> {
    let mut out = Vec::new();
    for src in gpus {
        for dst in gpus {
            if std::ptr::eq(src, dst) {
                continue;
            }
            let a = peers::attributes(src, dst)?;
            let (enabled, enable_error) = if a.can_access {
                match peers::enable(src, dst)? {
                    Ok(()) => (true, None),
                    Err(e) => (false, Some(e)),
                }
            } else {
                (false, None)
            };
            out.push(PeerCheck {
                src: src.bus_id,
                dst: dst.bus_id,
                can_access: a.can_access,
                performance_rank: a.performance_rank,
                access_supported: a.access_supported,
                native_atomics: a.native_atomics,
                enabled,
                enable_error,
                link: nvml.and_then(|n| n.link(src.bus_id, dst.bus_id)),
            });
        }
    }
    Ok(out)
}

/// Initialises CUDA and opens every GPU, sorted by PCI address.
pub fn open_gpus() -> Result<Vec<Gpu>, CudaError> {
    cuda::init()?;
    Gpu::all()
}
