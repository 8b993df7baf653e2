//! `vfio-p2p-agent topo`: guest path labels from guest sysfs against the host's, on the
//! recorded H200 VM and on a guest tree shaped like `gen qemu` mirror's (no GPU needed).

use std::fs;
use std::os::unix::fs::symlink;
use std::path::Path;

use assert_cmd::Command;
use serde_json::Value;

const H200X2: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../tests/fixtures/sysfs/h200x2-vm-sysfs.json"
);

fn agent() -> Command {
    Command::cargo_bin("vfio-p2p-agent").unwrap()
}

/// One device of a sysfs tree: `path` below `sys/devices`, class, NUMA node, config.
struct Dev {
    path: String,
    class: u32,
    numa: i32,
    config: Vec<u8>,
}

/// Writes `root/sys/devices/PATH/{config,class,numa_node}` and the
/// `sys/bus/pci/devices/BDF` links the kernel makes.
fn write_tree(root: &Path, devs: &[Dev]) {
    let links = root.join("sys/bus/pci/devices");
    fs::create_dir_all(&links).unwrap();
    for d in devs {
        let dir = root.join("sys/devices").join(&d.path);
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("config"), &d.config).unwrap();
        fs::write(dir.join("class"), format!("{:#08x}\n", d.class)).unwrap();
        fs::write(dir.join("numa_node"), format!("{}\n", d.numa)).unwrap();
        let bdf = d.path.rsplit('/').next().unwrap();
        symlink(format!("../../../devices/{}", d.path), links.join(bdf)).unwrap();
    }
}

/// The recorded H200 VM, at the paths its snapshot names.
fn recorded_vm(root: &Path) {
    let snap: Value = serde_json::from_str(&fs::read_to_string(H200X2).unwrap()).unwrap();
    let devs: Vec<Dev> = snap
        .as_object()
        .unwrap()
        .values()
        .map(|a| Dev {
            path: a["path"]
                .as_str()
                .unwrap()
                .strip_prefix("/sys/devices/")
                .unwrap()
                .to_string(),
            class: u32::from_str_radix(&a["class"].as_str().unwrap()[2..], 16).unwrap(),
            numa: a["numa_node"].as_str().unwrap().parse().unwrap(),
            config: pci_config::parse_hex_dump(a["config"].as_str().unwrap()).unwrap(),
        })
        .collect();
    write_tree(root, &devs);
}

/// Config space with a PCIe capability of `port_type` (0 endpoint, 4 root port,
/// 5 upstream, 6 downstream), cut to `len` bytes (64: what a non-root user reads).
fn config(class: u32, port_type: u8, len: usize) -> Vec<u8> {
    let mut b = vec![0u8; 256];
    b[0..4].copy_from_slice(&[0xde, 0x10, 0x30, 0x23]);
    b[0x06] = 0x10;
    b[0x09..0x0c].copy_from_slice(&class.to_le_bytes()[..3]);
    b[0x0e] = u8::from(class >> 8 == 0x0604);
    b[0x34] = 0x40;
    b[0x40] = 0x10;
    b[0x42] = 0x02 | (port_type << 4);
    b.truncate(len);
    b
}

/// A guest as `gen qemu` mirror lays out hgx-h100's first five GPUs: per expander
/// (a root complex on its guest NUMA node) a root port, a switch, its downstream ports.
fn mirror_guest(root: &Path, len: usize) {
    let mut devs = Vec::new();
    let mut add = |path: String, class: u32, port: u8, numa: i32| {
        devs.push(Dev {
            path,
            class,
            numa,
            config: config(class, port, len),
        })
    };
    for (bus, numa, gpus) in [(0x20u8, 0, 2u8), (0x40, 0, 2), (0x60, 1, 1)] {
        let rp = format!("pci0000:{bus:02x}/0000:{bus:02x}:00.0");
        let us = format!("{rp}/0000:{:02x}:00.0", bus + 1);
        add(rp.clone(), 0x060400, 4, numa);
        add(us.clone(), 0x060400, 5, numa);
        for g in 0..gpus {
            let ds = format!("{us}/0000:{:02x}:{g:02x}.0", bus + 2);
            add(ds.clone(), 0x060400, 6, numa);
            add(
                format!("{ds}/0000:{:02x}:00.0", bus + 3 + g),
                0x030200,
                0,
                numa,
            );
        }
    }
    write_tree(root, &devs);
}

