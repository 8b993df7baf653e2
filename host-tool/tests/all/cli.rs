//! The one way the tests run the `vfio-p2p` binary.

use std::path::PathBuf;
use std::process::Output;

use assert_cmd::Command;

/// The binary cargo built for this test run.
pub fn bin() -> PathBuf {
    assert_cmd::cargo::cargo_bin("vfio-p2p")
}

/// A command for the binary: add `.args`, `.env`, `.write_stdin`, then `.assert()` or `.output()`.
pub fn vfio_p2p() -> Command {
    Command::new(bin())
}

/// Runs `cmd`, which must succeed (its stderr is the failure message); its stdout and
/// stderr as text.
pub fn succeeded(cmd: &mut Command) -> (String, String) {
    outcome_of_success(cmd.output().unwrap())
}

/// The stdout and stderr of a run that must have succeeded (its stderr is the failure
/// message).
pub fn outcome_of_success(out: Output) -> (String, String) {
    let (stdout, stderr) = (
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    );
    assert!(out.status.success(), "{stderr}");
    (stdout, stderr)
}
