//! The one way the tests run the `vfio-p2p` binary.

use std::path::PathBuf;

use assert_cmd::Command;

/// The binary cargo built for this test run.
pub fn bin() -> PathBuf {
    assert_cmd::cargo::cargo_bin("vfio-p2p")
}

/// A command for the binary: add `.args`, `.env`, `.write_stdin`, then `.assert()` or `.output()`.
pub fn vfio_p2p() -> Command {
    Command::new(bin())
}