/// An expectation for `gpus` (guest addresses) and `pairs` `(a, b, host label)`.
fn expectation(gpus: &[&str], pairs: &[(&str, &str, &str)]) -> String {
    let gpus: Vec<String> = gpus
        .iter()
        .map(|g| {
            format!(
                r#"{{"host_bdf":"{g}","guest_bdf":"{g}","clique":null,"vendor":"0x10de","device":"0x2330"}}"#
            )
        })
        .collect();
    let pairs: Vec<String> = pairs
        .iter()
        .map(|(a, b, l)| {
            format!(r#"{{"a":"{a}","b":"{b}","verdict":"p2p","path":"{l}","nvlink":null}}"#)
        })
        .collect();
    format!(
        r#"{{"version":1,"vm":"vm0","gpus":[{}],"pairs":[{}]}}"#,
        gpus.join(","),
        pairs.join(",")
    )
}

fn topo(root: &Path, expect: &str) -> (i32, Value, String) {
    let file = root.join("expect.json");
    fs::write(&file, expect).unwrap();
    let run = |format: &str| {
        agent()
            .args(["--format", format, "topo", "--sysfs-root"])
            .arg(root)
            .arg("--expect")
            .arg(&file)
            .output()
            .unwrap()
    };
    let json = run("json");
    let table = run("table");
    (
        json.status.code().unwrap(),
        serde_json::from_slice(&json.stdout).unwrap(),
        String::from_utf8(table.stdout).unwrap(),
    )
}

const GPUS: [&str; 5] = [
    "0000:23:00.0",
    "0000:24:00.0",
    "0000:43:00.0",
    "0000:44:00.0",
    "0000:63:00.0",
];

/// The host labels of those five GPUs on hgx-h100 (`vfio-p2p --example hgx-h100 topo`).
fn hgx_pairs() -> Vec<(&'static str, &'static str, &'static str)> {
    let host = |i: usize, j: usize| match (i / 2 == j / 2, i < 4 && j < 4) {
        (true, _) => "PIX",
        (false, true) => "NODE",
        _ => "SYS",
    };
    let mut out = Vec::new();
    for (i, a) in GPUS.iter().enumerate() {
        for (j, b) in GPUS.iter().enumerate().skip(i + 1) {
            out.push((*a, *b, host(i, j)));
        }
    }
    out
}

#[test]
fn mirror_guest_reads_the_host_labels_as_root_and_without() {
    // 256 bytes: port types from config space; 64: inferred from the tree, as the host does.
    for len in [256, 64] {
        let t = tempfile::tempdir().unwrap();
        mirror_guest(t.path(), len);
        let (code, json, table) = topo(t.path(), &expectation(&GPUS, &hgx_pairs()));
        assert_eq!(code, 0, "{table}");
        let pairs = json["pairs"].as_array().unwrap();
        assert_eq!(pairs.len(), 10);
        for p in pairs {
            assert_eq!(p["guest"], p["host"], "{p}");
        }
        let labels: Vec<&str> = pairs.iter().map(|p| p["guest"].as_str().unwrap()).collect();
        for l in ["PIX", "NODE", "SYS"] {
            assert!(labels.contains(&l), "{labels:?}");
        }
        assert_eq!(table.matches(" ok ").count(), 10, "{table}");
    }
}

#[test]
fn a_differing_pair_names_the_guest_bridge() {
    let t = tempfile::tempdir().unwrap();
    mirror_guest(t.path(), 256);
    let mut pairs = hgx_pairs();
    pairs[0].2 = "PXB";
    pairs[1].2 = "PHB";
    let (code, json, table) = topo(t.path(), &expectation(&GPUS, &pairs));
    assert_eq!(code, 1, "{table}");
    assert_eq!(json["pairs"][0]["guest"], "PIX");
    assert_eq!(
        json["pairs"][0]["difference"],
        "both sit below guest bridge 0000:21:00.0, 1 switch(es) crossed"
    );
    assert_eq!(
        json["pairs"][1]["difference"],
        "guest root complexes pci0000:20 (NUMA node 0) and pci0000:40 (NUMA node 0)"
    );
    assert!(table.contains("0000:23:00.0 0000:24:00.0: PIX in the guest, PXB on the host: both sit below guest bridge 0000:21:00.0"), "{table}");
    assert_eq!(table.matches("DIFFERS").count(), 2, "{table}");
}

/// The recorded H200 VM (`flat` layout, both GPUs on pcie.0): PHB, as on that host.
#[test]
fn recorded_h200_vm_reads_phb() {
    let t = tempfile::tempdir().unwrap();
    recorded_vm(t.path());
    let gpus = ["0000:00:06.0", "0000:00:07.0"];
    let (code, json, _) = topo(t.path(), &expectation(&gpus, &[(gpus[0], gpus[1], "PHB")]));
    assert_eq!(code, 0);
    assert_eq!(json["pairs"][0]["guest"], "PHB");
    let (code, json, table) = topo(t.path(), &expectation(&gpus, &[(gpus[0], gpus[1], "PIX")]));
    assert_eq!(code, 1);
    assert_eq!(
        json["pairs"][0]["difference"],
        "both sit below guest root complex pci0000:00 with no bridge in common"
    );
    assert!(table.contains("DIFFERS"), "{table}");
    // A label that is not a PCIe one (an older host wrote NV#) is shown, not judged.
    let (code, _, table) = topo(t.path(), &expectation(&gpus, &[(gpus[0], gpus[1], "NV18")]));
    assert_eq!(code, 0, "{table}");
    assert!(table.contains("not compared"), "{table}");
}

#[test]
fn a_missing_gpu_is_named() {
    let t = tempfile::tempdir().unwrap();
    mirror_guest(t.path(), 256);
    let gpus = ["0000:23:00.0", "0000:99:00.0"];
    let (code, json, table) = topo(t.path(), &expectation(&gpus, &[(gpus[0], gpus[1], "PIX")]));
    assert_eq!(code, 1);
    assert_eq!(json["pairs"][0]["guest"], Value::Null);
    assert!(
        table.contains("warning: GPU 0000:99:00.0: cannot resolve"),
        "{table}"
    );
}
