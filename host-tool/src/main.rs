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
    let code = match vfio_p2p::commands::run(cli) {
        Ok(code) => code,
        Err(e) => {
            // `error: …`, as clap's usage errors and the log's error lines read
            eprintln!("error: {}", vfio_p2p_style::error_chain(e.as_ref()));
            ExitCode::from(2)
        }
    };
    if vfio_p2p_read::outside_call::a_call_was_abandoned() {
        exit_past_a_blocked_library(code);
    }
    code
}

/// Ends the process at once with `code`, skipping exit handlers and library destructors: a
/// thread left blocked inside a library (Fabric Manager's, past its call deadline) may hold
/// a lock those wait for, and the hook must return to libvirt within its deadline.
fn exit_past_a_blocked_library(code: ExitCode) -> ! {
    use std::io::Write as _;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    let status = (0..=u8::MAX)
        .find(|&n| ExitCode::from(n) == code)
        .map_or(1, i32::from);
    // SAFETY: _exit only ends the process; everything this process writes went through the
    // flushed std streams or was written and closed before the command returned.
    unsafe { libc::_exit(status) }
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
