//! `vfio-p2p plan`: which of a VM's GPUs share a GPUDirect clique, and why.

use std::process::ExitCode;

use anyhow::Context as _;
use clap::Args;
use pci_config::Bdf;

use crate::cli::GlobalArgs;
use crate::context::{Context, PlanOptionArgs};
use vfio_p2p_decide::clique_plan::plan;
use vfio_p2p_emit::data::DataFormat;

#[derive(Debug, Args)]
pub struct PlanArgs {
    /// The VM's GPUs (default: every GPU on the host).
    #[arg(long, value_delimiter = ',', value_name = "BDF,BDF,…")]
    pub gpus: Vec<Bdf>,
    #[command(flatten)]
    pub plan: PlanOptionArgs,
    /// List every GPU pair with the ACS control on its path (by default pairs across host
    /// bridges or sockets without a clique are only counted).
    #[arg(long)]
    pub details: bool,
    #[arg(long, value_enum, default_value_t)]
    pub format: DataFormat,
}

pub fn run(global: &GlobalArgs, args: PlanArgs) -> anyhow::Result<ExitCode> {
    let ctx = Context::load(global, &args.plan.host, &args.plan.nvlink)?;
    ctx.require_gpus("plan")?;
    let gpus = ctx.gpus(&args.gpus);
    ctx.warn_fabric(&gpus);
    let p = plan(&ctx.topo, &gpus, &ctx.plan_options(&args.plan, None))
        .with_context(|| format!("planning cliques on {}", ctx.topo.source))?;
    match vfio_p2p_emit::data::to_text(&p, args.format)? {
        Some(t) => print!("{t}"),
        None => print!("{}", vfio_p2p_emit::plan_table::table(&p, args.details)),
    }
    Ok(ExitCode::SUCCESS)
}
