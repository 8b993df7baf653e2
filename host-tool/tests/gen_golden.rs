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

#[test]
fn proxmox_config() {
    let cfg = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../configs/hgx-h100-mirror.yaml"
    );
    insta::assert_snapshot!(
        "proxmox-dual-socket-pcie",
        gen(
            "dual-socket-pcie",
            &[
                "proxmox",
                "--config",
                cfg,
                "--gpus",
                "05:00.0,06:00.0,09:00.0,85:00.0"
            ]
        )
    );
    insta::assert_snapshot!("proxmox-flat-vm", gen("flat-vm", &["proxmox"]));
}

/// `check --proxmox-conf` on a config: (exit code, stdout as JSON).
fn check_proxmox(conf: &str) -> (i32, serde_json::Value) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("100.conf");
    std::fs::write(&path, conf).unwrap();
    let out = Command::cargo_bin("vfio-p2p")
        .unwrap()
        .args(["--example", "dual-socket-pcie", "check", "--format", "json"])
        .arg("--proxmox-conf")
        .arg(&path)
        .output()
        .unwrap();
    let json = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("{e}: {}", String::from_utf8_lossy(&out.stderr));
    });
    (out.status.code().unwrap(), json)
}

fn failing_checks(report: &serde_json::Value) -> Vec<String> {
    report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["status"] == "fail" && c["check"] != "iommu-group")
        .map(|c| format!("{} {}", c["check"], c["subject"]))
        .collect()
}

#[test]
fn proxmox_config_passes_its_own_check() {
    let conf = gen(
        "dual-socket-pcie",
        &["proxmox", "--gpus", "05:00.0,06:00.0,09:00.0,85:00.0"],
    );
    let (_, report) = check_proxmox(&conf);
    // the example's GPUs are still bound to nvidia (iommu-group); nothing else fails
    assert!(failing_checks(&report).is_empty(), "{report:#}");
    let planned = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["check"] == "clique-placement")
        .count();
    assert_eq!(planned, 3, "85:00.0 is on the other socket: no clique");
}

#[test]
fn proxmox_check_finds_missing_cliques_and_hidden_hypervisor() {
    let (code, report) = check_proxmox(
        "machine: q35\ncpu: host,hidden=1\nhostpci0: 0000:05:00.0,pcie=1\n\
         hostpci1: 0000:06:00.0,pcie=1\n\
         args: -set device.hostpci0.x-nv-gpudirect-clique=0\n\n[snap]\ncpu: host\n",
    );
    assert_eq!(code, 2);
    assert_eq!(
        failing_checks(&report),
        [
            "\"mmio-window\" null",
            "\"hypervisor-visible\" null",
            "\"clique-missing\" \"0000:06:00.0\""
        ]
    );
}
