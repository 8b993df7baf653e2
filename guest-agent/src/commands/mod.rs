//! The agent's commands, one module each; this one dispatches and holds what several
//! share (output, the expectation, the GPUs and their kernels, the pairs' verdicts).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::Serialize;

use vfio_p2p_agent::cli::{Cli, Command, ExpectArgs, Format};
use vfio_p2p_agent::measure::PairReport;
use vfio_p2p_agent::peers::PeerCheck;
use vfio_p2p_agent::sysfs::place::Places;
use vfio_p2p_agent::sysfs::{expectation, GuestSysfs};
use vfio_p2p_agent::verify::Injection;
use vfio_p2p_agent::{guest_topo, kernels};
use vfio_p2p_contract::Expectation;
use vfio_p2p_cuda_driver::{Gpu, Module};
use vfio_p2p_nvml::Nvml;

mod bench;
mod children;
mod expect;
mod nccl;
mod nccl_topo;
mod peers;
mod report;
mod scan;
mod topo;
mod verify;

/// A failure that means the command could not do its job (exit 2).
pub struct CannotRun(pub anyhow::Error);

impl<E: Into<anyhow::Error>> From<E> for CannotRun {
    fn from(e: E) -> Self {
        CannotRun(e.into())
    }
}

/// Runs the command `cli` names: its exit status, or why it cannot run.
pub fn run(cli: &Cli) -> Result<u8, CannotRun> {
    let f = cli.format;
    let reports = matches!(cli.command, Command::Expect { .. } | Command::Report(_));
    if f == Format::Prometheus && !reports {
        return Err(CannotRun(anyhow::anyhow!(
            "--format prometheus is for expect and report"
        )));
    }
    match &cli.command {
        Command::Scan(s) => scan::run(f, s),
        Command::Expect {
            sysfs,
            expect,
            send,
        } => expect::run(f, sysfs, expect, send),
        Command::Topo { sysfs, expect } => topo::run(f, sysfs, expect),
        Command::Peers { sysfs, expect } => peers::run(f, sysfs, expect),
        Command::CrossProcess {
            handle,
            mib,
            same_gpu,
        } => children::run_cross_process(f, handle, *mib, *same_gpu),
        Command::CrossProcessChild { .. }
        | Command::CrossProcessGpu { .. }
        | Command::SetupProbe { .. } => children::run(&cli.command),
        Command::NcclTopo { file, sysfs } => nccl_topo::run(f, file.as_deref(), sysfs),
        Command::Nccl {
            nccl_lib,
            topo_file,
            mib,
            sysfs,
        } => nccl::run(f, (nccl_lib.as_deref(), topo_file.as_deref()), *mib, sysfs),
        Command::NcclRank {
            rank,
            nranks,
            id,
            gpu,
            bytes,
            nccl_lib,
        } => nccl::run_rank(nccl_lib, (*rank, *nranks, id), *gpu, *bytes),
        Command::Verify {
            sysfs,
            expect,
            mib,
            inject,
        } => {
            let inject = parse_inject(inject, mib * (1 << 20) / 4)?;
            verify::run(f, sysfs, expect, (*mib, &inject))
        }
        Command::Bench(a) => bench::run(f, a, cli.verbose),
        Command::Report(a) => report::run(f, a, cli.verbose),
    }
}

/// The exit status when standard output's reader went away (`| head`, `| true`): what a
/// shell reports for a process SIGPIPE ended, as the host tool ends (it keeps SIGPIPE's
/// default action; the agent stays free of `unsafe` and handles the write error instead).
pub(crate) const CLOSED_PIPE_EXIT: i32 = 128 + 13;

/// Writes `text` to standard output, as `print!` would, but ends the process quietly
/// (exit [`CLOSED_PIPE_EXIT`]) when the reader closed the pipe, where `print!` panics.
/// Any other write error ends it with exit 2 and the error.
pub(crate) fn write_stdout(text: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
            std::process::exit(CLOSED_PIPE_EXIT)
        }
        Err(e) => {
            eprintln!("vfio-p2p-agent: cannot run: writing standard output: {e}");
            std::process::exit(2)
        }
    }
}

pub(crate) fn emit<T: Serialize>(
    format: Format,
    value: &T,
    table: impl FnOnce(&T) -> String,
) -> Result<()> {
    match format {
        Format::Json => write_stdout(&(serde_json::to_string_pretty(value)? + "\n")),
        Format::Table => write_stdout(&table(value)),
        // expect and report print it through `deliver`; run() refuses it elsewhere
        Format::Prometheus => {}
    }
    Ok(())
}

/// With `VFIO_P2P_AGENT_MARKS` set (a bench aid: the H100 bench script (in git history; now `bench/compare-with-reference.sh`) takes the process's
/// start and end around it), `mark WHAT UNIX_NS` on stderr.
pub fn mark(what: &str) {
    if std::env::var_os("VFIO_P2P_AGENT_MARKS").is_some() {
        let ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        eprintln!("mark {what} {ns}");
    }
}

