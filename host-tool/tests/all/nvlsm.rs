//! `check` on an HGX B200 root (synthetic, its GPUs 10de:2901): the
//! `nvlink-subnet-manager` row is read from the root's files and processes, once, and
//! fails or passes with them; an H100 root shows no such row. And `fabric: auto` asks
//! Fabric Manager on such a board although no NVSwitch is on its PCI tree.

use std::fs;
use std::path::Path;

use serde_json::Value;
use vfio_p2p_bind::sim::write_tree;
use vfio_p2p_model::Topology;
use vfio_p2p_read::synth::{example, Attach, EndpointSpec, HostBuilder, ACS_ISOLATING};

use crate::fm_standin::{board, standin_library};

fn root_with_gpu(dir: &Path, device: u16) {
    let mut b = HostBuilder::new("hgx b200 root");
    let hb = b.host_bridge(0, 0x40);
    for slot in 0..2 {
        let rp = b.root_port(hb, Some(0), Some(ACS_ISOLATING));
        b.endpoint(
            Attach::Below(rp),
            slot,
            &EndpointSpec::gpu(0x10de, device, 256),
            None,
        );
    }
    let record = b.build();
    assert_eq!(Topology::from_record(&record).gpus().count(), 2);
    vfio_p2p_read::snapshot::write_sysfs_tree(&record, dir).unwrap();
}

/// The `nvlink-subnet-manager` rows of `check` below `root`.
fn rows(root: &Path) -> Vec<Value> {
    let out = crate::cli::vfio_p2p()
        .args([
            "--sysfs-root",
            root.to_str().unwrap(),
            "check",
            "--format",
            "json",
        ])
        .env("VFIO_P2P_FM_LIBRARY", "/nonexistent/libnvfm.so.1")
        .output()
        .unwrap();
    let report: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["check"] == "nvlink-subnet-manager")
        .cloned()
        .collect()
}

fn write(root: &Path, rel: &str, bytes: &[u8]) {
    let p = root.join(rel);
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    fs::write(p, bytes).unwrap();
}

#[test]
fn an_hgx_b200_root_fails_without_nvlsm_and_passes_with_it_running() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    root_with_gpu(root, 0x2901);
    let r = rows(root);
    assert_eq!(r.len(), 1, "{r:?}");
    assert_eq!(r[0]["status"], "warn", "nothing installed: {r:?}");
    write(root, "usr/bin/nv-fabricmanager", b"");
    let r = rows(root);
    assert_eq!(r[0]["status"], "fail", "{r:?}");
    assert!(r[0]["fix"].as_str().unwrap().contains("nvlink5-"), "{r:?}");
    write(root, "opt/nvidia/nvlsm/sbin/nvlsm", b"");
    fs::create_dir_all(root.join("sys/class/infiniband_mad")).unwrap();
    let r = rows(root);
    assert_eq!(r[0]["status"], "fail", "installed, not running: {r:?}");
    for (pid, comm, argv) in [
        (
            31060,
            "nvlsm",
            "/opt/nvidia/nvlsm/sbin/nvlsm\0-g\x000x7425540300353de9\0",
        ),
        (
            31082,
            "nv-fabricmanage",
            "/usr/bin/nv-fabricmanager\0-g\x000x7425540300353de9\0",
        ),
    ] {
        write(
            root,
            &format!("proc/{pid}/comm"),
            format!("{comm}\n").as_bytes(),
        );
        write(root, &format!("proc/{pid}/cmdline"), argv.as_bytes());
    }
    let r = rows(root);
    assert_eq!(r[0]["status"], "pass", "{r:?}");
    assert!(
        r[0]["saw"].as_str().unwrap().contains("0x7425540300353de9"),
        "{r:?}"
    );
}

#[test]
fn no_row_on_an_h100_root() {
    let dir = tempfile::tempdir().unwrap();
    root_with_gpu(dir.path(), 0x2330);
    assert!(rows(dir.path()).is_empty());
}

/// The partitions `topo` shows below a root whose socket-0 GPUs the stand-in FM's board
/// holds, with those GPUs' device ID set to `device`; FM asked under `fabric: auto`.
fn partitions_seen(device: u16) -> usize {
    let dir = tempfile::tempdir().unwrap();
    let mut record = example("dual-socket-pcie").unwrap();
    for d in record.devices.iter_mut().filter(|d| d.device == 0x26b9) {
        d.device = device;
        d.config[2..4].copy_from_slice(&device.to_le_bytes());
    }
    write_tree(&record, dir.path()).unwrap();
    let fm = dir.path().join("fm-standin.json");
    fs::write(&fm, board().to_string()).unwrap();
    let out = crate::cli::vfio_p2p()
        .arg("--sysfs-root")
        .arg(dir.path())
        .args(["topo", "--format", "json"])
        .env("VFIO_P2P_FM_LIBRARY", standin_library())
        .env("VFIO_P2P_FM_STANDIN", &fm)
        .output()
        .unwrap();
    let report: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    report["fabric"]["state"]["partitions"]
        .as_array()
        .map_or(0, Vec::len)
}

#[test]
fn auto_asks_fabric_manager_on_an_nvlink5_board_without_pci_nvswitches() {
    assert_eq!(partitions_seen(0x2901), 3);
    // L40S: no NVSwitch board, FM is not asked.
    assert_eq!(partitions_seen(0x26b9), 0);
}
