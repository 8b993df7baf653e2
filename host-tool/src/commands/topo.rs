//! `vfio-p2p topo`.

use std::process::ExitCode;

use clap::Args;
use serde::Serialize;

use crate::cli::{DataFormat, GlobalArgs};
use crate::emit;
use crate::model::Topology;

#[derive(Debug, Args)]
pub struct TopoArgs {
    #[arg(long, value_enum, default_value_t)]
    pub format: DataFormat,
}

#[derive(Serialize)]
struct GpuEntry {
    index: usize,
    bdf: String,
    vendor: String,
    device: String,
    numa_node: Option<u32>,
    iommu_group: Option<u32>,
    driver: Option<String>,
}

#[derive(Serialize)]
struct TopoReport {
    gpus: Vec<GpuEntry>,
    matrix: Vec<Vec<String>>,
}

fn report(topo: &Topology) -> TopoReport {
    let gpus: Vec<_> = topo.gpus().collect();
    TopoReport {
        gpus: gpus
            .iter()
            .enumerate()
            .map(|(i, g)| GpuEntry {
                index: i,
                bdf: g.bdf.to_string(),
                vendor: format!("{:#06x}", g.vendor),
                device: format!("{:#06x}", g.device),
                numa_node: g.numa_node,
                iommu_group: g.iommu_group,
                driver: g.driver.clone(),
            })
            .collect(),
        matrix: gpus
            .iter()
            .map(|a| {
                gpus.iter()
                    .map(|b| topo.path(&a.bdf, &b.bdf).label())
                    .collect()
            })
            .collect(),
    }
}

pub fn run(global: &GlobalArgs, args: TopoArgs) -> anyhow::Result<ExitCode> {
    let topo = super::load_topology(global)?;
    let r = report(&topo);
    match emit::data::to_text(&r, args.format)? {
        Some(t) => print!("{t}"),
        None => {
            for row in &r.matrix {
                println!("{}", row.join("\t"));
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
