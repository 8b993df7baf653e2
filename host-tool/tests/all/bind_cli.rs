//! `vfio-p2p bind|unbind` through the binary, on a sysfs tree in a temporary directory.
//! Plain files do not react like the kernel, so these cover what happens before and
//! instead of a kernel's reaction: refusals, dry runs, the lock, errors and rollback.
//! The kernel's side is simulated in the library tests and real in the nested-VM lab.

use std::fs;
use std::path::Path;
use std::time::Duration;

use assert_cmd::Command;
use predicates::prelude::*;
use vfio_p2p_bind::sim::write_tree;
use vfio_p2p_bind::BindLock;
use vfio_p2p_read::read_binding;
use vfio_p2p_read::synth::example;

const GPU: &str = "0000:05:00.0";
const AUDIO: &str = "0000:05:00.1";

fn host_tree() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    write_tree(&example("dual-socket-pcie").unwrap(), dir.path()).unwrap();
    dir
}

fn cmd(root: &Path) -> Command {
    let mut c = crate::cli::vfio_p2p();
    c.arg("--sysfs-root")
        .arg(root)
        .env_remove("VFIO_P2P_FAIL_AFTER");
    c
}

fn driver_override(root: &Path, bdf: &str) -> Option<String> {
    read_binding(root, bdf.parse().unwrap())
        .unwrap()
        .driver_override
}

#[test]
fn dry_run_prints_the_writes_and_changes_nothing() {
    let t = host_tree();
    cmd(t.path())
        .args(["bind", GPU, "--dry-run"])
        .assert()
        .success()
        .stdout(predicate::str::contains(format!(
            "{GPU}  nvidia → (dry run)  (named)  /dev/vfio/"
        )))
        .stdout(predicate::str::contains(format!(
            "echo vfio-pci > /sys/bus/pci/devices/{GPU}/driver_override"
        )))
        .stdout(predicate::str::contains(format!(
            "echo {AUDIO} > /sys/bus/pci/drivers_probe"
        )))
        .stdout(predicate::str::contains(format!("(function of {GPU})")));
    assert_eq!(driver_override(t.path(), GPU), None);
    assert!(!t.path().join("run/vfio-p2p").exists());
}

#[test]
fn the_readers_warnings_about_the_bound_devices_are_printed() {
    let t = host_tree();
    let numa = t
        .path()
        .join(format!("sys/bus/pci/devices/{GPU}/numa_node"));
    fs::write(&numa, "garbage\n").unwrap();
    let out = cmd(t.path())
        .args(["bind", GPU, "--dry-run"])
        .assert()
        .success();
    let stderr = String::from_utf8_lossy(&out.get_output().stderr).into_owned();
    let line = stderr
        .lines()
        .find(|l| l.starts_with("warning: ") && l.contains("numa_node"))
        .unwrap_or_else(|| panic!("no read warning on stderr: {stderr}"));
    assert!(line.contains(GPU) && line.contains("garbage"), "{line}");
    let json = cmd(t.path())
        .args(["bind", GPU, "--dry-run", "--format", "json"])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert!(
        v["read_warnings"][0].as_str().unwrap().contains("garbage"),
        "{v}"
    );
    // another GPU's warning stays out of this bind's output
    fs::write(&numa, "0\n").unwrap();
    let other = t.path().join("sys/bus/pci/devices/0000:06:00.0/numa_node");
    fs::write(other, "garbage\n").unwrap();
    cmd(t.path())
        .args(["bind", GPU, "--dry-run"])
        .assert()
        .success()
        .stderr(predicate::str::contains("garbage").not());
}

#[test]
fn dry_run_json_lists_every_device() {
    let t = host_tree();
    let out = cmd(t.path())
        .args(["bind", GPU, "--dry-run", "--format", "json"])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(v["dry_run"], true);
    assert_eq!(v["devices"][1]["bdf"], AUDIO);
    assert_eq!(v["devices"][1]["reason"], "other_function");
    assert_eq!(v["devices"][1]["of"], GPU);
    assert_eq!(v["devices"][0]["writes"].as_array().unwrap().len(), 3);
}

#[test]
fn a_kernel_that_does_not_move_the_driver_is_an_error_and_rolled_back() {
    let t = host_tree();
    cmd(t.path())
        .args(["bind", GPU])
        .assert()
        .code(2)
        .stderr(predicate::str::contains(format!(
            "{GPU}: after writing /sys/bus/pci/drivers_probe the device is on nvidia (driver_override vfio-pci), expected it bound to vfio-pci"
        )))
        .stderr(predicate::str::contains(format!("rolled back: {GPU} restored")));
    assert_eq!(driver_override(t.path(), GPU), None);
    let record = fs::read_to_string(t.path().join("run/vfio-p2p/state.json")).unwrap();
    assert!(!record.contains(GPU), "{record}");
}

