//! vfio-p2p-agent: checks and measures GPU P2P inside a VM.
//!
//! Exit status: 0 all as expected, 1 a mismatch, 2 cannot run.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Parser;
use serde::Serialize;

use vfio_p2p_agent::bench::{self, PingPongFlags, Plan};
use vfio_p2p_agent::cli::{Cli, Command, ExpectArgs, Format, SendArgs, SysfsArgs};
use vfio_p2p_agent::cross_gpu;
use vfio_p2p_agent::cross_process::HandleKind;
use vfio_p2p_agent::cuda::{self, Gpu, Module};
use vfio_p2p_agent::expect::{self, Expectation};
use vfio_p2p_agent::nvml::Nvml;
use vfio_p2p_agent::peers::{self, GpuInfo, PeerCheck};
use vfio_p2p_agent::report::{self, HostInfo, PairReport, Report};
use vfio_p2p_agent::verify::Injection;
use vfio_p2p_agent::{fabric, guest_topo, measure, nccl_topo, render, send, sysfs_scan};

mod children;

use children::{run_cross_process, CROSS_PROCESS_LIMIT};

/// A failure that means the command could not do its job (exit 2).
struct CannotRun(anyhow::Error);

impl<E: Into<anyhow::Error>> From<E> for CannotRun {
    fn from(e: E) -> Self {
        CannotRun(e.into())
    }
}

fn main() -> ExitCode {
    vfio_p2p_style::init_logging("RUST_LOG", "warn");
    let cli = Cli::parse();
    match run(&cli) {
        Ok(code) => ExitCode::from(code),
        Err(CannotRun(e)) => {
            eprintln!(
                "vfio-p2p-agent: cannot run: {}",
                vfio_p2p_style::error_chain(e.as_ref())
            );
            ExitCode::from(2)
        }
    }
}

fn emit<T: Serialize>(format: Format, value: &T, table: impl FnOnce(&T) -> String) -> Result<()> {
    match format {
        Format::Json => println!("{}", serde_json::to_string_pretty(value)?),
        Format::Table => print!("{}", table(value)),
        // expect and report print it through `deliver`; run() refuses it elsewhere
        Format::Prometheus => {}
    }
    Ok(())
}