/// Prints the Prometheus text when asked, and sends the report when `--send` says so and
/// the host's expectation names a channel.
pub(crate) fn deliver(
    f: Format,
    send: bool,
    e: Option<&Expectation>,
    report: vfio_p2p_contract::GuestReport,
) -> Result<()> {
    if f == Format::Prometheus {
        write_stdout(&vfio_p2p_agent::send::prometheus(&report));
    }
    if !send {
        return Ok(());
    }
    match e.and_then(|e| e.report.as_ref()) {
        Some(ch) => vfio_p2p_agent::send::send(ch, &report).with_context(|| {
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
pub(crate) fn parse_inject(items: &[String], words: usize) -> Result<Injection, CannotRun> {
    let i = Injection::parse(items).map_err(anyhow::Error::msg)?;
    if let Some(w) = i.out_of_range(words as u64) {
        return Err(CannotRun(anyhow::anyhow!(
            "--inject: word {w} is beyond the {words} words each pair's check writes"
        )));
    }
    Ok(i)
}

pub(crate) fn in_vm() -> bool {
    vfio_p2p_agent::report::in_virtual_machine()
}

/// NVML when it starts. It is optional: absent, nothing is said; there but not loading or
/// not starting, a `warning: …` line on stderr says why (dlerror's reason and the fix),
/// and what needs NVML is reported unknown.
pub(crate) fn open_nvml() -> Option<Nvml> {
    match Nvml::open() {
        Ok(nvml) => Some(nvml),
        Err(why) => {
            if !why.is_absent() {
                eprintln!("warning: {why}; NVLink counts, module ids and fabric state are unknown");
            }
            None
        }
    }
}

pub(crate) fn optional_expectation(
    args: &ExpectArgs,
    root: &Path,
) -> Result<Option<(Expectation, PathBuf)>> {
    match &args.expect {
        Some(_) => Ok(Some(expectation::load(args.expect.as_deref(), root)?)),
        None if expectation::in_firmware(root) => Ok(Some(expectation::load(None, root)?)),
        None => Ok(None),
    }
}

pub(crate) fn open_gpus() -> Result<Vec<Gpu>> {
    let gpus = vfio_p2p_agent::peers::open_gpus()?;
    if gpus.len() < 2 {
        bail!("P2P needs at least two GPUs; CUDA sees {}", gpus.len());
    }
    Ok(gpus)
}

/// The kernels JIT-compiled for every GPU, a thread per GPU (the compile is the larger
/// part of the setup and each GPU's is independent).
pub(crate) fn load_modules(gpus: &[Gpu]) -> Result<Vec<Module<'_>>> {
    let loaded = std::thread::scope(|s| {
        let handles: Vec<_> = gpus
            .iter()
            .map(|g| s.spawn(move || kernels::load(g)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect::<Result<Vec<_>, _>>()
    });
    Ok(loaded?)
}

pub(crate) fn pair_reports(
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
            link_verdict: None,
            as_expected: false,
            summary: String::new(),
        })
        .collect();
    for r in &mut out {
        vfio_p2p_agent::report::attach_expectation(r, expectation.map(|(e, _)| e));
    }
    judge_all(&mut out, vm);
    out
}

pub(crate) fn judge_all(reports: &mut [PairReport], vm: bool) {
    for r in reports {
        let (ok, summary) = vfio_p2p_agent::report::judge_pair(r, vm, None);
        r.as_expected = ok;
        r.summary = summary;
    }
}

pub(crate) fn print_summaries(reports: &[PairReport]) {
    for p in reports {
        write_stdout(&format!("{} → {}: {}\n", p.src, p.dst, p.summary));
    }
}

pub(crate) fn pair_exit(reports: &[PairReport]) -> u8 {
    u8::from(!reports.iter().all(|r| r.as_expected))
}

/// How long `cross-process` with a child per GPU may take in all.
pub(crate) const CROSS_PROCESS_LIMIT: std::time::Duration = std::time::Duration::from_secs(60);

/// `$NCCL_TOPO_FILE`, when set and not empty.
pub(crate) fn nccl_topo_env() -> Option<PathBuf> {
    std::env::var_os("NCCL_TOPO_FILE")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// The guest's sysfs below `root`, read once, with the places of the GPUs `expectation`
/// names.
pub(crate) fn read_sysfs(root: &Path, expectation: Option<&(Expectation, PathBuf)>) -> GuestSysfs {
    let expected: Vec<_> = expectation
        .map(|(e, _)| e.gpus.iter().map(|g| g.guest_bdf).collect())
        .unwrap_or_default();
    GuestSysfs::read(root, &expected)
}

/// The guest's path labels against the host's, with NVML's where the driver is loaded.
pub(crate) fn topo_report(
    places: &Places,
    e: &Expectation,
    nvml: Option<&Nvml>,
) -> guest_topo::TopoReport {
    let mut r = guest_topo::compare(places, e);
    if let Some(n) = nvml {
        r.add_nvml(|a, b| n.common_ancestor(a, b));
    }
    r
}
