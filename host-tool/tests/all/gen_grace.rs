//! Grace hosts (gh200, gb200): gen writes aarch64 guests, gated on the QEMU that runs them
//! (a stand-in `qemu-system-aarch64 --version` per version). The x86 goldens in
//! `gen_golden` stay as they were: nothing here touches a q35 guest.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Output;

fn fake_qemu(dir: &Path, version: &str) -> PathBuf {
    let p = dir.join(format!("qemu-system-aarch64-{version}"));
    std::fs::write(
        &p,
        format!("#!/bin/sh\necho 'QEMU emulator version {version} (Debian 1:{version}+ds-1)'\n"),
    )
    .unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p
}

fn gen(example: &str, qemu: Option<&Path>, args: &[&str]) -> Output {
    let mut c = crate::cli::vfio_p2p();
    c.args(["--example", example, "gen"]).args(args);
    if let Some(q) = qemu {
        c.arg("--qemu").arg(q);
    }
    c.output().unwrap()
}

fn ok(out: Output) -> (String, String) {
    let (stdout, stderr) = (
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    );
    assert!(out.status.success(), "{stderr}");
    (stdout, stderr)
}

#[test]
fn qemu_goldens_on_qemu_11_1() {
    let dir = tempfile::tempdir().unwrap();
    let q = fake_qemu(dir.path(), "11.1.3");
    let (gh200, err) = ok(gen("gh200", Some(&q), &["qemu", "--format", "shell"]));
    assert!(
        !err.contains("QEMU that runs this VM is not known"),
        "{err}"
    );
    insta::assert_snapshot!("qemu-gh200", gh200);
    let (gb200, _) = ok(gen("gb200", Some(&q), &["qemu", "--format", "argv"]));
    insta::assert_snapshot!("qemu-gb200", gb200);
}

/// Each version gate flipped: below 9.0 refused (no generic initiators), below 10.0 the
/// tray's 4 TiB of BARs refused (no highmem-mmio-size), below 10.2 one SMMUv3 for the
/// machine with a warning, from 10.2 a vSMMU per physical SMMU.
#[test]
fn qemu_version_gates() {
    let dir = tempfile::tempdir().unwrap();
    let out = gen("gh200", Some(&fake_qemu(dir.path(), "8.2.2")), &["qemu"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("needs QEMU >= 9.0.0 for acpi-generic-initiator"),
        "{err}"
    );

    let out = gen("gb200", Some(&fake_qemu(dir.path(), "9.2.0")), &["qemu"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("needs QEMU >= 10.0.0 for highmem-mmio-size"),
        "{err}"
    );
    // a GH200's BARs fit virt's fixed 512 GiB: 9.2 writes it without highmem-mmio-size
    let (text, _) = ok(gen(
        "gh200",
        Some(&fake_qemu(dir.path(), "9.2.0")),
        &["qemu"],
    ));
    assert!(
        !text.contains("highmem-mmio-size") && text.contains("iommu=smmuv3"),
        "{text}"
    );

    let (text, err) = ok(gen(
        "gb200",
        Some(&fake_qemu(dir.path(), "10.1.0")),
        &["qemu"],
    ));
    assert!(
        text.contains("-machine virt,accel=kvm,gic-version=3,iommu=smmuv3,highmem-mmio-size=4096G"),
        "{text}"
    );
    assert!(
        !text.contains("arm-smmuv3") && !text.contains("pxb-pcie"),
        "{text}"
    );
    assert!(
        err.contains("warning: QEMU 10.1.0 has no arm-smmuv3 per PCIe root complex"),
        "{err}"
    );

    let (text, err) = ok(gen(
        "gb200",
        Some(&fake_qemu(dir.path(), "10.2.0")),
        &["qemu"],
    ));
    assert_eq!(
        text.matches("\"driver\":\"arm-smmuv3\"").count(),
        4,
        "{text}"
    );
    assert_eq!(
        text.matches("acpi-generic-initiator,").count(),
        32,
        "{text}"
    );
    assert!(
        !text.contains("iommu=smmuv3") && !err.contains("arm-smmuv3 per"),
        "{err}"
    );
    // accel=on is never written: only real Grace hardware proves it (docs/gen.md)
    assert!(!text.contains("accel=on"));
}

/// Without --qemu the newest forms are written, with a warning naming the versions.
#[test]
fn an_unknown_qemu_gets_the_newest_forms_and_a_warning() {
    let (text, err) = ok(gen("gh200", None, &["qemu"]));
    assert!(text.starts_with("qemu-system-aarch64"), "{text}");
    assert!(text.contains("arm-smmuv3"), "{text}");
    assert!(
        err.contains("not known (gen --qemu PATH asks its version)"),
        "{err}"
    );
}

/// The expectation handed to the guest carries the Grace NUMA block.
#[test]
fn the_expectation_lists_the_gpus_nodes() {
    let dir = tempfile::tempdir().unwrap();
    let expect = dir.path().join("expect.json");
    ok(gen(
        "gb200",
        Some(&fake_qemu(dir.path(), "11.1.3")),
        &["qemu", "--expect-out", expect.to_str().unwrap()],
    ));
    let e: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&expect).unwrap()).unwrap();
    assert_eq!(e["numa"]["nodes"], 34);
    assert_eq!(
        e["gpus"][3]["numa_nodes"],
        serde_json::json!([26, 27, 28, 29, 30, 31, 32, 33])
    );
    assert_eq!(e["numa"]["distances"][0][26], 40);
}
