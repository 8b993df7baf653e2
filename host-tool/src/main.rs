//! The `vfio-p2p` binary: parses the command line and runs the command; how the process
//! ends (SIGPIPE's default, `_exit` past an abandoned library call) is
//! `vfio-p2p-process-exit`'s.

#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::Parser;
use vfio_p2p::commands::Cli;

fn main() -> ExitCode {
    // Rust ignores SIGPIPE, so `vfio-p2p topo | head` would panic in `print!`; a
    // command-line tool ends quietly by the signal like any other Unix filter
    vfio_p2p_process_exit::restore_sigpipe_default();
    // installed or linked as `qemu-system-*`, the binary is the QEMU wrapper
    let cli = Cli::parse_from(vfio_p2p::commands::qemu_wrap::argv0_dispatch(
        std::env::args_os().collect(),
    ));
    vfio_p2p::logging::init(cli.global.verbose);
    let code = match vfio_p2p::commands::run(cli) {
        Ok(code) => code,
        Err(e) => {
            // `error: …`, as clap's usage errors and the log's error lines read
            eprintln!("error: {}", vfio_p2p_style::error_chain(e.as_ref()));
            ExitCode::from(2)
        }
    };
    if vfio_p2p_read::outside_call::a_call_was_abandoned() {
        // a thread left blocked inside a library (Fabric Manager's, past its call deadline)
        // may hold a lock exit handlers and library destructors wait for, and the hook
        // must return to libvirt within its deadline
        vfio_p2p_process_exit::exit_now(code);
    }
    code
}
