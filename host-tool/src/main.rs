use std::process::ExitCode;

use clap::Parser;
use vfio_p2p::cli::Cli;

fn main() -> ExitCode {
    let cli = Cli::parse();
    vfio_p2p::logging::init(cli.global.verbose);
    match vfio_p2p::commands::run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("vfio-p2p: error: {e:#}");
            ExitCode::from(2)
        }
    }
}
