//! Broken, truncated and hostile sysfs trees: each gives a clear error or a warning
//! naming the file, never a panic or a hang.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use proptest::prelude::*;
use tempfile::TempDir;
use vfio_p2p_emit::topo_dot::render_dot;
use vfio_p2p_emit::topo_report::{render_table, HostTopoReport};
use vfio_p2p_model::HostRecord;
use vfio_p2p_model::Topology;
use vfio_p2p_read::read_host;
use vfio_p2p_read::snapshot::write_sysfs_tree;
use vfio_p2p_read::synth;

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
    let report = HostTopoReport::new(&topo);
    render_table(&topo, &report);
    render_dot(&topo, &report);
    serde_json::to_string(&report).unwrap();
}

fn warnings(host: &HostRecord) -> Vec<String> {
    host.warnings.iter().map(|w| w.to_string()).collect()
}

#[test]
fn missing_root_names_the_path_and_the_fix() {
    let out = crate::cli::vfio_p2p()
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

/// Every attribute file the reader may open, as the writer lays them out.
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

/// What the reader opens for a PCIe endpoint whose full config space is readable:
/// IDs and link facts come from config space.
const READ_WITH_FULL_CONFIG: &[&str] = &[
    "class",
    "config",
    "numa_node",
    "local_cpulist",
    "driver_override",
    "resource",
    "reset_method",
];

/// Read when config space is the unprivileged 64 bytes (no capability list).
const LINK_FILES: &[&str] = &[
    "current_link_speed",
    "current_link_width",
    "max_link_speed",
    "max_link_width",
];

/// Read only when config space is shorter than its 64-byte header.
const ID_FILES: &[&str] = &["vendor", "device", "subsystem_vendor", "subsystem_device"];

const GARBAGE: &[u8] = b"\xff\xfe garbage \x00\n0x";

fn overwrite(gpu: &Path, name: &str, bytes: &[u8]) {
    let p = gpu.join(name);
    let _ = fs::remove_file(&p);
    fs::write(&p, bytes).unwrap();
}

fn gpu_record(host: &HostRecord) -> Option<&vfio_p2p_model::DeviceRecord> {
    host.devices.iter().find(|d| d.bdf.to_string() == GPU)
}

/// Garbage in `name` of the GPU, read back: a warning naming the file; a device
/// skipped when `skips`.
fn assert_garbage_warns(dir: &TempDir, gpu: &Path, name: &str, skips: bool) {
    overwrite(gpu, name, GARBAGE);
    let host = read_host(dir.path()).unwrap_or_else(|e| panic!("{name}: {e}"));
    render_all(&host);
    let w = warnings(&host);
    if name != "config" {
        assert!(
            w.iter().any(|w| w.contains(&format!("{GPU}/{name}"))),
            "{name}: no warning naming the file: {w:?}"
        );
    }
    assert_eq!(gpu_record(&host).is_none(), skips, "{name}: {w:?}");
    if skips {
        assert!(
            w.iter().any(|w| w.contains("device skipped")),
            "{name}: {w:?}"
        );
    }
}

#[test]
fn garbage_in_every_attribute_file_read_is_a_warning() {
    for name in READ_WITH_FULL_CONFIG {
        let (dir, gpu) = lab_tree();
        // A bad class file falls back to config's class; a bad config to the files.
        assert_garbage_warns(&dir, &gpu, name, false);
    }
}

#[test]
fn garbage_in_link_files_of_the_unprivileged_view_is_a_warning() {
    for name in LINK_FILES {
        let dir = tempfile::tempdir().unwrap();
        let host = synth::example("lab").unwrap().unprivileged_view();
        write_sysfs_tree(&host, dir.path()).unwrap();
        let gpu = fs::canonicalize(dir.path().join("sys/bus/pci/devices").join(GPU)).unwrap();
        assert_garbage_warns(&dir, &gpu, name, false);
    }
}

#[test]
fn garbage_in_id_files_with_garbage_config_is_a_warning() {
    for name in ID_FILES.iter().chain(LINK_FILES).chain(&["class"]) {
        let (dir, gpu) = lab_tree();
        overwrite(&gpu, "config", GARBAGE);
        let skips = ["vendor", "device", "class"].contains(name);
        assert_garbage_warns(&dir, &gpu, name, skips);
    }
}

#[test]
fn attribute_files_that_config_space_answers_are_not_read() {
    let (dir, gpu) = lab_tree();
    let before = read_host(dir.path()).unwrap();
    for name in ID_FILES.iter().chain(LINK_FILES) {
        overwrite(&gpu, name, GARBAGE);
    }
    let after = read_host(dir.path()).unwrap();
    assert_eq!(after, before, "{:?}", warnings(&after));
}

/// An SR-IOV virtual function reads 0xffff as its IDs in config space; the kernel
/// knows them from the physical function and shows them in the files.
#[test]
fn ids_of_all_ones_in_config_come_from_the_files() {
    let (dir, gpu) = lab_tree();
    let mut config = fs::read(gpu.join("config")).unwrap();
    config[0..4].fill(0xff);
    fs::write(gpu.join("config"), &config).unwrap();
    overwrite(&gpu, "vendor", b"0x10de\n");
    overwrite(&gpu, "device", b"0x2330\n");
    let host = read_host(dir.path()).unwrap();
    let d = gpu_record(&host).unwrap();
    assert_eq!((d.vendor, d.device), (0x10de, 0x2330));
}

/// Kernel quirks rewrite `class` (drivers/pci/quirks.c); the file wins over config.
#[test]
fn class_file_wins_over_config() {
    let (dir, gpu) = lab_tree();
    overwrite(&gpu, "class", b"0x030200\n");
    let host = read_host(dir.path()).unwrap();
    assert_eq!(gpu_record(&host).unwrap().class, 0x030200);
}

#[test]
fn link_facts_come_from_the_pcie_capability() {
    let (dir, gpu) = lab_tree();
    let mut config = fs::read(gpu.join("config")).unwrap();
    // Link Status at PCIe cap 0x40 + 0x12: 8 GT/s x4.
    config[0x52..0x54].copy_from_slice(&(3u16 | (4 << 4)).to_le_bytes());
    fs::write(gpu.join("config"), &config).unwrap();
    let host = read_host(dir.path()).unwrap();
    let d = gpu_record(&host).unwrap();
    assert_eq!(d.current_link_speed.as_deref(), Some("8.0 GT/s PCIe"));
    assert_eq!(d.current_link_width, Some(4));
}

/// Where Link Capabilities 2 and Link Capabilities disagree on the top speed,
/// kernels differ, so `max_link_speed` is read from the file.
#[test]
fn disagreeing_link_capabilities_read_the_file() {
    let (dir, gpu) = lab_tree();
    let mut config = fs::read(gpu.join("config")).unwrap();
    // Link Capabilities 2 at 0x40 + 0x2c: supported speeds 2.5 to 32 GT/s.
    config[0x6c..0x70].copy_from_slice(&(0x1fu32 << 1).to_le_bytes());
    fs::write(gpu.join("config"), &config).unwrap();
    overwrite(&gpu, "max_link_speed", b"32.0 GT/s PCIe\n");
    let host = read_host(dir.path()).unwrap();
    let d = gpu_record(&host).unwrap();
    assert_eq!(d.max_link_speed.as_deref(), Some("32.0 GT/s PCIe"));
}

#[test]
fn no_link_files_are_read_without_a_pcie_capability() {
    let (dir, gpu) = lab_tree();
    let mut config = fs::read(gpu.join("config")).unwrap();
    config[0x06] &= !0x10; // no capability list
    fs::write(gpu.join("config"), &config).unwrap();
    for name in LINK_FILES {
        overwrite(&gpu, name, GARBAGE);
    }
    let host = read_host(dir.path()).unwrap();
    let d = gpu_record(&host).unwrap();
    assert_eq!(d.current_link_speed, None);
    assert_eq!(d.max_link_width, None);
    assert!(
        !warnings(&host).iter().any(|w| w.contains("link")),
        "{:?}",
        warnings(&host)
    );
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
