//! `verify: vsock` in vm.yaml: gen adds the vsock device to every VMM's definition, the
//! report port to the expectation, and with `--state-dir` registers the CID for the collector.

use std::path::Path;
use std::process::Command as Process;

fn gen(dir: &Path, target: &str, config: &str, extra: &[&str]) -> std::process::Output {
    let cfg = dir.join(format!("{config}.yaml"));
    crate::cli::vfio_p2p()
        .args(["--example", "dual-socket-pcie", "gen", target, "--config"])
        .arg(&cfg)
        .args(extra)
        .output()
        .unwrap()
}

fn write_configs(dir: &Path) {
    std::fs::write(
        dir.join("a.yaml"),
        "name: vm-a\nverify: vsock\nvsock_cid: 42\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("b.yaml"),
        "name: vm-b\nverify: vsock\nvsock_cid: 42\n",
    )
    .unwrap();
}

#[test]
fn every_vmm_gets_the_vsock_device_and_the_expectation_its_port() {
    let t = tempfile::tempdir().unwrap();
    write_configs(t.path());
    let out = gen(t.path(), "qemu", "a", &["--format", "json"]);
    assert!(out.status.success());
    let argv: Vec<String> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        argv[argv.len() - 2..],
        ["-device", "vhost-vsock-pci,guest-cid=42,id=vsock0"]
    );
    let fw = argv
        .iter()
        .find(|a| a.starts_with("name=opt/vfio-p2p/expect.json"))
        .unwrap();
    assert!(fw.ends_with(r#""report":{"vsock_port":7389}}"#), "{fw}");
    // Cloud Hypervisor boots what vm.yaml names (the other VMMs refuse kernel:)
    let a = std::fs::read_to_string(t.path().join("a.yaml")).unwrap();
    std::fs::write(t.path().join("a-ch.yaml"), a + "kernel: /boot/vmlinuz\n").unwrap();
    let ch = gen(t.path(), "cloud-hypervisor", "a-ch", &["--format", "argv"]);
    let ch = String::from_utf8(ch.stdout).unwrap();
    assert!(
        ch.ends_with("--vsock\ncid=42,socket=/run/vfio-p2p/vsock/vm-a.sock\n"),
        "{ch}"
    );
    let xml = gen(t.path(), "libvirt", "a", &["--libvirt-version", "9.0"]);
    let xml = String::from_utf8(xml.stdout).unwrap();
    assert!(
        xml.contains("<vsock model='virtio'>\n      <cid auto='no' address='42'/>"),
        "{xml}"
    );
    if Process::new("virt-xml-validate")
        .arg("--version")
        .output()
        .is_ok()
    {
        let f = t.path().join("dom.xml");
        std::fs::write(&f, &xml).unwrap();
        let v = Process::new("virt-xml-validate")
            .arg(&f)
            .arg("domain")
            .output()
            .unwrap();
        assert!(v.status.success(), "{}", String::from_utf8_lossy(&v.stderr));
    }
}

#[test]
fn state_dir_registers_the_plan_and_refuses_a_taken_cid() {
    let t = tempfile::tempdir().unwrap();
    write_configs(t.path());
    let state = t.path().join("state");
    let s = state.to_str().unwrap();
    assert!(gen(t.path(), "qemu", "a", &["--state-dir", s])
        .status
        .success());
    let plan: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(state.join("plans/vm-a.json")).unwrap())
            .unwrap();
    assert_eq!(plan["cid"], 42);
    assert_eq!(plan["expectation"]["vm"], "vm-a");
    assert_eq!(plan["expectation"]["report"]["vsock_port"], 7389);
    // gen again for the same VM replaces its plan
    assert!(gen(
        t.path(),
        "libvirt",
        "a",
        &["--state-dir", s, "--libvirt-version", "9.0"]
    )
    .status
    .success());
    let b = gen(t.path(), "qemu", "b", &["--state-dir", s]);
    assert_eq!(b.status.code(), Some(2));
    let err = String::from_utf8(b.stderr).unwrap();
    assert!(err.contains("vsock_cid 42 is already vm-a's"), "{err}");
    assert!(!state.join("plans/vm-b.json").exists());
    // without verify: vsock there is nothing to register
    std::fs::write(t.path().join("c.yaml"), "name: vm-c\n").unwrap();
    let c = gen(t.path(), "qemu", "c", &["--state-dir", s]);
    assert!(String::from_utf8(c.stderr)
        .unwrap()
        .contains("set 'verify: vsock'"));
}
