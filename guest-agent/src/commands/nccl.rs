//! `nccl`: the all-reduce stage (one process per GPU), and `nccl-rank`, one of them.

use std::path::Path;
use std::time::Duration;

use pci_config::Bdf;

use vfio_p2p_agent::cli::{Format, SysfsArgs};
use vfio_p2p_agent::nccl_allreduce::{self, NcclReport};
use vfio_p2p_agent::sysfs::GuestSysfs;
use vfio_p2p_agent::{link_verdict, nccl_topo};
use vfio_p2p_cuda_driver as cuda;
use vfio_p2p_cuda_driver::nccl::{library_path, Nccl, OpenError};
use vfio_p2p_nvml::Nvml;

use super::{emit, open_nvml, CannotRun};

/// How long one run (every rank) may take: NCCL's setup takes seconds.
const RUN_LIMIT: Duration = Duration::from_secs(120);

pub(super) fn run(
    f: Format,
    (lib, topo_file): (Option<&Path>, Option<&Path>),
    mib: usize,
    sysfs: &SysfsArgs,
) -> Result<u8, CannotRun> {
    let lib = library_path(lib);
    let report = match Nccl::open(&lib) {
        Err(OpenError::Absent(why)) => nccl_allreduce::skipped(&lib, why),
        Err(broken @ OpenError::Unloadable(_)) => {
            return Err(CannotRun(anyhow::anyhow!("NCCL stage: {broken}")))
        }
        Ok(nccl) => stage(&nccl, topo_file, mib << 20, sysfs)?,
    };
    emit(f, &report, nccl_allreduce::table)?;
    Ok(u8::from(!report.ok))
}

fn stage(
    nccl: &Nccl,
    topo_file: Option<&Path>,
    bytes: usize,
    sysfs: &SysfsArgs,
) -> Result<NcclReport, CannotRun> {
    let guest = GuestSysfs::read(&sysfs.sysfs_root, &[]);
    cuda::init()?;
    let gpus = cuda::Gpu::bus_ids()?;
    let exe = std::env::current_exe()?;
    let version = nccl.version().ok();
    let mut runs = Vec::new();
    // A fresh bootstrap id per run: each id serves one communicator.
    let nvml = open_nvml();
    let id = nccl.unique_id().map_err(anyhow::Error::msg)?;
    let auto = nccl_allreduce::run_all(&exe, &nccl.path, (&gpus, &id), None, (bytes, RUN_LIMIT));
    if let Some(file) = nccl_allreduce::topology_file(topo_file) {
        let id = nccl.unique_id().map_err(anyhow::Error::msg)?;
        let mut with_file = nccl_allreduce::run_all(
            &exe,
            &nccl.path,
            (&gpus, &id),
            Some(&file),
            (bytes, RUN_LIMIT),
        );
        let why = file_problems(&file, &gpus, &guest, nvml.as_ref());
        nccl_allreduce::judge_file_run(&mut with_file, &auto, &why);
        runs.push(auto);
        runs.push(with_file);
    } else {
        runs.push(auto);
    }
    if let Some(link) = weakest_link(&gpus, &guest, nvml.as_ref()) {
        for run in &mut runs {
            nccl_allreduce::judge_against_link(run, &link);
        }
    }
    let ok = runs.iter().all(|r| r.ok);
    Ok(NcclReport {
        library: nccl.path.display().to_string(),
        version,
        skipped: None,
        runs,
        ok,
    })
}

/// What the file gets wrong against this guest: the `nccl-topo` check's problems and
/// GPUs given fewer NVLinks than NVML sees active.
fn file_problems(
    file: &Path,
    gpus: &[Bdf],
    guest: &GuestSysfs,
    nvml: Option<&Nvml>,
) -> Vec<String> {
    let Ok(scan) = &guest.gpus else {
        return Vec::new();
    };
    let check = match nccl_topo::check_file(file, scan, &guest.nics) {
        Ok(c) => c,
        Err(e) => return vec![e],
    };
    let active: Vec<(Bdf, u32)> = match nvml {
        Some(nvml) => gpus
            .iter()
            .map(|&g| {
                let most = gpus
                    .iter()
                    .filter(|&&o| o != g)
                    .filter_map(|&o| nvml.link(g, o))
                    .map(|l| l.nvlinks)
                    .max()
                    .unwrap_or(0);
                (g, most)
            })
            .collect(),
        None => Vec::new(),
    };
    let mut why = check.problems.clone();
    why.extend(nccl_allreduce::fewer_nvlinks_than_active(&check, &active));
    why
}

/// What the weakest link between any two of `gpus` carries: NVML's NVLink count with
/// the GPU's part, else PCIe from sysfs; `None` when unknown.
fn weakest_link(
    gpus: &[Bdf],
    guest: &GuestSysfs,
    nvml: Option<&Nvml>,
) -> Option<link_verdict::LinkExpectation> {
    let scan = guest.gpus.as_ref().ok()?;
    let mut weakest: Option<link_verdict::LinkExpectation> = None;
    for (i, &a) in gpus.iter().enumerate() {
        for &b in &gpus[i + 1..] {
            let g = scan.gpu(a)?;
            let device = u16::from_str_radix(g.device.trim_start_matches("0x"), 16).ok()?;
            let links = nvml.and_then(|n| n.link(a, b)).map_or(0, |l| l.nvlinks);
            let e = if links > 0 {
                link_verdict::nvlink_expectation(links, device)?
            } else {
                let gts = link_verdict::parse_gts(g.link_speed.as_deref()?)?;
                link_verdict::pcie_expectation(gts, g.link_width?)?
            };
            if weakest.as_ref().is_none_or(|w| e.uni_gbps < w.uni_gbps) {
                weakest = Some(e);
            }
        }
    }
    weakest
}

pub(super) fn run_rank(
    lib: &Path,
    (rank, nranks, id): (usize, usize, &str),
    gpu: Bdf,
    bytes: usize,
) -> Result<u8, CannotRun> {
    let r = nccl_allreduce::run_rank(lib, (rank, nranks, id), gpu, bytes);
    nccl_allreduce::print_rank(&r)?;
    Ok(0)
}
