//! `vfio-p2p topo` and `snapshot` end to end: fixture hosts written as sysfs trees,
//! read back by the binary, checked for nvidia-smi's labels; golden outputs.

use std::path::Path;
use std::process::Command as StdCommand;

use assert_cmd::Command;
use serde_json::Value;
use tempfile::TempDir;
use vfio_p2p_emit::topo_dot::render_dot;
use vfio_p2p_emit::topo_report::{render_table, HostTopoReport};
use vfio_p2p_model::HostRecord;
use vfio_p2p_model::Topology;
use vfio_p2p_read::snapshot::write_sysfs_tree;
use vfio_p2p_read::synth::{self, Attach, EndpointSpec, HostBuilder, ACS_ISOLATING};
use vfio_p2p_read::{flat_json, read_host};

const FLAT_VM_JSON: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../tests/fixtures/sysfs/h200x2-vm-sysfs.json"
);

fn tree(host: &HostRecord) -> TempDir {
    let dir = tempfile::tempdir().unwrap();
    write_sysfs_tree(host, dir.path()).unwrap();
    dir
}

fn vfio_p2p() -> Command {
    crate::cli::vfio_p2p()
}

/// `topo --format json` of the sysfs tree below `root`, run through the binary.
fn topo_json(root: &Path) -> Value {
    topo_json_with(root, &[])
}