fn run(cli: &Cli) -> Result<u8, CannotRun> {
    let f = cli.format;
    let reports = matches!(cli.command, Command::Expect { .. } | Command::Report { .. });
    if f == Format::Prometheus && !reports {
        return Err(CannotRun(anyhow::anyhow!(
            "--format prometheus is for expect and report"
        )));
    }
    match &cli.command {
        Command::Scan(s) => {
            let scan = sysfs_scan::scan(&s.sysfs_root)?;
            emit(f, &scan, render::scan)?;
            if f == Format::Table && !s.sysfs_root.join(expect::FW_CFG_PATH).exists() {
                print!("{}", render::no_expectation_note());
            }
            Ok(0)
        }
        Command::Expect {
            sysfs,
            expect,
            send,
        } => run_expect(f, sysfs, expect, send),
        Command::Topo { sysfs, expect } => run_topo(f, sysfs, expect),
        Command::Peers { sysfs, expect } => run_peers(f, sysfs, expect),
        Command::CrossProcess {
            handle,
            mib,
            same_gpu,
        } => run_cross_process(f, handle, *mib, *same_gpu),
        Command::CrossProcessChild { .. }
        | Command::CrossProcessGpu { .. }
        | Command::SetupProbe { .. } => children::run(&cli.command),
        Command::NcclTopo { file, sysfs } => {
            let path = match file {
                Some(p) => p.clone(),
                None => nccl_topo_env().ok_or_else(|| {
                    anyhow::anyhow!(
                        "no file given and NCCL_TOPO_FILE is not set: name the NCCL topology \
                         file (vfio-p2p-agent nccl-topo FILE)"
                    )
                })?,
            };
            let scan = sysfs_scan::scan(&sysfs.sysfs_root)?;
            let check = nccl_topo::check_file(&path, &scan).map_err(anyhow::Error::msg)?;
            emit(f, &check, render::nccl_topo)?;
            Ok(u8::from(!check.ok()))
        }
        Command::Verify {
            sysfs,
            expect,
            mib,
            inject,
        } => {
            let inject = parse_inject(inject, mib * (1 << 20) / 4)?;
            run_verify_command(f, sysfs, expect, (*mib, &inject))
        }
        Command::Bench {
            quick,
            simulate,
            serial,
            verbose,
        } => {
            let plan = if *quick { Plan::QUICK } else { Plan::FULL };
            if let Some(n) = simulate {
                let verbose = cli.verbose || *verbose;
                return run_simulated(f, usize::from(*n), (!*serial, verbose), &plan);
            }
            let gpus = open_gpus()?;
            let pairs = peers::probe(&gpus, None)?;
            let flags = PingPongFlags::allocate(&gpus)?;
            let modules = load_modules(&gpus)?;
            let mut reports = pair_reports(&pairs, None, in_vm());
            let scan = sysfs_scan::scan(Path::new("/")).ok();
            let rounds = measure::plan_rounds(&gpus, &reports, scan.as_ref());
            let sides = (gpus.as_slice(), modules.as_slice());
            measure::bench_by_rounds(sides, &flags, &mut reports, &plan, (&rounds, None))?;
            let results: Vec<bench::PairBench> =
                reports.iter().filter_map(|r| r.bench.clone()).collect();
            emit(f, &results, |r| render::bench(r))?;
            let timed_out = results.iter().any(|b| b.pingpong_timed_out);
            Ok(u8::from(timed_out))
        }
        Command::Report {
            sysfs,
            expect,
            quick,
            baseline,
            cross_process,
            from,
            send,
            inject,
            verbose,
        } => {
            let words = if *quick { 2 << 20 } else { 16 << 20 };
            let inject = parse_inject(inject, words)?;
            let baseline = baseline
                .as_deref()
                .map(|p| load_report(p, "baseline"))
                .transpose()?;
            match from {
                Some(path) => report_from_file(f, path, baseline.as_ref()),
                None => run_report(
                    f,
                    sysfs,
                    expect,
                    (*quick, cli.verbose || *verbose, *cross_process),
                    (baseline.as_ref(), &inject),
                    send,
                ),
            }
        }
    }
}

/// `expect`: the GPUs and cliques against the host's expectation.
fn run_expect(
    f: Format,
    sysfs: &SysfsArgs,
    expect: &ExpectArgs,
    send: &SendArgs,
) -> Result<u8, CannotRun> {
    let scan = sysfs_scan::scan(&sysfs.sysfs_root)?;
    let (e, source) = expect::load(expect.expect.as_deref(), &sysfs.sysfs_root)?;
    let mut r = expect::compare(&e, &source, &scan);
    if fabric::planned(&e) {
        match Nvml::open() {
            Some(nvml) => {
                let bdfs: Vec<_> = scan.gpus.iter().map(|g| g.bdf).collect();
                r.fabric = Some(fabric::judge(&fabric::read(&nvml, &bdfs), Some(&e)));
            }
            None => {
                r.fabric_unchecked = Some(
                    "the expectation plans an NVSwitch fabric (module ids, FM partition) but \
                     NVML (libnvidia-ml.so.1) cannot be loaded: install the NVIDIA driver in \
                     the guest"
                        .into(),
                )
            }
        }
    }
    emit(f, &r, render::expect)?;
    let code = match (r.mismatches(), r.unchecked()) {
        (0, 0) => 0,
        (0, _) => 2,
        _ => 1,
    };
    deliver(f, send.send, Some(&e), send::from_scan(&scan, &e.vm, code))?;
    if r.mismatches() > 0 {
        Ok(1)
    } else if let Some(why) = &r.fabric_unchecked {
        Err(CannotRun(anyhow::anyhow!("{why}")))
    } else if r.unchecked() > 0 {
        let unread: Vec<String> = scan
            .gpus
            .iter()
            .filter(|g| !g.caps_readable)
            .map(|g| g.bdf.to_string())
            .collect();
        Err(CannotRun(anyhow::anyhow!(
            "the clique of {} GPU(s) ({}) could not be read: only the first 64 bytes of their \
             config space are readable; run as root",
            r.unchecked(),
            unread.join(", ")
        )))
    } else {
        Ok(0)
    }
}

