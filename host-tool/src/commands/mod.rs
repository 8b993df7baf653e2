//! Glue between the CLI and the stages: each command reads, models, decides, emits.

pub mod bind;
pub mod check;
pub mod gen;
pub mod hook;
pub mod libvirt;
pub mod place;
pub mod plan;
pub mod snapshot;
pub mod topo;

use std::process::ExitCode;

use anyhow::Context;

use crate::cli::{Cli, Command, GlobalArgs};
use crate::decide;
use crate::model::Topology;
use crate::read::{read_host, HostRecord};
use crate::synth;

pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    if cli.global.example.as_deref() == Some("list") {
        print!("{}", synth::example_list());
        return Ok(ExitCode::SUCCESS);
    }
    let Some(command) = cli.command else {
        anyhow::bail!("no command given; see vfio-p2p --help (start with: vfio-p2p topo)");
    };
    match command {
        Command::Topo(a) => topo::run(&cli.global, a),
        Command::Place(a) => place::run(&cli.global, a),
        Command::Plan(a) => plan::run(&cli.global, a),
        Command::Bind(a) => bind::run_bind(&cli.global, a),
        Command::Unbind(a) => bind::run_unbind(&cli.global, a),
        Command::Hook(a) => hook::run(&cli.global, a),
        Command::Gen(a) => gen::run(&cli.global, a),
        Command::Libvirt(a) => libvirt::run(&cli.global, a),
        Command::Check(a) => check::run(&cli.global, a),
        Command::Snapshot(a) => snapshot::run(&cli.global, a),
    }
}

/// The host facts the global options point at (a sysfs root or an embedded example).
pub fn load_host(global: &GlobalArgs) -> anyhow::Result<HostRecord> {
    match &global.example {
        Some(name) => synth::example(name).map_err(anyhow::Error::msg),
        None => read_host(&global.sysfs_root)
            .with_context(|| format!("reading the host below {}", global.sysfs_root.display())),
    }
}

/// The typed topology of `host` with the default NVLink source (an NVSwitch fabric)
/// applied, and the warnings about both.
pub fn model_host(host: &HostRecord) -> (Topology, Vec<String>) {
    let mut topo = Topology::from_record(host);
    let mut warnings: Vec<String> = topo.warnings.iter().map(ToString::to_string).collect();
    warnings.extend(decide::nvlink::apply_nvswitch_fabric(&mut topo));
    (topo, warnings)
}

/// The typed topology, with read warnings logged once.
pub fn load_topology(global: &GlobalArgs) -> anyhow::Result<Topology> {
    let (topo, warnings) = model_host(&load_host(global)?);
    for w in &warnings {
        tracing::warn!("{w}");
    }
    Ok(topo)
}
