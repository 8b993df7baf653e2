//! A fresh host (issue 40): the GPUs still on `nvidia` until whoever starts the VM binds
//! them. `check` of a VM definition that binds at start tells what will happen and does
//! not fail; one that does not (an unmanaged libvirt hostdev) still fails.

use std::path::Path;

use crate::cli::{succeeded, vfio_p2p};

const EXAMPLE: [&str; 2] = ["--example", "dual-socket-pcie"];

/// `gen KIND` of the example, written to `dir/name`.
fn generated(dir: &Path, kind: &str, name: &str) -> std::path::PathBuf {
    let (stdout, _) = succeeded(vfio_p2p().args(EXAMPLE).args(["gen", kind]));
    let path = dir.join(name);
    std::fs::write(&path, stdout).unwrap();
    path
}

/// `check` with `flag FILE`: its exit code and its rows in JSON.
fn check(flag: &str, file: &Path) -> (i32, Vec<serde_json::Value>) {
    let out = vfio_p2p()
        .args(EXAMPLE)
        .args(["check", "--format", "json", flag])
        .arg(file)
        .output()
        .unwrap();
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = report["checks"].as_array().unwrap().clone();
    (out.status.code().unwrap(), rows)
}

#[test]
fn a_vm_whose_starter_binds_the_gpus_passes_on_a_fresh_host() {
    let dir = tempfile::tempdir().unwrap();
    for (kind, flag, by) in [
        ("libvirt", "--domain-xml", "libvirt (managed='yes')"),
        ("proxmox", "--proxmox-conf", "Proxmox (qm start)"),
        ("incus", "--incus-config", "Incus (incus start)"),
    ] {
        let file = generated(dir.path(), kind, kind);
        let (code, rows) = check(flag, &file);
        let groups: Vec<_> = rows
            .iter()
            .filter(|r| r["check"] == "iommu-group")
            .collect();
        assert_eq!(groups.len(), 8, "{kind}");
        for g in groups {
            assert_eq!(g["status"], "pass", "{kind}: {g}");
            let saw = g["saw"].as_str().unwrap();
            assert!(saw.contains("(nvidia)"), "{kind}: {saw}");
            assert!(
                saw.contains(&format!("not yet bound: {by} binds")),
                "{kind}: {saw}"
            );
        }
        // what is left are the probes an embedded example cannot run: skipped, saying so
        for r in rows.iter().filter(|r| r["status"] != "pass") {
            assert_eq!(r["status"], "skip", "{kind}: {r}");
            assert!(
                r["saw"]
                    .as_str()
                    .unwrap()
                    .starts_with("not probed: an embedded example"),
                "{kind}: {r}"
            );
        }
        assert_eq!(
            code, 0,
            "{kind}: a healthy fresh host; the probes not run do not count"
        );
    }
}

#[test]
fn an_unmanaged_hostdev_on_a_fresh_host_still_fails() {
    let dir = tempfile::tempdir().unwrap();
    let file = generated(dir.path(), "libvirt", "domain.xml");
    let xml = std::fs::read_to_string(&file).unwrap();
    std::fs::write(&file, xml.replace("managed='yes'", "managed='no'")).unwrap();
    let (code, rows) = check("--domain-xml", &file);
    let fails: Vec<_> = rows.iter().filter(|r| r["status"] == "fail").collect();
    assert_eq!(fails.len(), 8, "{fails:#?}");
    assert!(fails.iter().all(|r| r["check"] == "iommu-group"));
    assert_eq!(code, 2);
}

/// Every x86 example is a healthy fresh host: checked against the domain `gen libvirt`
/// writes for it, nothing warns or fails; what needs the live host is a `skip` row that
/// says so, and the exit code is 0 (warnings would make it 1).
#[test]
fn each_x86_example_with_its_own_domain_exits_0() {
    let dir = tempfile::tempdir().unwrap();
    for example in ["hgx-h100", "dual-socket-pcie", "lab"] {
        let (code, text) = check_against_own_domain(example, dir.path());
        assert_eq!(code, Some(0), "{example}:\n{text}");
        assert!(text.contains("overall: pass"), "{example}:\n{text}");
        assert!(
            text.contains("skip "),
            "{example}: skipped rows shown\n{text}"
        );
    }
}

/// `check --domain-xml` of `example` against the domain `gen libvirt` wrote for it: the
/// exit code and the table.
fn check_against_own_domain(example: &str, dir: &std::path::Path) -> (Option<i32>, String) {
    let out = vfio_p2p()
        .args(["--example", example, "gen", "libvirt"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{example}");
    let xml = dir.join(format!("{example}.xml"));
    std::fs::write(&xml, &out.stdout).unwrap();
    let out = vfio_p2p()
        .args(["--example", example, "check", "--domain-xml"])
        .arg(&xml)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// A Grace example against its own `gen libvirt` domain: an Arm `virt` machine, whose GPU
/// BARs go in the high PCIe window of `highmem-mmio-size` (gen writes it), never q35's
/// 32 GiB hole; nothing fails. What is left are warnings about this machine's own QEMU
/// and libvirt (a Grace guest asks for newer ones than a build machine may have).
#[test]
fn each_grace_example_with_its_own_domain_fails_nothing() {
    let dir = tempfile::tempdir().unwrap();
    for example in ["gh200", "gb200"] {
        let (code, text) = check_against_own_domain(example, dir.path());
        assert!(matches!(code, Some(0 | 1)), "{example}:\n{text}");
        assert!(!text.contains("│ fail "), "{example}:\n{text}");
        let mmio = text.lines().find(|l| l.contains(" mmio-window ")).unwrap();
        assert!(mmio.contains("│ pass "), "{example}:\n{text}");
    }
}