/// The guest's path labels against the host's, with NVML's where the driver is loaded.
fn topo_report(root: &Path, e: &Expectation, nvml: Option<&Nvml>) -> guest_topo::TopoReport {
    let mut r = guest_topo::compare(root, e);
    if let Some(n) = nvml {
        r.add_nvml(|a, b| n.common_ancestor(a, b));
    }
    r
}

/// `topo`: each pair's path label in the guest against the host's (no CUDA needed); with
/// no expectation, the guest's own view (labels, NVML's labels, module ids and fabric).
fn run_topo(f: Format, sysfs: &SysfsArgs, expect: &ExpectArgs) -> Result<u8, CannotRun> {
    let Some((e, source)) = optional_expectation(expect, &sysfs.sysfs_root)? else {
        let scan = sysfs_scan::scan(&sysfs.sysfs_root)?;
        let bdfs: Vec<_> = scan.gpus.iter().map(|g| g.bdf).collect();
        let nvml = Nvml::open();
        let mut pairs = guest_topo::guest_view(&sysfs.sysfs_root, &bdfs);
        if let Some(n) = &nvml {
            pairs.add_nvml(|a, b| n.common_ancestor(a, b));
        }
        let view = render::GuestView {
            pairs,
            fabric: nvml
                .as_ref()
                .map(|n| fabric::judge(&fabric::read(n, &bdfs), None)),
            expectation: None,
            an_expectation_adds: render::EXPECTATION_ADDS.into(),
        };
        emit(f, &view, render::guest_view)?;
        return Ok(0);
    };
    let r = topo_report(&sysfs.sysfs_root, &e, Nvml::open().as_ref());
    emit(f, &r, |r| render::topo(r, &source.display().to_string()))?;
    Ok(u8::from(r.mismatches() > 0))
}

/// `peers`: peer access between every ordered pair, as the driver reports it.
fn run_peers(f: Format, sysfs: &SysfsArgs, expect: &ExpectArgs) -> Result<u8, CannotRun> {
    let expectation = optional_expectation(expect, &sysfs.sysfs_root)?;
    let gpus = open_gpus()?;
    let nvml = Nvml::open();
    let pairs = peers::probe(&gpus, nvml.as_ref())?;
    let reports = pair_reports(&pairs, expectation.as_ref(), in_vm());
    #[derive(Serialize)]
    struct Out<'a> {
        gpus: Vec<GpuInfo>,
        pairs: &'a [PeerCheck],
    }
    let out = Out {
        gpus: gpus.iter().map(GpuInfo::from).collect(),
        pairs: &pairs,
    };
    emit(f, &out, |o| render::peers(o.pairs))?;
    if f == Format::Table {
        print_summaries(&reports);
    }
    Ok(pair_exit(&reports))
}

