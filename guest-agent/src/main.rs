//! vfio-p2p-agent: checks and measures GPU P2P inside a VM.
//!
//! Exit status: 0 all as expected, 1 a mismatch, 2 cannot run. The commands live in
//! `commands/`, one module each, as the host tool's do.

#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::Parser;

use vfio_p2p_agent::cli::Cli;

mod commands;

use commands::CannotRun;

fn main() -> ExitCode {
    commands::mark("main");
    vfio_p2p_style::init_logging("RUST_LOG", "warn");
    let cli = Cli::parse();
    match commands::run(&cli) {
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
