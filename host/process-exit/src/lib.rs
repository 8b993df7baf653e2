//! How the `vfio-p2p` process ends, the two libc calls std does not make for it:
//!
//! - [`restore_sigpipe_default`]: Rust's runtime ignores SIGPIPE, so a write into a pipe
//!   whose reader is gone (`vfio-p2p topo | head -1`) fails with `EPIPE` and `print!`
//!   panics; a command-line tool should end by the signal, quietly, like any Unix filter
//!   (signal(7): SIGPIPE's default action terminates the process).
//! - [`exit_now`]: ends the process with `_exit(2)`, skipping `atexit` handlers and library
//!   destructors, after flushing std's streams: a thread left blocked inside a library
//!   (Fabric Manager's, past its call deadline) may hold a lock those would wait for.
//!
//! Each `unsafe` has its `// SAFETY:` line; callers get a safe API.

use std::io::Write as _;
use std::process::ExitCode;

/// Gives SIGPIPE back its default action (terminate), which Rust's runtime set to ignore
/// before `main`. Call it first thing in `main`.
pub fn restore_sigpipe_default() {
    // SAFETY: signal(2) only sets the process's disposition of SIGPIPE; SIG_DFL installs
    // no handler, so no Rust code ever runs in signal context, and no memory is touched.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// The status `_exit` takes for `code` (`ExitCode` keeps its byte private); 1 where none
/// matches, as std maps a failure.
fn status_of(code: ExitCode) -> i32 {
    (0..=u8::MAX)
        .find(|&n| ExitCode::from(n) == code)
        .map_or(1, i32::from)
}

/// Flushes standard output and error, then ends the process at once with `code`, skipping
/// exit handlers and library destructors.
pub fn exit_now(code: ExitCode) -> ! {
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    let status = status_of(code);
    // SAFETY: _exit(2) only ends the process; everything written through std's streams was
    // flushed above, and no Rust value is used after it (it does not return).
    unsafe { libc::_exit(status) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;
    use std::process::Command;

    /// Set in the copy of this test binary a test runs as its child, naming what it does.
    const CHILD: &str = "VFIO_P2P_PROCESS_EXIT_CHILD";

    /// This test binary again, running only `test` with `CHILD=what`.
    fn child(test: &str, what: &str) -> std::process::Output {
        Command::new(std::env::current_exe().unwrap())
            .args(["--exact", test, "--test-threads=1", "--nocapture"])
            .env(CHILD, what)
            .output()
            .unwrap()
    }

    /// Writes into a pipe whose reader is closed; exits 3 when the write came back.
    fn write_into_a_closed_pipe() -> ! {
        let (reader, mut writer) = std::io::pipe().unwrap();
        drop(reader);
        let result = writer.write_all(b"x");
        eprintln!("the write came back: {result:?}");
        std::process::exit(3)
    }

    #[test]
    fn with_the_default_restored_a_closed_pipe_ends_the_process_by_sigpipe() {
        match std::env::var(CHILD).as_deref() {
            Ok("restored") => {
                restore_sigpipe_default();
                write_into_a_closed_pipe()
            }
            Ok("ignored") => write_into_a_closed_pipe(),
            _ => {}
        }
        let me = "tests::with_the_default_restored_a_closed_pipe_ends_the_process_by_sigpipe";
        let out = child(me, "restored");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.signal(), Some(libc::SIGPIPE), "{err}");
        // Rust's own disposition, which the call changes: the write fails, the process lives
        let out = child(me, "ignored");
        assert_eq!(out.status.code(), Some(3), "{out:?}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("Broken pipe"));
    }

    #[test]
    fn exit_now_flushes_standard_output_and_ends_with_the_code() {
        if std::env::var(CHILD).as_deref() == Ok("exit") {
            // no newline: std's stdout holds it until a flush
            print!("written before the exit");
            exit_now(ExitCode::from(7))
        }
        let out = child(
            "tests::exit_now_flushes_standard_output_and_ends_with_the_code",
            "exit",
        );
        assert_eq!(out.status.code(), Some(7), "{out:?}");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(stdout.contains("written before the exit"), "{stdout}");
    }

    #[test]
    fn exit_codes_keep_their_status() {
        assert_eq!(status_of(ExitCode::SUCCESS), 0);
        assert_eq!(status_of(ExitCode::FAILURE), 1);
        assert_eq!(status_of(ExitCode::from(2)), 2);
        assert_eq!(status_of(ExitCode::from(255)), 255);
    }
}