/// `verify`: one-way writes across every pair, checked on the destination.
fn run_verify_command(
    f: Format,
    sysfs: &SysfsArgs,
    expect: &ExpectArgs,
    (mib, inject): (usize, &Injection),
) -> Result<u8, CannotRun> {
    let expectation = optional_expectation(expect, &sysfs.sysfs_root)?;
    let gpus = open_gpus()?;
    let modules = load_modules(&gpus)?;
    let nvml = Nvml::open();
    let pairs = peers::probe(&gpus, nvml.as_ref())?;
    let mut reports = pair_reports(&pairs, expectation.as_ref(), in_vm());
    let words = mib * (1 << 20) / 4;
    let scan = sysfs_scan::scan(&sysfs.sysfs_root).ok();
    let rounds = measure::plan_rounds(&gpus, &reports, scan.as_ref());
    measure::verify_by_rounds(&gpus, &modules, &mut reports, (words, inject), &rounds)?;
    let results: Vec<_> = reports.iter().filter_map(|r| r.verify.clone()).collect();
    judge_all(&mut reports, in_vm());
    emit(f, &results, |r| render::verify(r))?;
    if f == Format::Table {
        print_summaries(&reports);
    }
    Ok(pair_exit(&reports))
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
    (quick, verbose, across): (bool, bool, bool),
    (baseline, inject): (Option<&Report>, &Injection),
    send: &SendArgs,
) -> Result<u8, CannotRun> {
    let started = Instant::now();
    let expectation = optional_expectation(expect, &sysfs.sysfs_root)?;
    let mut phases = report::Phases {
        verbose,
        ..Default::default()
    };
    // The guest's side (sysfs, NVML, path labels, fabric) beside cuInit and the contexts,
    // which the driver serialises (bench/issue31.sh: `setup-probe`).
    let (gpus, guest) = std::thread::scope(|s| {
        let beside = s.spawn(|| guest_side(&sysfs.sysfs_root, expectation.as_ref()));
        let gpus = open_gpus();
        let guest = beside
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p));
        (gpus, guest)
    });
    let GuestSide {
        scan,
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
    let plan = if quick { Plan::QUICK } else { Plan::FULL };
    let ran = (rounds.as_slice(), Some(verify_walls.as_slice()));
    let round_records = measure::bench_by_rounds(sides, &flags, &mut reports, &plan, ran)?;
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
    r.nccl_topo = report_nccl_topo(r.scan.as_ref());
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
    std::process::exit(code.into())
}

/// What `report` reads of the guest besides CUDA: sysfs, the expectation's verdict,
/// NVML, the path labels and the fabric.
struct GuestSide {
    scan: Option<sysfs_scan::Scan>,
    expect_report: Option<expect::ExpectReport>,
    nvml: Option<Nvml>,
    topo: Option<guest_topo::TopoReport>,
    fabric: Option<fabric::FabricReport>,
}

fn guest_side(root: &Path, expectation: Option<&(Expectation, PathBuf)>) -> GuestSide {
    let scan = sysfs_scan::scan(root).ok();
    let expect_report = match (expectation, &scan) {
        (Some((e, src)), Some(s)) => Some(expect::compare(e, src, s)),
        _ => None,
    };
    let nvml = Nvml::open();
    let topo = expectation.map(|(e, _)| topo_report(root, e, nvml.as_ref()));
    let fabric = nvml.as_ref().zip(scan.as_ref()).map(|(n, s)| {
        let bdfs: Vec<_> = s.gpus.iter().map(|g| g.bdf).collect();
        fabric::judge(&fabric::read(n, &bdfs), expectation.map(|(e, _)| e))
    });
    GuestSide {
        scan,
        expect_report,
        nvml,
        topo,
        fabric,
    }
}

/// Prints the Prometheus text when asked, and sends the report when `--send` says so and
/// the host's expectation names a channel.
fn deliver(
    f: Format,
    send: bool,
    e: Option<&Expectation>,
    report: vfio_p2p_contract::GuestReport,
) -> Result<()> {
    if f == Format::Prometheus {
        print!("{}", send::prometheus(&report));
    }
    if !send {
        return Ok(());
    }
    match e.and_then(|e| e.report.as_ref()) {
        Some(ch) => send::send(ch, &report).with_context(|| {
            format!(
                "sending the report to the host (vsock CID 2, port {}): is the VM's vsock device there and `vfio-p2p collect` running?",
                ch.vsock_port
            )
        }),
        None => {
            tracing::warn!("the host's expectation names no report channel (vm.yaml verify: vsock); nothing sent");
            Ok(())
        }
    }
}

/// `--inject` items, each word within the `words` words checked.
fn parse_inject(items: &[String], words: usize) -> Result<Injection, CannotRun> {
    let i = Injection::parse(items).map_err(anyhow::Error::msg)?;
    if let Some(w) = i.out_of_range(words as u64) {
        return Err(CannotRun(anyhow::anyhow!(
            "--inject: word {w} is beyond the {words} words each pair's check writes"
        )));
    }
    Ok(i)
}

fn in_vm() -> bool {
    report::in_virtual_machine()
}