/// `topo --format json EXTRA…` of the sysfs tree below `root`.
fn topo_json_with(root: &Path, extra: &[&std::ffi::OsStr]) -> Value {
    let out = vfio_p2p()
        .args(["--sysfs-root"])
        .arg(root)
        .args(["topo", "--format", "json"])
        .args(extra)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The label between two GPUs, by BDF, from topo's JSON.
fn label(report: &Value, a: &str, b: &str) -> String {
    let index = |bdf: &str| {
        report["gpus"]
            .as_array()
            .unwrap()
            .iter()
            .position(|g| g["bdf"] == bdf)
            .unwrap_or_else(|| panic!("{bdf} is not a GPU in {report}"))
    };
    report["matrix"][index(a)][index(b)]
        .as_str()
        .unwrap()
        .to_string()
}

fn gpu_bdfs(report: &Value) -> Vec<String> {
    report["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["bdf"].as_str().unwrap().to_string())
        .collect()
}

fn matrix(report: &Value) -> Vec<Vec<String>> {
    serde_json::from_value(report["matrix"].clone()).unwrap()
}

fn h100() -> EndpointSpec {
    EndpointSpec::gpu(0x10de, 0x2330, 80)
}

#[test]
fn flat_vm_from_the_real_dump() {
    let host = flat_json::read_file(Path::new(FLAT_VM_JSON)).unwrap();
    let dir = tree(&host);
    let r = topo_json(dir.path());
    assert_eq!(gpu_bdfs(&r), ["0000:00:06.0", "0000:00:07.0"]);
    assert_eq!(matrix(&r), [["X", "PHB"], ["PHB", "X"]]);
    assert_eq!(r["gpus"][0]["vendor"], "0x10de");
    assert_eq!(r["gpus"][0]["iommu_group"], Value::Null);
    // The dump file itself is a valid --sysfs-root and reads the same.
    let direct = topo_json(Path::new(FLAT_VM_JSON));
    assert_eq!(direct["gpus"], r["gpus"]);
    assert_eq!(direct["matrix"], r["matrix"]);
}

#[test]
fn dual_socket_server() {
    let dir = tree(&synth::example("dual-socket-pcie").unwrap());
    let r = topo_json(dir.path());
    let g = gpu_bdfs(&r);
    assert_eq!(g.len(), 8, "audio functions are not GPUs: {g:?}");
    let m = matrix(&r);
    assert_eq!(m[0][1], "PIX", "same leaf switch");
    assert_eq!(m[0][2], "PXB", "leaf switches below one top switch");
    assert_eq!(m[0][4], "SYS", "other socket");
    assert_eq!(m[4][6], "PXB");
    for (i, row) in m.iter().enumerate() {
        for (j, l) in row.iter().enumerate() {
            assert_eq!(*l, m[j][i], "symmetric at {i},{j}");
        }
    }
}

#[test]
fn hgx_board() {
    let dir = tree(&synth::example("hgx-h100").unwrap());
    let r = topo_json(dir.path());
    assert_eq!(gpu_bdfs(&r).len(), 8, "NVSwitches are not GPUs");
    let m = matrix(&r);
    assert_eq!(m[0][1], "NV18", "NVSwitch board: every GPU pair is NVLink");
    assert_eq!(m[0][7], "NV18");
    let pcie = &r["pcie_matrix"];
    assert_eq!(pcie[0][1], "PIX");
    assert_eq!(pcie[0][2], "NODE", "host bridges of one socket");
    assert_eq!(pcie[0][7], "SYS");
    assert_eq!(r["nics"][0]["gpu_paths"][0], "PIX");
    assert_eq!(r["gpus"][0]["bar64_total"], (128u64 << 30) + (32 << 20));
    let upstream = &r["gpus"][0]["upstream"];
    assert_eq!(upstream[0]["role"], "root_port");
    assert_eq!(upstream[0]["acs"], "SV+ TB- RR+ CR+ UF+ EC- DT-");
    assert_eq!(upstream[1]["role"], "upstream_port");
}

/// A top switch with two leaf switches of two GPUs, plus a GPU on the top switch.
fn nested_switches() -> HostRecord {
    let mut b = HostBuilder::new("nested switches");
    let hb = b.host_bridge(0, 0x40);
    let rp = b.root_port(hb, Some(0), Some(ACS_ISOLATING));
    let (_, top) = b.switch(rp, 3, Some(ACS_ISOLATING));
    for port in &top[..2] {
        let (_, leaf) = b.switch(*port, 2, Some(ACS_ISOLATING));
        for d in leaf {
            b.endpoint(Attach::Below(d), 0, &h100(), None);
        }
    }
    b.endpoint(Attach::Below(top[2]), 0, &h100(), None);
    b.build()
}

#[test]
fn nested_switches_are_pxb() {
    let host = nested_switches();
    let dir = tree(&host);
    let r = topo_json(dir.path());
    // Buses are numbered depth first: the leaf switches' GPUs are 47, 48 and 4a, 4b;
    // the GPU on the top switch's third port is 45.
    let l = |a: &str, b: &str| label(&r, &format!("0000:{a}:00.0"), &format!("0000:{b}:00.0"));
    assert_eq!(gpu_bdfs(&r).len(), 5);
    assert_eq!(l("47", "48"), "PIX");
    assert_eq!(l("4a", "4b"), "PIX");
    assert_eq!(l("47", "4a"), "PXB");
    assert_eq!(l("48", "4b"), "PXB");
    // The GPU on the top switch crosses the top switch and one leaf switch.
    assert_eq!(l("45", "47"), "PXB");
}

/// Two host bridges on NUMA node 0 (one with two root ports), one on node 1.
fn host_bridges_in_one_node() -> HostRecord {
    let mut b = HostBuilder::new("several host bridges per node");
    b.numa_node(0, "0-15").numa_node(1, "16-31");
    for (bus, numa, ports) in [(0x00u8, 0u32, 2), (0x40, 0, 1), (0x80, 1, 1)] {
        let hb = b.host_bridge(0, bus);
        for _ in 0..ports {
            let rp = b.root_port(hb, Some(numa), Some(ACS_ISOLATING));
            b.endpoint(Attach::Below(rp), 0, &h100(), None);
        }
    }
    b.build()
}

#[test]
fn host_bridges_in_one_numa_node_are_node() {
    let dir = tree(&host_bridges_in_one_node());
    let r = topo_json(dir.path());
    assert_eq!(label(&r, "0000:01:00.0", "0000:02:00.0"), "PHB");
    assert_eq!(label(&r, "0000:01:00.0", "0000:41:00.0"), "NODE");
    assert_eq!(label(&r, "0000:41:00.0", "0000:81:00.0"), "SYS");
    assert_eq!(r["gpus"][0]["cpu_affinity"], "0-15");
    assert_eq!(r["gpus"][3]["numa_node"], 1);
}

#[test]
fn lab_level_a_labels() {
    let dir = tree(&synth::example("lab").unwrap());
    let r = topo_json(dir.path());
    let gpus = [
        "0000:03:00.0",
        "0000:04:00.0",
        "0000:05:00.0",
        "0000:81:00.0",
    ];
    assert_eq!(gpu_bdfs(&r), gpus, "edu (class 0x00ff) is not a GPU");
    assert_eq!(label(&r, gpus[0], gpus[1]), "PIX");
    assert_eq!(label(&r, gpus[0], gpus[2]), "PHB");
    assert_eq!(label(&r, gpus[2], gpus[3]), "SYS");
    assert_ne!(r["gpus"][0]["iommu_group"], r["gpus"][1]["iommu_group"]);
}

fn all_fixtures() -> Vec<(String, HostRecord)> {
    let mut hosts: Vec<(String, HostRecord)> = synth::EXAMPLES
        .iter()
        .map(|(n, _)| (n.to_string(), synth::example(n).unwrap()))
        .collect();
    hosts.push(("nested".into(), nested_switches()));
    hosts.push(("node".into(), host_bridges_in_one_node()));
    hosts
}

/// Non-root users read 64 bytes of config: bridge roles are inferred from the tree,
/// and every label must stay what root sees.
#[test]
fn non_root_view_keeps_the_labels() {
    for (name, host) in all_fixtures() {
        let full = tree(&host);
        let partial = tree(&host.unprivileged_view());
        let (a, b) = (topo_json(full.path()), topo_json(partial.path()));
        assert_eq!(a["matrix"], b["matrix"], "{name}");
        assert_eq!(a["config_complete"], true, "{name}");
        assert_eq!(b["config_complete"], false, "{name}");
        let table = vfio_p2p()
            .arg("--sysfs-root")
            .arg(partial.path())
            .arg("topo")
            .output()
            .unwrap();
        let text = String::from_utf8(table.stdout).unwrap();
        assert_eq!(
            text.matches("only the first 64 bytes").count(),
            1,
            "{name}: {text}"
        );
    }
}

#[test]
fn snapshot_reads_back_identically() {
    let source = tree(&synth::example("hgx-h100").unwrap());
    let out = tempfile::tempdir().unwrap();
    let snap = out.path().join("snap");
    vfio_p2p()
        .arg("--sysfs-root")
        .arg(source.path())
        .arg("snapshot")
        .arg("-o")
        .arg(&snap)
        .assert()
        .success();
    let (mut a, mut b) = (topo_json(source.path()), topo_json(&snap));
    a["source"] = Value::Null;
    b["source"] = Value::Null;
    assert_eq!(a, b);
    // A second snapshot into the same (now non-empty) directory is refused, nothing changes.
    let before = read_host(&snap).unwrap();
    let err = vfio_p2p()
        .arg("--sysfs-root")
        .arg(source.path())
        .arg("snapshot")
        .arg("-o")
        .arg(&snap)
        .assert()
        .failure()
        .get_output()
        .stderr
        .clone();
    let err = String::from_utf8(err).unwrap();
    assert!(err.contains("is not empty"), "{err}");
    assert_eq!(read_host(&snap).unwrap(), before);
}

#[test]
fn example_list_names_every_example() {
    let out = vfio_p2p().args(["--example", "list"]).output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    for (name, description) in synth::EXAMPLES {
        assert!(
            text.contains(name) && text.contains(description),
            "{name}: {text}"
        );
    }
}

#[test]
fn no_gpus_points_to_the_examples() {
    let mut b = HostBuilder::new("no GPUs");
    let hb = b.host_bridge(0, 0);
    b.endpoint(
        Attach::HostBridge(hb),
        0,
        &EndpointSpec::nic(0x15b3, 0x1021),
        None,
    );
    let dir = tree(&b.build());
    let out = vfio_p2p()
        .arg("--sysfs-root")
        .arg(dir.path())
        .arg("topo")
        .output()
        .unwrap();
    assert!(out.status.success());
    // said once: in the table's place (stdout), or on stderr with data formats
    let err = String::from_utf8(out.stderr).unwrap() + &String::from_utf8(out.stdout).unwrap();
    assert!(err.contains("--example hgx-h100 topo"), "{err}");
}

// ------------------------------------------------------------------ golden outputs

fn example_topology(name: &str) -> Topology {
    Topology::from_record(&synth::example(name).unwrap())
}

#[test]
fn golden_table() {
    for name in ["hgx-h100", "lab", "flat-vm"] {
        let topo = example_topology(name);
        let text = render_table(&topo, &HostTopoReport::new(&topo));
        insta::assert_snapshot!(format!("table_{name}"), text);
    }
    let topo = Topology::from_record(&synth::example("lab").unwrap().unprivileged_view());
    let text = render_table(&topo, &HostTopoReport::new(&topo));
    insta::assert_snapshot!("table_lab_non_root", text);
}

#[test]
fn golden_json() {
    for name in ["lab", "flat-vm"] {
        let topo = example_topology(name);
        insta::assert_json_snapshot!(format!("json_{name}"), HostTopoReport::new(&topo));
    }
}

#[test]
fn golden_dot() {
    for name in ["dual-socket-pcie", "lab"] {
        let topo = example_topology(name);
        insta::assert_snapshot!(
            format!("dot_{name}"),
            render_dot(&topo, &HostTopoReport::new(&topo))
        );
    }
}

/// The dot output is checked by the real Graphviz (Debian's `graphviz` package, which
/// `.ci/run` installs): without it the test fails, it never passes unchecked.
#[test]
fn dot_output_is_valid_graphviz() {
    assert!(
        StdCommand::new("dot").arg("-V").output().is_ok(),
        "`dot` not found: apt-get install graphviz (`.ci/run` installs it)"
    );
    for (name, host) in all_fixtures() {
        let topo = Topology::from_record(&host);
        let text = render_dot(&topo, &HostTopoReport::new(&topo));
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("topo.dot");
        std::fs::write(&file, &text).unwrap();
        let out = StdCommand::new("dot")
            .arg("-Tsvg")
            .arg(&file)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{name}: {}\n{text}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(String::from_utf8_lossy(&out.stdout).contains("<svg"));
    }
}

#[test]
fn gpu_count_matches_across_formats() {
    let dir = tree(&synth::example("lab").unwrap());
    for format in ["table", "yaml", "dot"] {
        let out = vfio_p2p()
            .arg("--sysfs-root")
            .arg(dir.path())
            .args(["topo", "--format", format])
            .output()
            .unwrap();
        assert!(out.status.success(), "{format}");
        let text = String::from_utf8(out.stdout).unwrap();
        assert!(text.contains("PIX"), "{format}: {text}");
        assert!(text.contains("0000:81:00.0"), "{format}: {text}");
    }
}

/// `vfio-p2p snapshot` of a VM with four NVLink H200s (taken by guest-agent/bench/multi-gpu.sh):
/// a flat root bus, so PHB between every pair until NVLink is known.
#[test]
fn snapshot_of_a_real_four_gpu_vm_reads_back() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/sysfs/h200x4-vm");
    let r = topo_json(&root);
    assert_eq!(
        gpu_bdfs(&r),
        [
            "0000:00:06.0",
            "0000:00:07.0",
            "0000:00:08.0",
            "0000:00:09.0"
        ]
    );
    let m = matrix(&r);
    assert_eq!(m[0][3], "PHB");
    assert_eq!(m[2][2], "X");
}

/// `--nvlink` with the `nvidia-smi topo -m` captured on that VM shows NV18, as nvidia-smi did,
/// while the PCIe matrix keeps the flat bus's PHB.
#[test]
fn nvlink_capture_shows_nv_for_the_real_four_gpu_vm() {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let capture = here.join("../tests/fixtures/agent/h200x4/topo-m.txt");
    let r = topo_json_with(
        &here.join("../tests/fixtures/sysfs/h200x4-vm"),
        &["--nvlink".as_ref(), capture.as_os_str()],
    );
    assert_eq!(r["matrix"][0][3], "NV18");
    assert_eq!(r["pcie_matrix"][0][3], "PHB");
}

/// A Grace tray read from its sysfs tree: each GPU's memory node, its 7 companions (CPU-less,
/// memory-less nodes) and the SMMU behind it, in the JSON and the table.
#[test]
fn grace_gpus_show_their_memory_node_companions_and_smmu() {
    let dir = tree(&synth::example("gb200").unwrap());
    let r = topo_json(dir.path());
    let gpu1 = &r["gpus"][1];
    assert_eq!(gpu1["gpu_numa_id"], 10);
    assert_eq!(
        gpu1["gpu_numa_companions"],
        serde_json::json!([11, 12, 13, 14, 15, 16, 17])
    );
    assert_eq!(gpu1["iommu_unit"], "smmu3.0x0000000012000000");
    let out = vfio_p2p()
        .arg("--sysfs-root")
        .arg(dir.path())
        .arg("topo")
        .output()
        .unwrap();
    let table = String::from_utf8(out.stdout).unwrap();
    assert!(table.contains("Companion Nodes"), "{table}");
    assert!(
        table.contains("memory node 26, companion nodes 27-33  behind smmu3.0x0000100012000000"),
        "{table}"
    );
}
