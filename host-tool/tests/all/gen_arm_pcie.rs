//! An aarch64 host whose GPUs are plain PCIe cards (`--example altra-pcie`: an Ampere Altra
//! Max, 2 switches of 2 H100 PCIe): gen writes an aarch64 `virt` guest with the x86 guest's
//! tree (expanders, root ports, the mirrored switches, the cliques) and none of q35's or
//! Grace's pieces. The x86 goldens in `gen_golden` stay as they were.

use std::path::Path;
use std::process::Output;

use crate::cli::outcome_of_success;
use crate::gen_grace::fake_qemu;

const EXAMPLE: &str = "altra-pcie";
/// One GPU: its 128 GiB + 32 MiB of BARs take a 256 GiB slot, which with the 32 GiB left
/// for other devices virt's 512 GiB default holds (two take 1 TiB).
const ONE_GPU: &str = "000c:03:00.0";

fn gen(qemu: Option<&Path>, args: &[&str]) -> Output {
    let mut c = crate::cli::vfio_p2p();
    c.args(["--example", EXAMPLE, "gen"]).args(args);
    if let Some(q) = qemu {
        c.arg("--qemu").arg(q);
    }
    c.output().unwrap()
}

/// What only q35 or a Grace guest has, which an Arm PCIe guest must not carry.
const NOT_ON_ARM_PCIE: [&str; 10] = [
    "q35",
    "x86_64",
    "pci-hole64",
    "pcihole64",
    "ich9",
    "X-PciMmio64Mb",
    "host-phys-bits",
    "acpi-generic-initiator",
    "smmuv3",
    "memory='0'",
];

fn assert_no_foreign_pieces(text: &str) {
    for p in NOT_ON_ARM_PCIE {
        assert!(!text.contains(p), "{p} in:\n{text}");
    }
}

#[test]
fn qemu_and_libvirt_goldens() {
    let dir = tempfile::tempdir().unwrap();
    let q = fake_qemu(dir.path(), "11.1.3");
    let (qemu, err) = outcome_of_success(gen(Some(&q), &["qemu", "--format", "shell"]));
    assert!(!err.contains("not known"), "{err}");
    // q35's address-space rules (OVMF, QEMU's 40 bits) are not an aarch64 guest's
    assert!(!err.contains("physical address width"), "{err}");
    assert!(qemu.starts_with("qemu-system-aarch64"), "{qemu}");
    assert!(
        qemu.contains("-machine virt,accel=kvm,gic-version=3,highmem-mmio-size=2048G \\"),
        "{qemu}"
    );
    assert!(qemu.contains("/usr/share/AAVMF/AAVMF_CODE.fd"), "{qemu}");
    // the x86 guest's tree: an expander per root complex, the switches mirrored
    assert_eq!(qemu.matches("\"driver\":\"pxb-pcie\"").count(), 2, "{qemu}");
    assert_eq!(qemu.matches("\"driver\":\"x3130-upstream\"").count(), 2);
    assert_eq!(qemu.matches("\"x-nv-gpudirect-clique\":0").count(), 2);
    assert_eq!(qemu.matches("\"x-nv-gpudirect-clique\":1").count(), 2);
    assert_no_foreign_pieces(&qemu);
    insta::assert_snapshot!("qemu-altra-pcie", qemu);

    let (xml, _) = outcome_of_success(gen(Some(&q), &["libvirt", "--libvirt-version", "12.8"]));
    assert!(
        xml.contains("<type arch='aarch64' machine='virt'>hvm</type>"),
        "{xml}"
    );
    assert!(xml.contains("<gic version='3'/>"), "{xml}");
    assert!(xml.contains("highmem-mmio-size=2048G"), "{xml}");
    assert_eq!(xml.matches("model='pcie-switch-upstream-port'").count(), 2);
    assert!(!xml.contains("<iommu"), "{xml}");
    assert!(!xml.contains("maxphysaddr"), "{xml}");
    assert_no_foreign_pieces(&xml);
    insta::assert_snapshot!("libvirt-altra-pcie-12.8", xml);
}

/// Cloud Hypervisor has no machine type to choose: its line is the same on aarch64, and
/// nothing in it is x86's.
#[test]
fn cloud_hypervisor_golden() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = crate::gen_golden::ch_kernel_config(dir.path());
    let (text, _) = outcome_of_success(gen(
        None,
        &["cloud-hypervisor", "--format", "argv", "--config", &cfg],
    ));
    assert_eq!(text.matches("x_nv_gpudirect_clique=").count(), 4, "{text}");
    assert_no_foreign_pieces(&text);
    insta::assert_snapshot!("cloud-hypervisor-altra-pcie", text);
}

