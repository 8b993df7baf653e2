//! `vfio-p2p check`: host preflight for GPU pass-through with P2P.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Args;
use pci_config::Bdf;

use crate::cli::GlobalArgs;
use crate::context::{Context, PlanOptionArgs};
use crate::decide::check::{self, QemuVersion, Vmm, VmmFacts};
use crate::decide::plan::plan;
use crate::emit;
use crate::emit::data::DataFormat;
use crate::host_probe;

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// The VM's GPUs (default: every GPU on the host).
    #[arg(long, value_delimiter = ',', value_name = "BDF,BDF,…")]
    pub gpus: Vec<Bdf>,
    #[command(flatten)]
    pub plan: PlanOptionArgs,
    /// libvirt domain XML of the VM (hidden hypervisor, 64-bit MMIO window).
    #[arg(long, value_name = "FILE")]
    pub domain_xml: Option<PathBuf>,
    /// QEMU binary that will run the VM; its `--version` decides clique placement.
    #[arg(long, value_name = "PATH")]
    pub qemu: Option<PathBuf>,
    /// The VM's QEMU command line, to inspect for `-cpu …,kvm=off` and `pci-hole64-size=`.
    #[arg(long, value_name = "STRING", allow_hyphen_values = true)]
    pub qemu_args: Option<String>,
    /// The VMM that will run the VM.
    #[arg(long, value_enum, default_value_t)]
    pub vmm: Vmm,
    /// Also open each GPU through VFIO. WARNING: opening a device resets it.
    #[arg(long)]
    pub deep: bool,
    #[arg(long, value_enum, default_value_t)]
    pub format: DataFormat,
}

fn qemu_version(path: &PathBuf) -> Result<QemuVersion, String> {
    let out = std::process::Command::new(path)
        .arg("--version")
        .output()
        .map_err(|e| format!("running {} --version: {e}", path.display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    QemuVersion::parse(&text).ok_or_else(|| {
        format!(
            "{} --version printed no 'version X.Y.Z': {}",
            path.display(),
            text.lines().next().unwrap_or("")
        )
    })
}

fn vmm_facts(args: &CheckArgs) -> anyhow::Result<VmmFacts> {
    let mut facts = VmmFacts {
        vmm: args.vmm,
        qemu_version: args.qemu.as_ref().map(qemu_version),
        ..VmmFacts::default()
    };
    if let Some(f) = &args.domain_xml {
        let text = std::fs::read_to_string(f)
            .with_context(|| format!("reading --domain-xml {}", f.display()))?;
        let (hidden, hole64) = check::inspect_domain_xml(&text, &f.display().to_string())?;
        facts.hidden_hypervisor.extend(hidden);
        facts.hole64 = hole64.map(|h| (h, f.display().to_string()));
    }
    if let Some(a) = &args.qemu_args {
        facts
            .hidden_hypervisor
            .extend(check::hidden_in_qemu_args(a));
        if let Some(h) = check::hole64_in_qemu_args(a) {
            facts.hole64 = Some((h, "--qemu-args".into()));
        }
    }
    Ok(facts)
}

pub fn run(global: &GlobalArgs, args: CheckArgs) -> anyhow::Result<ExitCode> {
    let ctx = Context::load(global, &args.plan.host, &args.plan.nvlink)?;
    let topo = &ctx.topo;
    let gpus = ctx.gpus(&args.gpus);
    for g in &gpus {
        anyhow::ensure!(
            topo.device(g).is_some_and(|d| d.is_gpu()),
            "{g}: not a GPU on {}; `vfio-p2p topo` lists them",
            topo.source
        );
    }
    if args.deep {
        tracing::warn!("--deep opens every selected GPU through VFIO, which resets it");
    }
    let host = if global.example.is_some() {
        host_probe::not_probed("an embedded example has no live host", topo, &gpus)
    } else if global.sysfs_root.is_file() {
        host_probe::not_probed("a snapshot file has no /dev", topo, &gpus)
    } else {
        host_probe::gather(&global.sysfs_root, topo, &gpus, args.deep)
    };
    let vmm = vmm_facts(&args)?;
    let p = plan(topo, &gpus, &ctx.plan_options(&args.plan, None));
    let report = check::run_checks(topo, &gpus, &host, &vmm, &p);
    match emit::data::to_text(&report, args.format)? {
        Some(t) => print!("{t}"),
        None => print!("{}", emit::check::table(&report)),
    }
    Ok(ExitCode::from(report.exit_code()))
}
