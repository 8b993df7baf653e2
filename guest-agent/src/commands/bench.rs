//! `bench`: latency and bandwidth of every pair; `--simulate N` an N-GPU schedule on the
//! GPUs at hand.

use std::time::Instant;

use vfio_p2p_agent::bench::pingpong::PingPongFlags;
use vfio_p2p_agent::bench::{self, BenchPlan};
use vfio_p2p_agent::cli::{BenchArgs, Format};
use vfio_p2p_agent::sysfs::GuestSysfs;
use vfio_p2p_agent::{measure, peers, render};
use vfio_p2p_cuda_driver as cuda;

use super::{emit, in_vm, load_modules, open_gpus, pair_reports, CannotRun};

pub(super) fn run(f: Format, a: &BenchArgs, verbose: bool) -> Result<u8, CannotRun> {
    let plan = if a.quick {
        BenchPlan::QUICK
    } else {
        BenchPlan::FULL
    };
    if let Some(n) = a.simulate {
        let verbose = verbose || a.verbose;
        return run_simulated(f, usize::from(n), (!a.serial, verbose), &plan);
    }
    let guest = GuestSysfs::read(&a.sysfs.sysfs_root, &[]);
    cuda::prefer_one_work_queue();
    let gpus = open_gpus()?;
    let pairs = peers::probe(&gpus, None)?;
    let flags = PingPongFlags::allocate(&gpus)?;
    let modules = load_modules(&gpus)?;
    let mut reports = pair_reports(&pairs, None, in_vm());
    let rounds = measure::plan_rounds(&gpus, &reports, guest.gpus.as_ref().ok());
    let sides = (gpus.as_slice(), modules.as_slice());
    measure::bench_by_rounds(sides, &flags, &mut reports, &plan, (&rounds, None))?;
    let results: Vec<bench::PairBench> = reports.iter().filter_map(|r| r.bench.clone()).collect();
    emit(f, &results, |r| render::bench(r))?;
    let timed_out = results.iter().any(|b| b.pingpong_timed_out);
    Ok(u8::from(timed_out))
}

/// `bench --simulate N`: the N-GPU schedule on the GPUs at hand (one GPU is enough).
fn run_simulated(
    f: Format,
    n: usize,
    (concurrent, verbose): (bool, bool),
    plan: &BenchPlan,
) -> Result<u8, CannotRun> {
    let started = Instant::now();
    let mut phases = measure::Phases {
        verbose,
        ..Default::default()
    };
    let gpus = peers::open_gpus()?;
    if gpus.is_empty() {
        return Err(CannotRun(anyhow::anyhow!("CUDA sees no GPU")));
    }
    phases.lap("CUDA contexts (a thread per GPU)", started);
    let pairs = peers::probe(&gpus, None)?;
    if let Some(p) = pairs.iter().find(|p| !p.enabled) {
        return Err(CannotRun(anyhow::anyhow!(
            "--simulate measures every pair of the GPUs at hand, but {} → {} has no peer \
             access: hide the others with CUDA_VISIBLE_DEVICES",
            p.src,
            p.dst
        )));
    }
    phases.lap("peer access", started);
    let modules = load_modules(&gpus)?;
    phases.lap("kernels JIT-compiled (a thread per GPU)", started);
    let mut run = measure::simulate((&gpus, &modules), n, concurrent, plan)?;
    phases.lap("rounds (ping-pong flags, bench)", started);
    run.phases = Some(phases);
    run.elapsed_s = started.elapsed().as_secs_f64();
    emit(f, &run, render::simulated)?;
    Ok(u8::from(run.pairs.iter().any(|b| b.pingpong_timed_out)))
}
