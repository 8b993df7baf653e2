//! What a newcomer meets first: help texts and the address forms other tools print.

use assert_cmd::Command;
use predicates::prelude::*;
use predicates::str::contains;

fn vfio_p2p() -> Command {
    let mut c = crate::cli::vfio_p2p();
    // help unwrapped, so that its sentences can be looked for whole
    c.env("COLUMNS", "1000");
    c
}

fn stdout_of(args: &[&str]) -> String {
    let out = vfio_p2p().args(args).output().unwrap();
    String::from_utf8(out.stdout).unwrap() + &String::from_utf8(out.stderr).unwrap()
}

#[test]
fn hook_help_says_what_applies() {
    let install = stdout_of(&["hook", "install", "--help"]);
    assert!(!install.contains("--example"), "{install}");
    assert!(
        install.contains("written into the hook script"),
        "{install}"
    );
    vfio_p2p()
        .args([
            "--example",
            "lab",
            "hook",
            "install",
            "--prefix",
            "/nonexistent",
        ])
        .assert()
        .code(2)
        .stderr(contains("--example does not apply"));
    let run = stdout_of(&["hook", "run", "--help"]);
    assert!(
        run.contains("the guest's name, the operation (prepare"),
        "{run}"
    );
}

#[test]
fn usage_lines_name_every_way_to_call() {
    vfio_p2p().arg("place").assert().code(2).stderr(contains(
        "Usage: vfio-p2p place <--shape <COUNTxGPUS>|--vm <NAME=COUNT>>",
    ));
    vfio_p2p()
        .arg("unbind")
        .assert()
        .code(2)
        .stderr(contains("Usage: vfio-p2p unbind <BDF|--all>"));
    let place = stdout_of(&["place", "--help"]);
    assert!(place.contains("how many GPUs it gets"), "{place}");
    vfio_p2p()
        .args([
            "--example",
            "hgx-h100",
            "place",
            "--vm",
            "a=2",
            "--shape",
            "1x2",
        ])
        .assert()
        .code(2)
        .stderr(contains("cannot be used with"));
}

fn plan_pairs(gpus: &str) -> serde_json::Value {
    let out = vfio_p2p()
        .args([
            "--example",
            "dual-socket-pcie",
            "plan",
            "--format",
            "json",
            "--gpus",
            gpus,
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn lspci_and_nvidia_smi_addresses_are_taken_and_normalised() {
    let canonical = plan_pairs("0000:05:00.0,0000:06:00.0");
    assert_eq!(plan_pairs("05:00.0,06:00.0"), canonical);
    assert_eq!(plan_pairs("00000000:05:00.0,00000000:06:00.0"), canonical);
    for junk in [
        "7:00.0",
        "0000:07:00",
        "00000:07:00.0",
        "10000000:07:00.0",
        "07:00.0/x",
    ] {
        vfio_p2p()
            .args(["--example", "dual-socket-pcie", "plan", "--gpus", junk])
            .assert()
            .code(2)
            .stderr(contains("is not a PCI address").and(contains(junk)));
    }
    vfio_p2p()
        .args([
            "--example",
            "dual-socket-pcie",
            "bind",
            "--dry-run",
            "00000000:05:00.0",
        ])
        .assert()
        .success()
        .stdout(contains("0000:05:00.0  nvidia"));
    // Like --gpus, bind takes a comma list too.
    vfio_p2p()
        .args([
            "--example",
            "dual-socket-pcie",
            "bind",
            "--dry-run",
            "05:00.0,06:00.0",
        ])
        .assert()
        .success()
        .stdout(contains("0000:05:00.0  nvidia").and(contains("0000:06:00.0  nvidia")));
}
