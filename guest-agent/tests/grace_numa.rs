//! `vfio-p2p-agent expect` with a Grace expectation (#38): the guest's NUMA nodes from a
//! fixture sysfs tree shaped as Linux shows a guest with two GPUs, each tied by ACPI
//! generic initiators to its own CPU-less, memory-less nodes. One tree as planned passes;
//! each way a guest can differ fails, naming the GPU whose node it is.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::Path;

use assert_cmd::Command;
use predicates::str::contains;

/// Guest nodes: 0 has the CPUs and memory; GPU A has 1-3, GPU B 4-6.
const NODES: u32 = 7;
const GPU_A: &str = "0000:01:00.0";
const GPU_B: &str = "0000:02:00.0";

fn agent() -> Command {
    Command::cargo_bin("vfio-p2p-agent").unwrap()
}

/// The planned distance from node `i` to `j`: 10 itself, 80 between CPU and GPU nodes,
/// 120 between GPU nodes (the shape of a Grace host's SLIT).
fn distance(i: u32, j: u32) -> u32 {
    match (i, j) {
        _ if i == j => 10,
        (0, _) | (_, 0) => 80,
        _ => 120,
    }
}

/// An NVIDIA 3D controller's config space (GH200, 10de:2342), no clique capability.
fn gpu_config() -> Vec<u8> {
    let mut b = vec![0u8; 256];
    b[0..4].copy_from_slice(&[0xde, 0x10, 0x42, 0x23]);
    b[0x09..0x0c].copy_from_slice(&[0x00, 0x02, 0x03]);
    b
}

/// How the written guest differs from the plan.
#[derive(Default)]
struct Twist {
    /// Node `n` of GPU B gets a CPU.
    cpu_on: Option<u32>,
    /// Node `n` gets memory.
    memory_on: Option<u32>,
    /// The guest has this many nodes instead.
    nodes: Option<u32>,
    /// `has_generic_initiator` lists this instead of 1-6.
    generic_initiators: Option<&'static str>,
    /// Node 2's distance to node 0 is this instead.
    distance_2_0: Option<u32>,
}

fn write_guest(root: &Path, twist: &Twist) {
    let links = root.join("sys/bus/pci/devices");
    fs::create_dir_all(&links).unwrap();
    for (bus, bdf) in [(1, GPU_A), (2, GPU_B)] {
        let path = format!("pci0000:00/0000:00:0{bus}.0/{bdf}");
        let dir = root.join("sys/devices").join(&path);
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("config"), gpu_config()).unwrap();
        fs::write(dir.join("class"), "0x030200\n").unwrap();
        fs::write(dir.join("numa_node"), "0\n").unwrap();
        symlink(format!("../../../devices/{path}"), links.join(bdf)).unwrap();
    }
    let nodes = root.join("sys/devices/system/node");
    let count = twist.nodes.unwrap_or(NODES);
    for n in 0..count {
        let dir = nodes.join(format!("node{n}"));
        fs::create_dir_all(&dir).unwrap();
        let cpus = if n == 0 || twist.cpu_on == Some(n) {
            "0-1"
        } else {
            ""
        };
        fs::write(dir.join("cpulist"), format!("{cpus}\n")).unwrap();
        let kib = if n == 0 || twist.memory_on == Some(n) {
            524288
        } else {
            0
        };
        fs::write(
            dir.join("meminfo"),
            format!("Node {n} MemTotal:       {kib} kB\nNode {n} MemFree:        {kib} kB\n"),
        )
        .unwrap();
        let row: Vec<String> = (0..count)
            .map(|j| match twist.distance_2_0 {
                Some(d) if n == 2 && j == 0 => d,
                _ => distance(n, j),
            })
            .map(|d| d.to_string())
            .collect();
        fs::write(dir.join("distance"), format!("{}\n", row.join(" "))).unwrap();
    }
    let gi = twist.generic_initiators.unwrap_or("1-6");
    fs::write(nodes.join("has_generic_initiator"), format!("{gi}\n")).unwrap();
}

fn expectation() -> String {
    with_numa(true)
}

