//! Grace hosts (gh200, gb200): gen writes aarch64 guests, gated on the QEMU that runs them
//! (a stand-in `qemu-system-aarch64 --version` per version). The x86 goldens in
//! `gen_golden` stay as they were: nothing here touches a q35 guest.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Output;

use crate::cli::outcome_of_success;

pub(crate) fn fake_qemu(dir: &Path, version: &str) -> PathBuf {
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

#[test]
fn qemu_goldens_on_qemu_11_1() {
    let dir = tempfile::tempdir().unwrap();
    let q = fake_qemu(dir.path(), "11.1.3");
    let (gh200, err) = outcome_of_success(gen("gh200", Some(&q), &["qemu", "--format", "shell"]));
    assert!(
        !err.contains("QEMU that runs this VM is not known"),
        "{err}"
    );
    insta::assert_snapshot!("qemu-gh200", gh200);
    let (gb200, _) = outcome_of_success(gen("gb200", Some(&q), &["qemu", "--format", "argv"]));
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
    let (text, _) = outcome_of_success(gen(
        "gh200",
        Some(&fake_qemu(dir.path(), "9.2.0")),
        &["qemu"],
    ));
    assert!(
        !text.contains("highmem-mmio-size") && text.contains("iommu=smmuv3"),
        "{text}"
    );

    let (text, err) = outcome_of_success(gen(
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

    let (text, err) = outcome_of_success(gen(
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
    let (text, err) = outcome_of_success(gen("gh200", None, &["qemu"]));
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
    outcome_of_success(gen(
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

/// The aarch64 domain: libvirt 9.0 (installed here) gets the generic initiators in
/// `<qemu:commandline>` under a comment and validates against its own schema; 12.x writes
/// `<acpi nodeset>` on each GPU's hostdev instead (validated by sid's libvirt in the lab:
/// 9.0's schema has no such element).
#[test]
fn libvirt_domains_by_version() {
    let dir = tempfile::tempdir().unwrap();
    let q = fake_qemu(dir.path(), "11.1.3");
    let (old, err) = outcome_of_success(gen(
        "gb200",
        Some(&q),
        &["libvirt", "--libvirt-version", "9.0"],
    ));
    assert!(
        err.contains("warning: libvirt 9.0 is not known to write acpi-generic-initiator"),
        "{err}"
    );
    assert!(
        old.contains("<type arch='aarch64' machine='virt'>hvm</type>"),
        "{old}"
    );
    assert!(
        old.contains("<!-- libvirt 9.0 has no element for acpi-generic-initiator"),
        "{old}"
    );
    assert_eq!(
        old.matches("acpi-generic-initiator,id=").count(),
        32,
        "{old}"
    );
    assert!(old.contains("pci-dev=ua-gpu3,node=33"), "{old}");
    assert!(!old.contains("<acpi nodeset='"), "{old}");
    insta::assert_snapshot!("libvirt-gb200-9.0", old);
    let (new, err) = outcome_of_success(gen(
        "gh200",
        Some(&q),
        &["libvirt", "--libvirt-version", "12.8"],
    ));
    assert!(!err.contains("acpi-generic-initiator"), "{err}");
    assert!(new.contains("<acpi nodeset='1-8'/>"), "{new}");
    assert!(!new.contains("-object"), "{new}");
    insta::assert_snapshot!("libvirt-gh200-12.8", new);
    if crate::installed_tools::have("virt-xml-validate") {
        let path = dir.path().join("gb200.xml");
        std::fs::write(&path, &old).unwrap();
        crate::installed_tools::validate(&path);
    }
}

/// The QEMU version gates hold for libvirt too (libvirt runs that QEMU).
#[test]
fn libvirt_refuses_a_qemu_without_generic_initiators() {
    let dir = tempfile::tempdir().unwrap();
    let out = gen(
        "gh200",
        Some(&fake_qemu(dir.path(), "8.2.2")),
        &["libvirt", "--libvirt-version", "12.8"],
    );
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("needs QEMU >= 9.0.0"));
}

/// Cloud Hypervisor: a memory zone per CPU node, a Generic Initiator `--numa` per GPU node
/// naming the GPU's `--device id` (CH >= 51: vmm/src/config.rs `NumaConfig::device_id`).
#[test]
fn cloud_hypervisor_numa_device_ids() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = crate::gen_golden::ch_kernel_config(dir.path());
    let (text, _) = outcome_of_success(gen(
        "gb200",
        None,
        &["cloud-hypervisor", "--format", "argv", "--config", &cfg],
    ));
    assert_eq!(text.matches(",device_id=gpu").count(), 32, "{text}");
    assert!(
        text.contains("guest_numa_id=33,device_id=gpu3,distances=[0@40,1@20,"),
        "{text}"
    );
    assert!(text.contains("--memory\nsize=0\n"), "{text}");
    insta::assert_snapshot!("cloud-hypervisor-gb200", text);
}

/// `check` on a Grace host: its rows, each with the fix where it does not pass; a QEMU
/// without generic initiators fails the QEMU row naming the version needed.
#[test]
fn check_has_the_grace_rows() {
    let dir = tempfile::tempdir().unwrap();
    let run = |qemu: &str| {
        let out = crate::cli::vfio_p2p()
            .args(["--example", "gb200", "check", "--format", "json", "--qemu"])
            .arg(fake_qemu(dir.path(), qemu))
            .output()
            .unwrap();
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    let row = |r: &serde_json::Value, check: &str| -> serde_json::Value {
        r["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["check"] == check)
            .cloned()
            .unwrap_or_else(|| panic!("no {check} row: {r}"))
    };
    let new = run("11.1.3");
    for c in [
        "grace-driver",
        "grace-kernel-config",
        "grace-hugepages",
        "grace-smmu",
        "grace-numa-nodes",
    ] {
        row(&new, c);
    }
    assert_eq!(row(&new, "grace-qemu")["status"], "pass");
    assert_eq!(row(&new, "grace-hugepages")["status"], "pass");
    let old = run("8.2.2");
    assert_eq!(row(&old, "grace-qemu")["status"], "fail");
    assert!(row(&old, "grace-qemu")["fix"]
        .as_str()
        .unwrap()
        .contains("QEMU >= 9.0.0"));
    // x86 hosts get none of them
    let out = crate::cli::vfio_p2p()
        .args(["--example", "hgx-h100", "check", "--format", "json"])
        .output()
        .unwrap();
    assert!(!String::from_utf8_lossy(&out.stdout).contains("grace-"));
}
