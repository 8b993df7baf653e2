use std::process::ExitCode;

use clap::Parser;
use vfio_p2p::commands::Cli;

fn main() -> ExitCode {
    restore_sigpipe();
    // installed or linked as `qemu-system-*`, the binary is the QEMU wrapper
    let cli = Cli::parse_from(vfio_p2p::commands::qemu_wrap::argv0_dispatch(
        std::env::args_os().collect(),
    ));
    vfio_p2p::logging::init(cli.global.verbose);
    match vfio_p2p::commands::run(cli) {
        Ok(code) => code,
        Err(e) => {
            // `error: …`, as clap's usage errors and the log's error lines read
            eprintln!("error: {}", vfio_p2p_style::error_chain(e.as_ref()));
            ExitCode::from(2)
        }
    }
}

/// Rust ignores SIGPIPE, so `vfio-p2p topo | head` would panic in `print!`;
/// a command-line tool should end quietly like any other Unix filter.
fn restore_sigpipe() {
    // SAFETY: called first thing in main, before any thread exists; setting the
    // default disposition of SIGPIPE has no memory-safety implications.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}
