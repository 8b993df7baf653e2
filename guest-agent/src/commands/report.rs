//! `report`: scan, expectation, peers, verify and bench, judged per pair; `--from` a
//! saved report judged again.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use pci_config::Bdf;

use vfio_p2p_agent::bench::pingpong::PingPongFlags;
use vfio_p2p_agent::bench::BenchPlan;
use vfio_p2p_agent::cli::{ExpectArgs, Format, ReportArgs, SendArgs, SysfsArgs};
use vfio_p2p_agent::cross_gpu;
use vfio_p2p_agent::cross_process::HandleKind;
use vfio_p2p_agent::expect;
use vfio_p2p_agent::peers::{self, GpuInfo};
use vfio_p2p_agent::report::{HostInfo, Report};
use vfio_p2p_agent::sysfs::gpus::{self, NetFunction};
use vfio_p2p_agent::sysfs::read_regular_file;
use vfio_p2p_agent::verify::Injection;
use vfio_p2p_agent::{fabric, guest_topo, measure, nccl_topo, render, send};
use vfio_p2p_contract::Expectation;
use vfio_p2p_cuda_driver as cuda;
use vfio_p2p_nvml::Nvml;

use super::{
    deliver, emit, in_vm, load_modules, mark, nccl_topo_env, open_gpus, open_nvml,
    optional_expectation, pair_reports, parse_inject, read_sysfs, topo_report, CannotRun,
    CROSS_PROCESS_LIMIT,
};

/// `report`'s arguments turned into what it runs: the bench plan (with `--tune`), how it
/// ends, the self-test's words, the baseline.
pub(super) fn run(f: Format, a: &ReportArgs, verbose: bool) -> Result<u8, CannotRun> {
    let words = if a.quick { 2 << 20 } else { 16 << 20 };
    let (exit_tune, plan_tune): (Vec<&str>, Vec<&str>) = a
        .tune
        .iter()
        .map(String::as_str)
        .partition(|t| t.starts_with("exit="));
    let base = if a.quick {
        BenchPlan::QUICK
    } else {
        BenchPlan::FULL
    };
    let plan = base.tuned(plan_tune).map_err(anyhow::Error::msg)?;
    let exit = match exit_tune.last().copied() {
        None | Some("exit=now") => Exit::Now,
        Some("exit=reset") => Exit::ResetContexts,
        Some(other) => {
            return Err(CannotRun(anyhow::anyhow!(
                "--tune {other}: exit=now or exit=reset"
            )))
        }
    };
    let inject = parse_inject(&a.inject, words)?;
    let baseline = a
        .baseline
        .as_deref()
        .map(|p| load_report(p, "baseline"))
        .transpose()?;
    match &a.from {
        Some(path) => report_from_file(f, path, baseline.as_ref()),
        None => run_report(
            f,
            &a.sysfs,
            &a.expect,
            ((&plan, a.quick), verbose || a.verbose, a.cross_process),
            (baseline.as_ref(), &inject, exit),
            &a.send,
        ),
    }
}

/// `report --from FILE`: judges and prints a saved report (no GPU needed).
fn report_from_file(f: Format, path: &Path, baseline: Option<&Report>) -> Result<u8, CannotRun> {
    let mut r = load_report(path, "report")?;
    r.baseline = baseline.map(|b| r.compare_with(b));
    r.judge();
    emit(f, &r, render::report)?;
    let code = r.exit_code() as u8;
    deliver(f, false, None, send::from_report(&r, "", code))?;
    Ok(code)
}

