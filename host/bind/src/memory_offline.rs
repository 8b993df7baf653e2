//! Grace: a GPU leaves `nvidia` for nvgrace_gpu_vfio_pci only once the GPU memory that
//! `nvidia` onlined as system RAM is offline — its "System RAM (NVIDIA)" ranges gone from
//! `/proc/iomem` (read by `vfio_p2p_read::iomem`). `bind` waits for that, bounded, before
//! it writes anything: a timeout changes nothing and names the GPUs and the fix.
//!
//! `/proc/iomem` does not say which GPU a range belongs to, so the wait is for every
//! NVIDIA range: on a host where another GPU keeps its memory online, bind its GPUs together
//! or offline that memory too.

use std::path::Path;
use std::time::{Duration, Instant};

use pci_config::Bdf;
use vfio_p2p_model::host_facts::NodeProbe;
use vfio_p2p_read::iomem::{nvidia_system_ram, NVIDIA_SYSTEM_RAM};

/// How long `bind` and the hook wait for the GPU memory to go offline.
pub const GPU_MEMORY_OFFLINE_WAIT: Duration = Duration::from_secs(60);
/// How often the wait looks again.
const POLL: Duration = Duration::from_millis(250);

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum OfflineError {
    #[error(
        "{gpus}: the GPU memory is still online after {waited} s ({ranges} in {path} is \
         \"{NVIDIA_SYSTEM_RAM}\"), so nvgrace_gpu_vfio_pci cannot take the GPU; nothing was \
         changed. Offline it first: stop what uses it (nvidia-persistenced, processes with memory \
         on the GPU's NUMA node), write `offline` to the `state` of each memory block of that node \
         (/sys/devices/system/node/nodeN/memoryM/state), then bind again"
    )]
    StillOnline {
        gpus: String,
        waited: u64,
        ranges: String,
        path: String,
    },
    #[error(
        "{gpus}: cannot tell whether the GPU memory is offline: {message}; nothing was changed"
    )]
    Unreadable { gpus: String, message: String },
}

fn list(gpus: &[Bdf]) -> String {
    gpus.iter()
        .map(Bdf::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Waits up to `wait` until `root/proc/iomem` shows no NVIDIA system RAM. A root without
/// `proc/iomem` (a copied tree, not a live host) has nothing to wait for.
pub fn wait_gpu_memory_offline(
    root: &Path,
    gpus: &[Bdf],
    wait: Duration,
) -> Result<(), OfflineError> {
    let start = Instant::now();
    loop {
        let ranges = match nvidia_system_ram(root) {
            NodeProbe::Ok(r) => r,
            NodeProbe::Absent(_) => return Ok(()),
            NodeProbe::Error(message) | NodeProbe::Unknown(message) => {
                return Err(OfflineError::Unreadable {
                    gpus: list(gpus),
                    message,
                })
            }
        };
        if ranges.is_empty() {
            return Ok(());
        }
        if start.elapsed() >= wait {
            return Err(OfflineError::StillOnline {
                gpus: list(gpus),
                waited: wait.as_secs(),
                ranges: ranges
                    .iter()
                    .map(|(a, b)| format!("{a:x}-{b:x}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                path: root.join("proc/iomem").display().to_string(),
            });
        }
        std::thread::sleep(POLL.min(wait.saturating_sub(start.elapsed())));
    }
}
