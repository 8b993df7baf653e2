//! `vfio-p2p plan` and `vfio-p2p check` end to end: golden plan JSON for the embedded
//! examples, and `check`'s verdicts and exit codes on modified real sysfs dumps.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use assert_cmd::Command;
use serde_json::Value;

fn vfio_p2p() -> Command {
    crate::cli::vfio_p2p()
}

fn json_of(args: &[&str]) -> (Value, i32) {
    let out = vfio_p2p()
        .args(args)
        .args(["--format", "json"])
        .output()
        .unwrap();
    let v = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    (v, out.status.code().unwrap())
}

/// Golden plan JSON for every embedded example.
#[test]
fn plan_golden_examples() {
    for name in ["hgx-h100", "dual-socket-pcie", "flat-vm"] {
        let (v, code) = json_of(&["plan", "--example", name]);
        assert_eq!(code, 0, "{name}");
        insta::assert_json_snapshot!(format!("plan-{name}"), v);
    }
}

#[test]
fn plan_yaml_and_table() {
    vfio_p2p()
        .args([
            "plan",
            "--example",
            "dual-socket-pcie",
            "--p2p-level",
            "pix",
            "--format",
            "yaml",
        ])
        .assert()
        .success()
        .stdout(predicates::str::contains("cliques:"));
    vfio_p2p()
        .args(["plan", "--example", "dual-socket-pcie"])
        .assert()
        .success()
        .stdout(predicates::str::contains("2 clique(s) at --p2p-level pxb"))
        .stdout(predicates::str::contains("iommu-routed"));
}

#[test]
fn plan_rejects_bad_input_with_the_fix() {
    for (flag, value, says) in [
        ("--gpus", "0000:03:00.0", "is not a GPU"),
        ("--p2p-level", "far", "pix, pxb, phb, node, sys"),
    ] {
        vfio_p2p()
            .args(["plan", "--example", "dual-socket-pcie", flag, value])
            .assert()
            .code(2)
            .stderr(predicates::str::contains(says));
    }
}

const TOPO_M: &str = "\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\n\
GPU0\t X \tNV18\t0-15\t0\n\
GPU1\tNV18\t X \t0-15\t0\n\n\
index, pci.bus_id\n0, 00000000:00:06.0\n1, 00000000:00:07.0\n";

#[test]
fn nvlink_file_shows_in_plan_and_topo() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("topo.txt");
    std::fs::write(&f, TOPO_M).unwrap();
    let (v, _) = json_of(&[
        "plan",
        "--example",
        "flat-vm",
        "--nvlink",
        f.to_str().unwrap(),
    ]);
    assert_eq!(v["pairs"][0]["nvlink"], 18);
    assert_eq!(v["pairs"][0]["verdict"], "nvlink");
    assert_eq!(v["assignments"]["0000:00:06.0"], Value::Null);
    // The NVSwitch board shows NV18 in topo without any file.
    let (t, _) = json_of(&["topo", "--example", "hgx-h100"]);
    assert_eq!(t["matrix"][0][1], "NV18");
}

/// The real H200 VM dump with both GPUs given an A100-like MSI-X capability at 0xC8.
fn a100_like_dump(dir: &Path) -> PathBuf {
    let fixture = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fixtures/sysfs/h200x2-vm-sysfs.json"
    );
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(fixture).unwrap()).unwrap();
    for bdf in ["0000:00:06.0", "0000:00:07.0"] {
        let hex: String = v[bdf]["config"]
            .as_str()
            .unwrap()
            .split_whitespace()
            .collect();
        let mut bytes: Vec<u8> = (0..hex.len() / 2)
            .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
            .collect();
        // Link MSI-X (last in the list, at 0xB0) to a capability at 0xC8.
        bytes[0xb1] = 0xc8;
        bytes[0xc8] = 0x11;
        bytes[0xc9] = 0x00;
        v[bdf]["config"] = Value::String(bytes.iter().map(|b| format!("{b:02x}")).collect());
    }
    let p = dir.join("a100-like.json");
    std::fs::write(&p, v.to_string()).unwrap();
    p
}

fn fake_qemu(dir: &Path, version: &str) -> PathBuf {
    let p = dir.join(format!("qemu-{version}"));
    std::fs::write(
        &p,
        format!("#!/bin/sh\necho 'QEMU emulator version {version} (Debian)'\necho 'Copyright (c) 2003-2023'\n"),
    )
    .unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p
}