fn optional_expectation(args: &ExpectArgs, root: &Path) -> Result<Option<(Expectation, PathBuf)>> {
    match &args.expect {
        Some(_) => Ok(Some(expect::load(args.expect.as_deref(), root)?)),
        None if root.join(expect::FW_CFG_PATH).exists() => Ok(Some(expect::load(None, root)?)),
        None => Ok(None),
    }
}

/// The most a saved report may hold: every ordered pair of 64 GPUs is under 2 MiB.
const MAX_REPORT_BYTES: u64 = 16 << 20;

/// A saved report; `what` names its role in errors (`report` for `--from`, `baseline`
/// for `--baseline`). Read non-blocking from a regular file, at most [`MAX_REPORT_BYTES`].
fn load_report(path: &Path, what: &str) -> Result<Report> {
    let bytes = sysfs_scan::read_regular_file(path, MAX_REPORT_BYTES + 1)
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

/// `$NCCL_TOPO_FILE`, when set and not empty.
fn nccl_topo_env() -> Option<PathBuf> {
    std::env::var_os("NCCL_TOPO_FILE")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// `report`'s NCCL part: the file NCCL_TOPO_FILE names, checked; a file that cannot be
/// read is a problem of the check, not a reason to skip the measurements.
fn report_nccl_topo(scan: Option<&sysfs_scan::Scan>) -> Option<nccl_topo::NcclTopoCheck> {
    let path = nccl_topo_env()?;
    let scan = scan?;
    Some(
        nccl_topo::check_file(&path, scan).unwrap_or_else(|e| nccl_topo::NcclTopoCheck {
            file: path.display().to_string(),
            gpus: Vec::new(),
            nics: Vec::new(),
            problems: vec![format!("NCCL_TOPO_FILE cannot be used: {e}")],
        }),
    )
}

fn open_gpus() -> Result<Vec<Gpu>> {
    let gpus = peers::open_gpus()?;
    if gpus.len() < 2 {
        bail!("P2P needs at least two GPUs; CUDA sees {}", gpus.len());
    }
    Ok(gpus)
}

/// The kernels JIT-compiled for every GPU, a thread per GPU (the compile is the larger
/// part of the setup and each GPU's is independent).
fn load_modules(gpus: &[Gpu]) -> Result<Vec<Module<'_>>> {
    let loaded = std::thread::scope(|s| {
        let handles: Vec<_> = gpus
            .iter()
            .map(|g| s.spawn(move || Module::load(g)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect::<Result<Vec<_>, _>>()
    });
    Ok(loaded?)
}

/// `bench --simulate N`: the N-GPU schedule on the GPUs at hand (one GPU is enough).
fn run_simulated(
    f: Format,
    n: usize,
    (concurrent, verbose): (bool, bool),
    plan: &Plan,
) -> Result<u8, CannotRun> {
    let started = Instant::now();
    let mut phases = report::Phases {
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

fn pair_reports(
    pairs: &[PeerCheck],
    expectation: Option<&(Expectation, PathBuf)>,
    vm: bool,
) -> Vec<PairReport> {
    let mut out: Vec<PairReport> = pairs
        .iter()
        .map(|p| PairReport {
            src: p.src,
            dst: p.dst,
            peer: p.clone(),
            verify: None,
            bench: None,
            expected: None,
            expected_nvlinks: None,
            as_expected: false,
            summary: String::new(),
        })
        .collect();
    for r in &mut out {
        report::attach_expectation(r, expectation.map(|(e, _)| e));
    }
    judge_all(&mut out, vm);
    out
}

fn judge_all(reports: &mut [PairReport], vm: bool) {
    for r in reports {
        let (ok, summary) = report::judge_pair(r, vm, None);
        r.as_expected = ok;
        r.summary = summary;
    }
}

fn print_summaries(reports: &[PairReport]) {
    for p in reports {
        println!("{} → {}: {}", p.src, p.dst, p.summary);
    }
}

fn pair_exit(reports: &[PairReport]) -> u8 {
    u8::from(!reports.iter().all(|r| r.as_expected))
}
