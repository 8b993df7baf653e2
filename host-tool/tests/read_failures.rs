//! Broken, truncated and hostile sysfs trees: each gives a clear error or a warning
//! naming the file, never a panic or a hang.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use assert_cmd::Command;
use proptest::prelude::*;
use tempfile::TempDir;
use vfio_p2p::emit::topo_report::{render_dot, render_table, TopoReport};
use vfio_p2p::model::Topology;
use vfio_p2p::read::{read_host, HostRecord};
use vfio_p2p::snapshot::write_sysfs_tree;
use vfio_p2p::synth;

const GPU: &str = "0000:03:00.0";

/// The lab example as a sysfs tree, and the directory of one of its GPUs.
fn lab_tree() -> (TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    write_sysfs_tree(&synth::example("lab").unwrap(), dir.path()).unwrap();
    let gpu = fs::canonicalize(dir.path().join("sys/bus/pci/devices").join(GPU)).unwrap();
    (dir, gpu)
}

/// Everything downstream of the reader, so a bad read cannot panic later either.
fn render_all(host: &HostRecord) {
    let topo = Topology::from_record(host);
    let report = TopoReport::new(&topo);
    render_table(&topo, &report);
    render_dot(&topo, &report);
    serde_json::to_string(&report).unwrap();
}

fn warnings(host: &HostRecord) -> Vec<String> {
    host.warnings.iter().map(|w| w.to_string()).collect()
}

#[test]
fn missing_root_names_the_path_and_the_fix() {
    let out = Command::cargo_bin("vfio-p2p")
        .unwrap()
        .args(["--sysfs-root", "/nonexistent/snap", "topo"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.contains("/nonexistent/snap/sys/bus/pci/devices"),
        "{err}"
    );
    assert!(err.contains("pass --sysfs-root"), "{err}");
}

#[test]
fn broken_symlink_skips_the_device_with_a_warning() {
    let (dir, gpu) = lab_tree();
    fs::remove_dir_all(&gpu).unwrap();
    let host = read_host(dir.path()).unwrap();
    assert!(!host.devices.iter().any(|d| d.bdf.to_string() == GPU));
    let w = warnings(&host);
    assert!(
        w.iter().any(|w| w.contains(GPU) && w.contains("vendor")),
        "{w:?}"
    );
    render_all(&host);
}

#[test]
fn link_leading_outside_sys_devices_is_refused() {
    let (dir, _) = lab_tree();
    let link = dir.path().join("sys/bus/pci/devices").join(GPU);
    fs::remove_file(&link).unwrap();
    symlink("../../../../../etc/pci0000:00/0000:03:00.0", &link).unwrap();
    let host = read_host(dir.path()).unwrap();
    assert!(!host.devices.iter().any(|d| d.bdf.to_string() == GPU));
    assert!(
        warnings(&host).iter().any(|w| w.contains("skipped")),
        "{:?}",
        warnings(&host)
    );
}

#[test]
fn truncated_config_keeps_the_gpu() {
    let (dir, gpu) = lab_tree();
    fs::write(gpu.join("config"), [0x34u8, 0x12, 0x11]).unwrap();
    let host = read_host(dir.path()).unwrap();
    let topo = Topology::from_record(&host);
    assert_eq!(topo.gpus().count(), 4);
    render_all(&host);
}

#[test]
fn capability_loop_does_not_hang() {
    let (dir, gpu) = lab_tree();
    let mut config = fs::read(gpu.join("config")).unwrap();
    config[0x41] = 0x40; // the PCIe capability points at itself
                         // and the extended list at 0x100 points back to itself
    config[0x102] = 0x01;
    config[0x103] = 0x10;
    fs::write(gpu.join("config"), &config).unwrap();
    let host = read_host(dir.path()).unwrap();
    render_all(&host);
    assert_eq!(Topology::from_record(&host).gpus().count(), 4);
}

/// Every attribute file the reader opens, as the writer lays them out.
const ATTRIBUTES: &[&str] = &[
    "vendor",
    "device",
    "class",
    "subsystem_vendor",
    "subsystem_device",
    "config",
    "numa_node",
    "local_cpulist",
    "driver_override",
    "resource",
    "current_link_speed",
    "current_link_width",
    "max_link_speed",
    "max_link_width",
    "reset_method",
];

fn overwrite(gpu: &Path, name: &str, bytes: &[u8]) {
    let p = gpu.join(name);
    let _ = fs::remove_file(&p);
    fs::write(&p, bytes).unwrap();
}

#[test]
fn garbage_in_every_attribute_file_is_a_warning() {
    for name in ATTRIBUTES {
        let (dir, gpu) = lab_tree();
        overwrite(&gpu, name, b"\xff\xfe garbage \x00\n0x");
        let host = read_host(dir.path()).unwrap_or_else(|e| panic!("{name}: {e}"));
        render_all(&host);
        let w = warnings(&host);
        if *name != "config" {
            assert!(
                w.iter().any(|w| w.contains(&format!("{GPU}/{name}"))),
                "{name}: no warning naming the file: {w:?}"
            );
        }
        if ["vendor", "device", "class"].contains(name) {
            assert!(
                w.iter().any(|w| w.contains("device skipped")),
                "{name}: {w:?}"
            );
        }
    }
}

#[test]
fn garbage_in_the_group_and_node_directories_is_a_warning() {
    let (dir, _) = lab_tree();
    fs::create_dir_all(
        dir.path()
            .join("sys/kernel/iommu_groups/not-a-number/devices"),
    )
    .unwrap();
    fs::write(
        dir.path().join("sys/devices/system/node/node0/cpulist"),
        "zero\n",
    )
    .unwrap();
    let host = read_host(dir.path()).unwrap();
    let w = warnings(&host);
    assert!(w.iter().any(|w| w.contains("not-a-number")), "{w:?}");
    assert!(w.iter().any(|w| w.contains("node0/cpulist")), "{w:?}");
    render_all(&host);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Random bytes in a random attribute file of a GPU and of a bridge above it.
    #[test]
    fn random_attribute_contents_never_panic(
        which in 0..ATTRIBUTES.len(),
        on_bridge in any::<bool>(),
        bytes in proptest::collection::vec(any::<u8>(), 0..300),
    ) {
        let (dir, gpu) = lab_tree();
        let target = if on_bridge { gpu.parent().unwrap().to_path_buf() } else { gpu };
        overwrite(&target, ATTRIBUTES[which], &bytes);
        let host = read_host(dir.path()).unwrap();
        render_all(&host);
    }
}
