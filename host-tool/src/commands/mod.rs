//! Glue between the CLI and the stages: each command reads, models, decides, emits.

pub mod bind;
pub mod check;
pub mod collect;
pub mod fabric;
pub mod gen;
pub mod hook;
pub mod kubevirt;
pub mod libvirt;
pub mod place;
pub mod plan;
pub mod qemu_wrap;
pub mod snapshot;
pub mod topo;
pub mod verdicts;

use std::process::ExitCode;

use crate::cli::{Cli, Command};
use vfio_p2p_read::synth;

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
        Command::Fabric(a) => fabric::run(&cli.global, a),
        Command::Gen(a) => gen::run(&cli.global, a),
        Command::Libvirt(a) => libvirt::run(&cli.global, a),
        Command::Check(a) => check::run(&cli.global, a),
        Command::Snapshot(a) => snapshot::run(&cli.global, a),
        Command::Collect(a) => collect::run(&cli.global, a),
        Command::Verdicts(a) => verdicts::run(&cli.global, a),
        Command::QemuWrap(a) => qemu_wrap::run(&cli.global, a),
        Command::Kubevirt(a) => kubevirt::run(&cli.global, a),
    }
}
