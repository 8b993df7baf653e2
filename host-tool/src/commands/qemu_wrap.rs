//! `vfio-p2p qemu-wrap [--qemu PATH] -- QEMU-ARGS…`, also run as `qemu-system-x86_64`
//! (argv[0] dispatch): adds the planned cliques to the command line's `vfio-pci` devices
//! that lack one, says so on stderr (libvirt's domain log), and execs QEMU with the
//! command line otherwise unchanged, so its pid, exit status, signals and fds are QEMU's.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Args;
use pci_config::Bdf;

use crate::cli::GlobalArgs;
use crate::context::source::{HostConfigFrom, HostSource};
use crate::context::{Context, Needs, PlanOptionArgs};
use vfio_p2p_config::host::{HookPolicy, HostConfig};
use vfio_p2p_contract::CLIQUE_PROPERTY;
use vfio_p2p_emit::qemu::QEMU_BINARY;
use vfio_p2p_emit::qemu_argv_patch::{argv_text, with_cliques, CliqueAdded};
use vfio_p2p_model::qemu_argv::CliqueSource;
use vfio_p2p_model::qemu_argv::QemuArgvFacts;
use vfio_p2p_read::qemu_argv::read_qemu_argv;

/// Names under which the binary acts as the wrapper (argv[0]).
const QEMU_NAME_PREFIX: &str = "qemu-system-";

#[derive(Debug, Args)]
pub struct QemuWrapArgs {
    /// The QEMU to run (default: for `qemu-system-*` argv[0], NAME.real beside it, else
    /// /usr/bin/NAME; for `qemu-wrap`, qemu-system-x86_64 from PATH).
    #[arg(long, value_name = "PATH")]
    pub qemu: Option<PathBuf>,
    /// Set by argv[0] dispatch: the name the wrapper was started as.
    #[arg(long, hide = true, value_name = "ARGV0")]
    pub argv0: Option<OsString>,
    #[command(flatten)]
    pub plan: PlanOptionArgs,
    /// QEMU's arguments, after `--`.
    #[arg(last = true, allow_hyphen_values = true, num_args = 0..)]
    pub qemu_args: Vec<OsString>,
}

/// `qemu-system-x86_64 ARGS…` (the binary installed or linked under that name) becomes
/// `vfio-p2p qemu-wrap --argv0 qemu-system-x86_64 -- ARGS…`; other names pass unchanged.
pub fn argv0_dispatch(args: Vec<OsString>) -> Vec<OsString> {
    let is_qemu = args
        .first()
        .and_then(|a| Path::new(a).file_name())
        .and_then(OsStr::to_str)
        .is_some_and(|n| n.starts_with(QEMU_NAME_PREFIX));
    if !is_qemu {
        return args;
    }
    let mut it = args.into_iter();
    let argv0 = it.next().unwrap_or_default();
    let mut out: Vec<OsString> = vec!["vfio-p2p".into(), "qemu-wrap".into(), "--argv0".into()];
    out.push(argv0);
    out.push("--".into());
    out.extend(it);
    out
}

pub fn run(global: &GlobalArgs, args: QemuWrapArgs) -> anyhow::Result<ExitCode> {
    let qemu = real_qemu(&args)?;
    let argv0 = args
        .argv0
        .clone()
        .unwrap_or_else(|| qemu.clone().into_os_string());
    let text = argv_text(&args.qemu_args);
    let facts = read_qemu_argv(&text);
    let mut final_args = args.qemu_args.clone();
    if !facts.vfio.is_empty() {
        for u in &facts.unreadable {
            tracing::warn!("qemu-wrap: left as written: {u}");
        }
        for d in facts.vfio.iter().filter(|d| d.host.is_none()) {
            tracing::warn!(
                "qemu-wrap: -device {}: left without a clique: neither host= nor sysfsdev= names a PCI address",
                text[d.arg_index]
            );
        }
        let source = HostSource::of(global);
        let config = source.host_config(
            args.plan.host.host_config.as_deref(),
            HostConfigFrom::FlagOrInstalled,
        )?;
        let policy = config.hook_policy;
        match planned_args(source, &args.plan, config, &facts, &args.qemu_args) {
            Ok((edited, added)) => {
                log_added(&added);
                final_args = edited;
            }
            Err(e) => {
                let why = vfio_p2p_style::error_chain(e.as_ref());
                match policy {
                    HookPolicy::Deny => anyhow::bail!(
                        "qemu-wrap: not starting QEMU: cliques could not be planned: {why} (hook_policy: deny)"
                    ),
                    HookPolicy::Warn => tracing::warn!(
                        "qemu-wrap: cliques could not be planned: {why}; QEMU starts without them (hook_policy: warn)"
                    ),
                }
            }
        }
    }
    let err = std::process::Command::new(&qemu)
        .arg0(&argv0)
        .args(&final_args)
        .exec();
    Err(anyhow::anyhow!(
        "qemu-wrap: could not run {}: {err}",
        qemu.display()
    ))
}

