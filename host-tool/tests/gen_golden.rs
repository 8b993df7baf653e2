//! Golden files for every generator on the embedded example hosts.

use assert_cmd::Command;

fn gen(example: &str, args: &[&str]) -> String {
    let out = Command::cargo_bin("vfio-p2p")
        .unwrap()
        .args(["--example", example, "gen"])
        .args(args)
        .args(if args.contains(&"--libvirt-version") {
            &[][..]
        } else {
            &["--libvirt-version", "9.0"][..]
        })
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "gen {args:?} on {example} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

const EXAMPLES: [&str; 3] = ["hgx-h100", "dual-socket-pcie", "flat-vm"];

#[test]
fn qemu_mirror_and_flat() {
    for ex in EXAMPLES {
        for topo in ["mirror", "flat"] {
            let text = gen(ex, &["qemu", "--format", "argv", "--guest-topology", topo]);
            insta::assert_snapshot!(format!("qemu-{ex}-{topo}"), text);
        }
    }
}

#[test]
fn qemu_uefi_config() {
    let cfg = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../configs/hgx-h100-mirror.yaml"
    );
    insta::assert_snapshot!(gen(
        "hgx-h100",
        &["qemu", "--config", cfg, "--format", "shell"]
    ));
}

#[test]
fn libvirt_domains() {
    for ex in EXAMPLES {
        insta::assert_snapshot!(format!("libvirt-{ex}"), gen(ex, &["libvirt"]));
    }
    insta::assert_snapshot!(
        "libvirt-dual-socket-pcie-8.1",
        gen("dual-socket-pcie", &["libvirt", "--libvirt-version", "8.1"])
    );
}

#[test]
fn cloud_hypervisor() {
    for ex in EXAMPLES {
        insta::assert_snapshot!(
            format!("cloud-hypervisor-{ex}"),
            gen(ex, &["cloud-hypervisor", "--format", "argv"])
        );
    }
}

#[test]
fn nccl_topology() {
    for ex in EXAMPLES {
        insta::assert_snapshot!(format!("nccl-{ex}"), gen(ex, &["nccl"]));
    }
}

#[test]
fn nccl_fixture_for_the_gpu_check_is_current() {
    let want = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fixtures/nccl/h200x2-topo.xml"
    ))
    .unwrap();
    // The file checked with real NCCL on the GPU machine was made from the VM's sysfs alone
    // (the flat-vm example now also carries its nvidia-smi capture).
    let out = Command::cargo_bin("vfio-p2p")
        .unwrap()
        .arg("--sysfs-root")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/sysfs/h200x2-vm-sysfs.json"
        ))
        .args(["gen", "nccl", "--as-is"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), want);
}

#[test]
fn expectation_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("expect.json");
    let argv = gen(
        "dual-socket-pcie",
        &[
            "qemu",
            "--format",
            "argv",
            "--expect-out",
            path.to_str().unwrap(),
        ],
    );
    assert!(argv.contains(&format!(
        "name=opt/vfio-p2p/expect.json,file={}",
        path.display()
    )));
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(v["version"], 1);
    assert_eq!(v["gpus"].as_array().unwrap().len(), 8);
    assert_eq!(v["gpus"][0]["host_bdf"], "0000:05:00.0");
    assert_eq!(v["gpus"][0]["guest_bdf"], "0000:25:00.0");
    assert_eq!(v["gpus"][0]["clique"], 0);
    assert_eq!(v["pairs"].as_array().unwrap().len(), 28);
    insta::assert_json_snapshot!("expectation-dual-socket-pcie", v);
}

