//! Issue 28, the second hostile-input probe: its reproducers that the other suites do not
//! hold (those are beside the code they test: `qemu_wrap`, `kubevirt`, `collector`,
//! `hook_cli`, `real_tools`, the agent's `hostile`), each run as a user would, within the
//! suite's limit and without a panic, abort or signal (`tests/hostile/support.rs`).

use crate::support;

use std::fs;
use std::path::{Path, PathBuf};

use assert_cmd::Command;
use support::{make_special, run_checked, Special};
use vfio_p2p_read::snapshot::write_sysfs_tree;
use vfio_p2p_read::synth::example;

/// The lab example's first GPU.
const LAB_GPU: &str = "0000:03:00.0";

fn tool() -> Command {
    crate::cli::vfio_p2p()
}

fn on_root(root: &Path, args: &[&str]) -> Command {
    let mut c = tool();
    c.arg("--sysfs-root").arg(root).args(args);
    c
}

fn lab_tree(dir: &Path) -> PathBuf {
    let root = dir.join("lab");
    write_sysfs_tree(&example("lab").unwrap(), &root).unwrap();
    root
}

fn device_dir(root: &Path, bdf: &str) -> PathBuf {
    fs::canonicalize(root.join("sys/bus/pci/devices").join(bdf)).unwrap()
}

/// A GPU whose `driver` link points at itself has no driver (it was reported with driver
/// "driver"), and a `config` linked to /dev/zero is "not a regular file" (it was "Too many
/// levels of symbolic links").
#[test]
fn links_that_name_no_driver_and_linked_attributes() {
    let t = tempfile::tempdir().unwrap();
    let root = lab_tree(t.path());
    let dev = device_dir(&root, LAB_GPU);
    fs::remove_file(dev.join("driver")).ok();
    std::os::unix::fs::symlink("driver", dev.join("driver")).unwrap();
    let o = run_checked(
        on_root(&root, &["topo", "--format", "json"]),
        None,
        "driver -> driver",
        &[],
    );
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    assert!(!o.stdout.contains("\"driver\": \"driver\""), "{}", o.stdout);
    assert!(
        o.stderr.contains("points at driver, not at a driver"),
        "{}",
        o.stderr
    );
    make_special(&dev.join("config"), Special::DevZero);
    let o = run_checked(on_root(&root, &["topo"]), None, "config -> /dev/zero", &[]);
    assert!(
        o.stderr.contains("config: unreadable: not a regular file"),
        "{}",
        o.stderr
    );
}

/// `check` reads the kernel release under `--sysfs-root` bounded and without blocking: a
/// 1 GiB sparse file aborted it (1 GiB allocation), a FIFO hung it, /dev/zero took 2 GB.
#[test]
fn a_hostile_kernel_release_never_blocks_or_exhausts_check() {
    let t = tempfile::tempdir().unwrap();
    let root = lab_tree(t.path());
    let release = root.join("proc/sys/kernel/osrelease");
    fs::create_dir_all(release.parent().unwrap()).unwrap();
    for kind in [Special::Sparse, Special::Fifo, Special::DevZero] {
        make_special(&release, kind);
        let o = run_checked(
            on_root(&root, &["check", "--format", "json"]),
            None,
            &format!("osrelease: {kind:?}"),
            &[],
        );
        assert!(
            o.stdout.len() < 1 << 20,
            "{kind:?}: {} bytes",
            o.stdout.len()
        );
    }
    fs::remove_file(&release).unwrap();
    fs::write(&release, format!("6.1.0\n{}", "x".repeat(100 << 20))).unwrap();
    let o = run_checked(
        on_root(&root, &["check", "--format", "json"]),
        None,
        "100 MB",
        &[],
    );
    assert!(o.stdout.len() < 1 << 20, "echoed: {} bytes", o.stdout.len());
}

/// `gen --name` is checked as vm.yaml's `name:` is: a newline started a new Proxmox config
/// line (`args: …`), and 100k characters went through.
#[test]
fn gen_name_is_validated_like_the_configs() {
    for name in ["vm\nargs: -cpu host,kvm=off", &"x".repeat(100_000), "-vm"] {
        let o = run_checked(
            {
                let mut c = tool();
                c.args([
                    "--example",
                    "lab",
                    "gen",
                    "proxmox",
                    &format!("--name={name}"),
                ]);
                c
            },
            None,
            "gen --name",
            &["--name"],
        );
        assert_eq!(o.code, Some(2), "{}", o.stdout);
        assert!(o.stdout.is_empty(), "{}", o.stdout);
        assert!(
            o.stderr.contains("--name: name ") && o.stderr.contains("use 1-64 letters"),
            "{}",
            o.stderr
        );
        assert!(
            o.stderr.len() < 1000,
            "the name is cut short: {}",
            o.stderr.len()
        );
    }
}