/// The plan for the command line's GPUs and the argv with their cliques added.
fn planned_args(
    source: HostSource,
    plan_args: &PlanOptionArgs,
    config: HostConfig,
    facts: &QemuArgvFacts,
    args: &[OsString],
) -> anyhow::Result<(Vec<OsString>, Vec<CliqueAdded>)> {
    let ctx = Context::build(source, config, &Needs::nvlink(&plan_args.nvlink))?;
    // QEMU's log is not the place for the host's read warnings (`vfio-p2p topo` shows them).
    for w in ctx.warnings.iter().chain(&ctx.fabric_notes) {
        tracing::debug!("{w}");
    }
    let gpus: Vec<Bdf> = facts
        .vfio
        .iter()
        .filter_map(|d| d.host)
        .filter(|b| ctx.topo.device(b).is_some_and(|d| d.is_gpu()))
        .collect();
    let p = ctx.plan_as("qemu-wrap: ", &gpus, &ctx.plan_options(plan_args, None))?;
    let cliques: BTreeMap<Bdf, u8> = gpus
        .iter()
        .filter_map(|g| Some((*g, p.clique_of(g)?)))
        .collect();
    for d in &facts.vfio {
        let (Some(have), Some(host)) = (&d.clique, d.host) else {
            continue;
        };
        let want = cliques.get(&host).map(u8::to_string);
        if want.as_deref() != Some(have.as_str()) {
            let written = match d.clique_source {
                Some(CliqueSource::Global) => {
                    format!(" (from -global {}.{CLIQUE_PROPERTY})", d.driver)
                }
                _ => String::new(),
            };
            tracing::warn!(
                "qemu-wrap: {host} keeps {CLIQUE_PROPERTY}={have} as written{written}; the plan says {}",
                want.unwrap_or_else(|| "none".into())
            );
        }
    }
    Ok(with_cliques(args, facts, &cliques))
}

fn log_added(added: &[CliqueAdded]) {
    for a in added {
        eprintln!(
            "vfio-p2p qemu-wrap: {} ({}): added {CLIQUE_PROPERTY}={}",
            a.id.as_deref().unwrap_or("vfio-pci"),
            a.host,
            a.clique
        );
    }
}

/// The QEMU binary to exec, never this binary itself (that would loop).
fn real_qemu(args: &QemuWrapArgs) -> anyhow::Result<PathBuf> {
    if let Some(q) = &args.qemu {
        return Ok(q.clone());
    }
    let Some(argv0) = &args.argv0 else {
        return Ok(PathBuf::from(QEMU_BINARY));
    };
    let name = Path::new(argv0)
        .file_name()
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(QEMU_BINARY));
    let me = std::env::current_exe()
        .and_then(std::fs::canonicalize)
        .context("finding this binary (to not run it as QEMU)")?;
    let invoked = if Path::new(argv0).components().count() > 1 {
        Some(PathBuf::from(argv0))
    } else {
        find_in_path(&name)
    };
    let mut candidates = Vec::new();
    if let Some(p) = invoked {
        let mut real = p.into_os_string();
        real.push(".real");
        candidates.push(PathBuf::from(real));
    }
    candidates.push(Path::new("/usr/bin").join(&name));
    candidates
        .into_iter()
        .find(|c| std::fs::canonicalize(c).is_ok_and(|c| c != me))
        .with_context(|| {
            format!(
                "started as {} but found no QEMU to run: put the real one at {}.real (dpkg-divert --rename) or /usr/bin, or pass --qemu",
                Path::new(argv0).display(),
                Path::new(argv0).display()
            )
        })
}

fn find_in_path(name: &Path) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}