fn check_status(report: &Value, check: &str, subject: Option<&str>) -> String {
    report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["check"] == check && c["subject"].as_str() == subject)
        .unwrap_or_else(|| panic!("no {check} in {report:#}"))["status"]
        .as_str()
        .unwrap()
        .to_string()
}

#[test]
fn check_clique_placement_by_qemu_version() {
    let dir = tempfile::tempdir().unwrap();
    let dump = a100_like_dump(dir.path());
    let run = |qemu: &Path| {
        json_of(&[
            "check",
            "--sysfs-root",
            dump.to_str().unwrap(),
            "--p2p-level",
            "phb",
            "--qemu",
            qemu.to_str().unwrap(),
        ])
    };
    let (old, code) = run(&fake_qemu(dir.path(), "7.2.0"));
    assert_eq!(code, 2);
    assert_eq!(
        check_status(&old, "clique-placement", Some("0000:00:06.0")),
        "fail"
    );
    let (new, _) = run(&fake_qemu(dir.path(), "8.2.2"));
    assert_eq!(
        check_status(&new, "clique-placement", Some("0000:00:06.0")),
        "pass"
    );
    // A snapshot file has no /dev: said, not guessed, and skipped rather than warned of.
    assert_eq!(check_status(&new, "vfio-container", None), "skip");
}

#[test]
fn check_hidden_hypervisor_from_qemu_args_and_domain_xml() {
    let (r, code) = json_of(&[
        "check",
        "--example",
        "dual-socket-pcie",
        "--qemu-args",
        "-machine q35 -cpu host,kvm=off -m 64G",
    ]);
    assert_eq!(code, 2);
    assert_eq!(check_status(&r, "hypervisor-visible", None), "fail");
    let dir = tempfile::tempdir().unwrap();
    let xml = dir.path().join("vm.xml");
    std::fs::write(
        &xml,
        "<domain type='kvm'><name>vm</name><features><kvm><hidden state='on'/></kvm></features></domain>",
    )
    .unwrap();
    let (r, _) = json_of(&[
        "check",
        "--example",
        "dual-socket-pcie",
        "--domain-xml",
        xml.to_str().unwrap(),
    ]);
    assert_eq!(check_status(&r, "hypervisor-visible", None), "fail");
    let (r, _) = json_of(&["check", "--example", "dual-socket-pcie"]);
    assert_eq!(check_status(&r, "hypervisor-visible", None), "pass");
}

#[test]
fn check_bad_domain_xml_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let xml = dir.path().join("broken.xml");
    std::fs::write(&xml, "<domain>").unwrap();
    vfio_p2p()
        .args([
            "check",
            "--example",
            "flat-vm",
            "--domain-xml",
            xml.to_str().unwrap(),
        ])
        .assert()
        .code(2)
        .stderr(predicates::str::contains("broken.xml"));
}

/// `--host-config` gives plan its `p2p_level` (and NVLink source); the flag still wins.
#[test]
fn plan_takes_the_host_config_under_its_flags() {
    let dir = tempfile::tempdir().unwrap();
    let host = dir.path().join("host.yaml");
    std::fs::write(&host, "p2p_level: sys\nnvlink:\n  source: none\n").unwrap();
    let host = host.to_str().unwrap();
    let cliques = |extra: &[&str]| {
        let mut args = vec![
            "plan",
            "--example",
            "dual-socket-pcie",
            "--host-config",
            host,
        ];
        args.extend(extra);
        let (v, code) = json_of(&args);
        assert_eq!(code, 0, "{v}");
        v["cliques"].as_array().unwrap().len()
    };
    assert_eq!(cliques(&[]), 1, "sys: both sockets in one clique");
    assert_eq!(cliques(&["--p2p-level", "pxb"]), 2, "the flag wins");
    std::fs::write(dir.path().join("host.yaml"), "p2p_levle: sys\n").unwrap();
    vfio_p2p()
        .args([
            "plan",
            "--example",
            "dual-socket-pcie",
            "--host-config",
            host,
        ])
        .assert()
        .code(2)
        .stderr(predicates::str::contains("host.yaml:1:"))
        .stderr(predicates::str::contains("p2p_levle"));
}

#[test]
fn a_memory_size_whose_bytes_overflow_is_refused() {
    // 2^34 GiB is 2^64 bytes: it wrapped to 0 and passed the address-space check.
    let out = vfio_p2p()
        .args([
            "--example",
            "dual-socket-pcie",
            "check",
            "--memory-gib",
            "17179869184",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("invalid value '17179869184' for '--memory-gib <GIB>'"),
        "{err}"
    );
}