#[test]
fn an_injected_failure_names_the_device_and_file() {
    let t = host_tree();
    cmd(t.path())
        .env("VFIO_P2P_FAIL_AFTER", "1")
        .args(["bind", GPU])
        .assert()
        .code(2)
        .stderr(predicate::str::contains(format!(
            "{GPU}: writing \"vfio-pci\" to /sys/bus/pci/devices/{GPU}/driver_override: injected failure of sysfs write 1"
        )));
    cmd(t.path())
        .env("VFIO_P2P_FAIL_AFTER", "zero")
        .args(["bind", GPU])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("VFIO_P2P_FAIL_AFTER=\"zero\""));
}

#[test]
fn refusals_name_the_problem() {
    let t = host_tree();
    cmd(t.path())
        .args(["bind", "0000:04:00.0"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("0000:04:00.0 is a PCI bridge"));
    cmd(t.path())
        .args(["bind", "0000:05:00.0/../x"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("is not a PCI address"));
    let proc_dir = t.path().join("proc/77");
    fs::create_dir_all(proc_dir.join("fd")).unwrap();
    fs::write(proc_dir.join("comm"), "nvidia-persiste\n").unwrap();
    std::os::unix::fs::symlink("/dev/nvidia0", proc_dir.join("fd/4")).unwrap();
    cmd(t.path())
        .args(["bind", GPU])
        .assert()
        .code(2)
        .stderr(predicate::str::contains(
            "in use on the host: nvidia-persiste (pid 77) holds /dev/nvidia0",
        ))
        .stderr(predicate::str::contains("--force"));
    crate::cli::vfio_p2p()
        .args(["--example", "flat-vm", "bind", GPU])
        .assert()
        .code(2)
        .stderr(predicate::str::contains(
            "pass a real sysfs root (--sysfs-root) to change bindings",
        ));
    crate::cli::vfio_p2p()
        .args([
            "--example",
            "flat-vm",
            "hook",
            "run",
            "vm0",
            "prepare",
            "begin",
            "-",
        ])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("--example is a made-up host"));
}

/// The README's tour runs bind/unbind on the examples as dry runs; they leave nothing behind.
#[test]
fn dry_runs_work_on_the_examples() {
    // A private TMPDIR: the example's temporary sysfs tree goes there, and other
    // processes using /tmp at the same time cannot disturb the count.
    let tmp = tempfile::tempdir().unwrap();
    crate::cli::vfio_p2p()
        .env("TMPDIR", tmp.path())
        .args([
            "--example",
            "dual-socket-pcie",
            "bind",
            "--dry-run",
            "05:00.0",
        ])
        .assert()
        .success()
        .stdout(predicate::str::contains(
            "0000:05:00.0  nvidia → (dry run)  (named)",
        ))
        .stdout(predicate::str::contains(
            "echo vfio-pci > /sys/bus/pci/devices/0000:05:00.1/driver_override",
        ));
    crate::cli::vfio_p2p()
        .env("TMPDIR", tmp.path())
        .args(["--example", "hgx-h100", "unbind", "--dry-run", "--all"])
        .assert()
        .success()
        .stdout("nothing to do\n");
    let left: Vec<_> = fs::read_dir(tmp.path())
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(
        left.is_empty(),
        "a dry run left its temporary tree behind: {left:?}"
    );
}

#[test]
fn a_held_lock_times_out_with_a_clear_message() {
    let t = host_tree();
    let _held = BindLock::acquire(t.path(), Duration::ZERO).unwrap();
    cmd(t.path())
        .args(["bind", GPU, "--lock-timeout", "0"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains(
            "another vfio-p2p bind/unbind/hook is running",
        ));
}

#[test]
fn unbind_needs_devices_or_all() {
    let t = host_tree();
    cmd(t.path()).arg("unbind").assert().code(2);
    cmd(t.path())
        .args(["unbind", "--all"])
        .assert()
        .success()
        .stdout("nothing to do\n");
    cmd(t.path())
        .args(["unbind", GPU])
        .assert()
        .success()
        .stdout(predicate::str::contains(format!(
            "{GPU}  nvidia → unchanged"
        )));
}