/// The plan of the two GPUs, with or without its NUMA nodes.
fn with_numa(numa: bool) -> String {
    let rows: Vec<Vec<u32>> = (0..NODES)
        .map(|i| (0..NODES).map(|j| distance(i, j)).collect())
        .collect();
    format!(
        r#"{{"version":1,"vm":"grace","gpus":[
        {{"host_bdf":"0009:01:00.0","guest_bdf":"{GPU_A}","clique":null,"vendor":"0x10de","device":"0x2342"{}}},
        {{"host_bdf":"0019:01:00.0","guest_bdf":"{GPU_B}","clique":null,"vendor":"0x10de","device":"0x2342"{}}}]{}}}"#,
        if numa { r#","numa_nodes":[1,2,3]"# } else { "" },
        if numa { r#","numa_nodes":[4,5,6]"# } else { "" },
        if numa {
            format!(
                r#","numa":{{"nodes":{NODES},"distances":{}}}"#,
                serde_json::to_string(&rows).unwrap()
            )
        } else {
            String::new()
        }
    )
}

fn expect(twist: Twist) -> assert_cmd::assert::Assert {
    let t = tempfile::tempdir().unwrap();
    write_guest(t.path(), &twist);
    let file = t.path().join("expect.json");
    fs::write(&file, expectation()).unwrap();
    agent()
        .args(["expect", "--sysfs-root"])
        .arg(t.path())
        .arg("--expect")
        .arg(&file)
        .assert()
}

#[test]
fn a_guest_as_planned_passes() {
    expect(Twist::default())
        .success()
        .stdout(contains("NUMA: 7 nodes as planned"));
}

#[test]
fn the_json_report_carries_the_nodes_found() {
    let t = tempfile::tempdir().unwrap();
    write_guest(t.path(), &Twist::default());
    let file = t.path().join("expect.json");
    fs::write(&file, expectation()).unwrap();
    let out = agent()
        .args(["--format", "json", "expect", "--sysfs-root"])
        .arg(t.path())
        .arg("--expect")
        .arg(&file)
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["numa"]["planned_nodes"], 7, "{v}");
    assert_eq!(
        v["numa"]["found"]["generic_initiators"],
        serde_json::json!([1, 2, 3, 4, 5, 6])
    );
    assert_eq!(v["numa"]["found"]["nodes"][4]["cpulist"], "");
    assert_eq!(v["numa"]["problems"], serde_json::json!([]));
}

#[test]
fn a_gpu_node_with_a_cpu_fails_naming_the_gpu() {
    expect(Twist {
        cpu_on: Some(5),
        ..Twist::default()
    })
    .code(1)
    .stdout(contains(format!(
        "GPU {GPU_B} (host 0019:01:00.0): its NUMA node 5 has CPUs 0-1"
    )));
}

#[test]
fn a_gpu_node_with_memory_fails_naming_the_gpu() {
    expect(Twist {
        memory_on: Some(2),
        ..Twist::default()
    })
    .code(1)
    .stdout(contains(format!(
        "GPU {GPU_A} (host 0009:01:00.0): its NUMA node 2 has 524288 kB"
    )));
}

#[test]
fn missing_nodes_fail_the_count_and_name_the_gpu() {
    expect(Twist {
        nodes: Some(5),
        generic_initiators: Some("1-4"),
        ..Twist::default()
    })
    .code(1)
    .stdout(contains(
        "the guest has NUMA nodes [0, 1, 2, 3, 4], planned 0..7",
    ))
    .stdout(contains(format!(
        "GPU {GPU_B} (host 0019:01:00.0): its NUMA node 6 is not in this guest"
    )));
}

#[test]
fn a_node_without_its_generic_initiator_fails_naming_the_gpu() {
    expect(Twist {
        generic_initiators: Some("1-3,5-6"),
        ..Twist::default()
    })
    .code(1)
    .stdout(contains(format!(
        "GPU {GPU_B} (host 0019:01:00.0): its NUMA node 4 has no generic initiator"
    )))
    .stdout(contains("acpi-generic-initiator"));
}

#[test]
fn a_wrong_distance_fails_naming_the_node_and_its_gpu() {
    expect(Twist {
        distance_2_0: Some(20),
        ..Twist::default()
    })
    .code(1)
    .stdout(contains(format!(
        "node 2 (GPU {GPU_A} (host 0009:01:00.0)): distances [20, 120, 10"
    )));
}

#[test]
fn without_a_numa_block_nodes_are_not_judged() {
    let t = tempfile::tempdir().unwrap();
    write_guest(
        t.path(),
        &Twist {
            cpu_on: Some(5),
            ..Twist::default()
        },
    );
    let file = t.path().join("expect.json");
    fs::write(&file, with_numa(false)).unwrap();
    let assert = agent()
        .args(["expect", "--sysfs-root"])
        .arg(t.path())
        .arg("--expect")
        .arg(&file)
        .assert()
        .success();
    let out = String::from_utf8_lossy(&assert.get_output().stdout).to_string();
    assert!(!out.contains("NUMA"), "{out}");
}
