//! The commands `cross-process` and the hidden ones it and the bench scripts start:
//! `cross-process-child` (two per pair, `--same-gpu`), `cross-process-gpu` (one per GPU)
//! and `setup-probe`.

use anyhow::{Context, Result};

use vfio_p2p_agent::cli::{Command, Format};
use vfio_p2p_agent::cross_gpu;
use vfio_p2p_agent::cross_process::{self, HandleKind};
use vfio_p2p_agent::render;
use vfio_p2p_cuda_driver as cuda;

use super::{emit, CannotRun, CROSS_PROCESS_LIMIT};

/// Runs one of the hidden child commands.
pub fn run(command: &Command) -> Result<u8, CannotRun> {
    match command {
        Command::CrossProcessChild {
            role,
            gpu,
            kind,
            mib,
            socket,
        } => {
            cross_process::run_child(role, *gpu, kind, *mib, socket).map_err(anyhow::Error::msg)?;
        }
        Command::CrossProcessGpu {
            index,
            gpus,
            kinds,
            mib,
            limit_s,
            dir,
        } => {
            let kinds: Vec<HandleKind> =
                kinds.iter().filter_map(|k| HandleKind::parse(k)).collect();
            let limit = std::time::Duration::from_secs(*limit_s);
            cross_gpu::run_child(*index, gpus, &kinds, (*mib, dir, limit))
                .map_err(anyhow::Error::msg)?;
        }
        Command::SetupProbe {
            serial,
            only,
            hold_s,
            ctx_create,
        } => {
            let hold = std::time::Duration::from_secs(*hold_s);
            let t = vfio_p2p_agent::setup_probe::run((!*serial, *ctx_create), *only, hold)?;
            println!(
                "{}",
                serde_json::to_string(&t).map_err(anyhow::Error::from)?
            );
        }
        _ => {
            return Err(CannotRun(anyhow::anyhow!(
            "not one of the child commands (cross-process-child, cross-process-gpu, setup-probe)"
        )))
        }
    }
    Ok(0)
}

/// `cross-process`: both handle kinds (or one) for every ordered pair (or, `same_gpu`,
/// every GPU with itself), a pair at a time.
pub fn run_cross_process(
    f: Format,
    handle: &str,
    mib: usize,
    same_gpu: bool,
) -> Result<u8, CannotRun> {
    let kinds: Vec<HandleKind> = match HandleKind::parse(handle) {
        Some(k) => vec![k],
        None => HandleKind::ALL.to_vec(),
    };
    let gpus = cuda_bus_ids()?;
    let pairs = cross_process::pairs_to_check(&gpus, same_gpu).map_err(anyhow::Error::msg)?;
    let exe = std::env::current_exe().context("finding this program to start its children")?;
    let results = if same_gpu {
        cross_process::run_all(&exe, &pairs, &kinds, mib)
    } else {
        cross_gpu::run_all(&exe, &gpus, &kinds, mib, CROSS_PROCESS_LIMIT)
    };
    emit(f, &results, |r| render::cross_process(r))?;
    Ok(u8::from(!results.iter().all(|r| r.ok())))
}

/// The PCI addresses of the GPUs CUDA sees, sorted, without creating any context (the
/// children create their own).
fn cuda_bus_ids() -> Result<Vec<pci_config::Bdf>> {
    cuda::init()?;
    Ok(cuda::Gpu::bus_ids()?)
}