/// The high window's gate: 4 GPUs need 2 TiB, which QEMU < 10.0 cannot give (refused);
/// one GPU fits virt's 512 GiB default, written without highmem-mmio-size for any QEMU;
/// without --qemu the window is written with a warning naming the version it needs.
#[test]
fn the_high_window_gate() {
    let dir = tempfile::tempdir().unwrap();
    let old = fake_qemu(dir.path(), "9.2.0");
    let out = gen(Some(&old), &["qemu"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("need a 2048 GiB high PCIe window") && err.contains("QEMU >= 10.0.0"),
        "{err}"
    );
    let (text, _) = outcome_of_success(gen(Some(&old), &["qemu", "--gpus", ONE_GPU]));
    assert!(
        text.contains("-machine virt,accel=kvm,gic-version=3 \\"),
        "{text}"
    );
    assert!(!text.contains("highmem-mmio-size"), "{text}");
    let (_, err) = outcome_of_success(gen(None, &["qemu"]));
    assert!(
        err.contains(
            "2048 GiB high PCIe window, written as highmem-mmio-size, which needs QEMU >= 10.0.0"
        ),
        "{err}"
    );
}

/// virt has no AHCI controller: a sata disk is refused at its vm.yaml line.
#[test]
fn a_sata_disk_is_refused_at_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("vm.yaml");
    std::fs::write(
        &cfg,
        "name: vm0\ndisks:\n  - path: /x.qcow2\n    bus: sata\n",
    )
    .unwrap();
    for target in ["qemu", "libvirt"] {
        let out = gen(None, &[target, "--config", cfg.to_str().unwrap()]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{target}");
        assert!(
            err.contains("vm.yaml:3:11: disks: /x.qcow2 is a sata disk")
                && err.contains("use bus: virtio"),
            "{target}: {err}"
        );
    }
}

/// `check --domain-xml FILE --format json` on the example: its exit code and its rows.
fn check_domain(xml: &str, dir: &Path) -> (Option<i32>, Vec<serde_json::Value>) {
    let path = dir.join("domain.xml");
    std::fs::write(&path, xml).unwrap();
    let out = crate::cli::vfio_p2p()
        .args([
            "--example",
            EXAMPLE,
            "check",
            "--format",
            "json",
            "--domain-xml",
        ])
        .arg(&path)
        .output()
        .unwrap();
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    (
        out.status.code(),
        report["checks"].as_array().unwrap().clone(),
    )
}

/// The example against its own `gen libvirt` domain (a fresh host, the GPUs bound by
/// libvirt at start): an Arm `virt` machine whose window is `highmem-mmio-size`, nothing
/// warns or fails, no Grace row; without the window, virt's 512 GiB default is judged and
/// fails with the fix for virt, not q35's.
#[test]
fn check_passes_its_own_domain_and_judges_virts_window() {
    let dir = tempfile::tempdir().unwrap();
    let (xml, _) = outcome_of_success(gen(None, &["libvirt"]));
    let (code, rows) = check_domain(&xml, dir.path());
    for r in &rows {
        assert!(
            r["status"] == "pass" || r["status"] == "skip",
            "{r}\n{rows:#?}"
        );
        assert!(!r["check"].as_str().unwrap().starts_with("grace-"), "{r}");
    }
    assert_eq!(code, Some(0));
    let mmio = rows.iter().find(|r| r["check"] == "mmio-window").unwrap();
    assert!(
        mmio["saw"].as_str().unwrap().contains("sets 2048 GiB"),
        "{mmio}"
    );
    let no_window: String = xml
        .lines()
        .filter(|l| !l.contains("highmem-mmio-size") && !l.contains("value='-machine'"))
        .map(|l| format!("{l}\n"))
        .collect();
    let (code, rows) = check_domain(&no_window, dir.path());
    let mmio = rows.iter().find(|r| r["check"] == "mmio-window").unwrap();
    assert_eq!(mmio["status"], "fail", "{mmio}");
    assert!(
        mmio["saw"]
            .as_str()
            .unwrap()
            .contains("Arm virt's default high PCIe window sets only 512 GiB"),
        "{mmio}"
    );
    let fix = mmio["fix"].as_str().unwrap();
    assert!(
        fix.contains("highmem-mmio-size=2048G") && !fix.contains("q35"),
        "{fix}"
    );
    assert_eq!(code, Some(2));
}