fn patch(xml: &str, extra: &[&str]) -> (bool, String, String) {
    let out = Command::cargo_bin("vfio-p2p")
        .unwrap()
        .args(["--example", "dual-socket-pcie", "libvirt", "patch", "-"])
        .args(extra)
        .write_stdin(xml)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

const EXISTING: &str = include_str!("../../tests/fixtures/libvirt/existing-domain.xml");

#[test]
fn libvirt_patch_keeps_the_rest_and_is_idempotent() {
    let (ok, once, err) = patch(EXISTING, &["--libvirt-version", "9.0"]);
    assert!(ok, "{err}");
    insta::assert_snapshot!("libvirt-patch-existing", once);
    // Everything that was there is still there, in order, byte for byte.
    let mut rest = once.as_str();
    for line in EXISTING.lines() {
        // The domain start tag gains xmlns:qemu before its `>`.
        let line = line.strip_suffix('>').unwrap_or(line);
        let at = rest
            .find(line)
            .unwrap_or_else(|| panic!("lost line {line:?}"));
        rest = &rest[at + line.len()..];
    }
    let (ok, twice, _) = patch(&once, &["--libvirt-version", "9.0"]);
    assert!(ok);
    assert_eq!(once, twice);
}

#[test]
fn libvirt_patch_old_libvirt_uses_set_and_warns() {
    let (ok, once, err) = patch(EXISTING, &["--libvirt-version", "8.0"]);
    assert!(ok, "{err}");
    assert!(err.contains("-set"), "{err}");
    assert!(once.contains("<qemu:arg value='device.ua-second.x-nv-gpudirect-clique=0'/>"));
    let (_, twice, _) = patch(&once, &["--libvirt-version", "8.0"]);
    assert_eq!(once, twice);
}

#[test]
fn libvirt_patch_refuses_hidden_hypervisor() {
    let hidden = EXISTING.replace("<hidden state=\"off\"/>", "<hidden state='on'/>");
    let (ok, _, err) = patch(&hidden, &["--libvirt-version", "9.0"]);
    assert!(!ok);
    assert!(err.contains("hides the hypervisor"), "{err}");
}

/// The iommufd backend: `-object iommufd` and `iommufd=` on every vfio-pci (QEMU); libvirt
/// >= 12.1's `<driver iommufd='yes'/>`, and QEMU's own options on an older libvirt (11.3).
#[test]
fn iommufd_backend() {
    insta::assert_snapshot!(
        "qemu-flat-vm-iommufd",
        gen(
            "flat-vm",
            &["qemu", "--format", "argv", "--iommu-backend", "iommufd"]
        )
    );
    for v in ["11.3", "12.8"] {
        insta::assert_snapshot!(
            format!("libvirt-flat-vm-iommufd-{v}"),
            gen(
                "flat-vm",
                &[
                    "libvirt",
                    "--libvirt-version",
                    v,
                    "--iommu-backend",
                    "iommufd"
                ]
            )
        );
    }
    // auto on an example (no live host): legacy, and it says so
    let out = Command::cargo_bin("vfio-p2p")
        .unwrap()
        .args([
            "--example",
            "flat-vm",
            "gen",
            "qemu",
            "--iommu-backend",
            "auto",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(!String::from_utf8_lossy(&out.stdout).contains("iommufd"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("iommu backend auto: legacy"), "{err}");
}

/// Cloud Hypervisor under iommufd cannot map peer BARs: cliques are refused with the fix;
/// without cliques it gets `--platform iommufd=on,vfio_p2p_dma=off`.
#[test]
fn cloud_hypervisor_iommufd() {
    let out = Command::cargo_bin("vfio-p2p")
        .unwrap()
        .args([
            "--example",
            "dual-socket-pcie",
            "gen",
            "cloud-hypervisor",
            "--iommu-backend",
            "iommufd",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--iommu-backend legacy"), "{err}");
    let text = gen(
        "flat-vm",
        &[
            "cloud-hypervisor",
            "--iommu-backend",
            "iommufd",
            "--gpus",
            "00:06.0",
            "--format",
            "argv",
        ],
    );
    assert!(text.contains("iommufd=on,vfio_p2p_dma=off"), "{text}");
}