/// `report`: scan, expectation, peers, verify and bench, judged per pair.
fn run_report(
    f: Format,
    sysfs: &SysfsArgs,
    expect: &ExpectArgs,
    ((plan, quick), verbose, across): ((&BenchPlan, bool), bool, bool),
    (baseline, inject, exit): (Option<&Report>, &Injection, Exit),
    send: &SendArgs,
) -> Result<u8, CannotRun> {
    let started = Instant::now();
    cuda::prefer_one_work_queue();
    let expectation = optional_expectation(expect, &sysfs.sysfs_root)?;
    let mut phases = measure::Phases {
        verbose,
        ..Default::default()
    };
    // The guest's side (sysfs, NVML, path labels, fabric) beside cuInit and the contexts,
    // which the driver serialises (the H100 bench runs: `setup-probe`).
    let (gpus, guest) = std::thread::scope(|s| {
        let beside = s.spawn(|| guest_side(&sysfs.sysfs_root, expectation.as_ref()));
        // The pointer-chase array too, off the first pair's path.
        s.spawn(|| vfio_p2p_agent::bench::prepare_chase_chain(plan));
        let gpus = open_gpus();
        let guest = beside
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p));
        (gpus, guest)
    });
    let GuestSide {
        scan,
        nics,
        expect_report,
        nvml,
        topo,
        fabric: fabric_report,
    } = guest;
    let gpus = gpus?;
    phases.lap(
        "CUDA init and contexts (a thread per GPU; sysfs, NVML and fabric beside)",
        started,
    );
    let vm = in_vm();
    let pairs = peers::probe(&gpus, nvml.as_ref())?;
    let flags = PingPongFlags::allocate(&gpus)?;
    phases.lap("peer access and ping-pong flags", started);
    let modules = load_modules(&gpus)?;
    phases.lap("kernels JIT-compiled (a thread per GPU)", started);
    let mut reports = pair_reports(&pairs, expectation.as_ref(), vm);
    let rounds = measure::plan_rounds(&gpus, &reports, scan.as_ref());
    let sides = (gpus.as_slice(), modules.as_slice());
    let words = if quick { 2 << 20 } else { 16 << 20 };
    let verify_walls =
        measure::verify_by_rounds(&gpus, &modules, &mut reports, (words, inject), &rounds)?;
    phases.lap("verify (one-way writes checked)", started);
    let ran = (rounds.as_slice(), Some(verify_walls.as_slice()));
    let round_records = measure::bench_by_rounds(sides, &flags, &mut reports, plan, ran)?;
    phases.lap("bench (latency, bandwidth)", started);
    let cross = if across {
        let exe = std::env::current_exe().context("finding this program to start its children")?;
        let bdfs: Vec<_> = gpus.iter().map(|g| g.bus_id).collect();
        let r = cross_gpu::run_all(&exe, &bdfs, &HandleKind::ALL, 64, CROSS_PROCESS_LIMIT);
        phases.lap("cross-process (a child per GPU)", started);
        Some(r)
    } else {
        None
    };
    let mut r = Report {
        agent_version: env!("CARGO_PKG_VERSION").into(),
        host: HostInfo {
            virtual_machine: vm,
            cuda_driver_version: cuda::driver_version()?,
            nvml: nvml.is_some(),
        },
        quick,
        scan,
        expect: expect_report,
        topo,
        fabric: fabric_report,
        gpus: gpus.iter().map(GpuInfo::from).collect(),
        pairs: reports,
        baseline: None,
        nccl_topo: None,
        schedule: None,
        rounds: Some(round_records),
        phases: None,
        cross_process: cross,
        elapsed_s: 0.0,
    };
    r.nccl_topo = report_nccl_topo(r.scan.as_ref(), &nics);
    r.schedule = r.eight_gpu_estimate(&phases);
    r.phases = Some(phases);
    r.baseline = baseline.map(|b| r.compare_with(b));
    r.judge();
    r.elapsed_s = started.elapsed().as_secs_f64();
    emit(f, &r, render::report)?;
    let code = r.exit_code() as u8;
    let e = expectation.as_ref().map(|(e, _)| e);
    let vm = e.map_or("", |e| e.vm.as_str());
    deliver(f, send.send, e, send::from_report(&r, vm, code))?;
    // Everything is printed and sent: end here rather than release each GPU's context
    // one after the other on the way out; the driver frees them as the process exits.
    use std::io::Write;
    let _ = std::io::stdout().flush();
    if exit == Exit::ResetContexts {
        cuda::reset_contexts(&gpus);
    }
    mark("exit");
    std::process::exit(code.into())
}

/// How `report` ends once everything is printed (`--tune exit=…`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Exit {
    /// The process ends; the driver tears the contexts down.
    Now,
    /// Each GPU's context reset first, a thread per GPU.
    ResetContexts,
}

/// What `report` reads of the guest besides CUDA: sysfs, the expectation's verdict,
/// NVML, the path labels and the fabric.
struct GuestSide {
    scan: Option<gpus::Scan>,
    nics: BTreeMap<Bdf, NetFunction>,
    expect_report: Option<expect::ExpectReport>,
    nvml: Option<Nvml>,
    topo: Option<guest_topo::TopoReport>,
    fabric: Option<fabric::FabricReport>,
}

fn guest_side(root: &Path, expectation: Option<&(Expectation, PathBuf)>) -> GuestSide {
    let guest = read_sysfs(root, expectation);
    let scan = guest.gpus.ok();
    let expect_report = match (expectation, &scan) {
        (Some((e, src)), Some(s)) => Some(expect::compare(e, src, s, &guest.numa)),
        _ => None,
    };
    let nvml = open_nvml();
    let topo = expectation.map(|(e, _)| topo_report(&guest.places, e, nvml.as_ref()));
    let fabric = nvml.as_ref().zip(scan.as_ref()).map(|(n, s)| {
        let bdfs: Vec<_> = s.gpus.iter().map(|g| g.bdf).collect();
        fabric::judge(&fabric::read(n, &bdfs), expectation.map(|(e, _)| e))
    });
    GuestSide {
        scan,
        nics: guest.nics,
        expect_report,
        nvml,
        topo,
        fabric,
    }
}

/// The most a saved report may hold: every ordered pair of 64 GPUs is under 2 MiB.
const MAX_REPORT_BYTES: u64 = 16 << 20;

/// A saved report; `what` names its role in errors (`report` for `--from`, `baseline`
/// for `--baseline`). Read non-blocking from a regular file, at most [`MAX_REPORT_BYTES`].
fn load_report(path: &Path, what: &str) -> Result<Report> {
    let bytes = read_regular_file(path, MAX_REPORT_BYTES + 1)
        .with_context(|| format!("reading the {what} {}", path.display()))?;
    anyhow::ensure!(
        bytes.len() as u64 <= MAX_REPORT_BYTES,
        "the {what} {} is larger than {MAX_REPORT_BYTES} bytes: not a report of this agent",
        path.display()
    );
    serde_json::from_slice(&bytes).with_context(|| {
        format!(
            "the {what} {} is not a report of this agent (`vfio-p2p-agent report --format json` \
             output, nothing else in the file)",
            path.display()
        )
    })
}

/// `report`'s NCCL part: the file NCCL_TOPO_FILE names, checked; a file that cannot be
/// read is a problem of the check, not a reason to skip the measurements.
fn report_nccl_topo(
    scan: Option<&gpus::Scan>,
    nics: &BTreeMap<Bdf, NetFunction>,
) -> Option<nccl_topo::NcclTopoCheck> {
    let path = nccl_topo_env()?;
    let scan = scan?;
    Some(
        nccl_topo::check_file(&path, scan, nics).unwrap_or_else(|e| nccl_topo::NcclTopoCheck {
            file: path.display().to_string(),
            gpus: Vec::new(),
            nics: Vec::new(),
            problems: vec![format!("NCCL_TOPO_FILE cannot be used: {e}")],
        }),
    )
}
