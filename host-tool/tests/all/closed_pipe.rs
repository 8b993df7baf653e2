//! Every printing command into a pipe whose reader is gone (`vfio-p2p topo | head -1`,
//! `| true`): the host tool keeps SIGPIPE's default action and ends by it, quietly, never
//! with a panic (issue 40; the agent's side is guest-agent/tests/cli.rs).

use std::os::unix::process::ExitStatusExt;

const EXAMPLE: [&str; 2] = ["--example", "dual-socket-pcie"];

#[test]
fn every_printing_command_ends_quietly_into_a_closed_pipe() {
    let dir = tempfile::tempdir().unwrap();
    let domain = dir.path().join("domain.xml");
    let gen = crate::cli::vfio_p2p()
        .args(EXAMPLE)
        .args(["gen", "libvirt"])
        .output()
        .unwrap();
    std::fs::write(&domain, &gen.stdout).unwrap();
    let domain = domain.to_str().unwrap();
    // Cloud Hypervisor needs a kernel or firmware from vm.yaml
    let ch_yaml = dir.path().join("ch.yaml");
    std::fs::write(&ch_yaml, "name: vm0\nkernel: /boot/vmlinuz\n").unwrap();
    let ch_yaml = ch_yaml.to_str().unwrap();
    let state = dir.path().to_str().unwrap();
    let commands: &[&[&str]] = &[
        &["topo"],
        &["topo", "--format", "json"],
        &["topo", "--format", "dot"],
        &["plan"],
        &["place", "--shape", "2x4"],
        &["check"],
        &["check", "--domain-xml", domain],
        &["gen", "qemu"],
        &["gen", "libvirt"],
        &["gen", "cloud-hypervisor", "--config", ch_yaml],
        &["gen", "nccl"],
        &["gen", "proxmox"],
        &["gen", "incus"],
        &["libvirt", "patch", domain],
        &["verdicts", "--state-dir", state],
        &["--help"],
    ];
    for args in commands {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let out = std::process::Command::new(crate::cli::bin())
            .args(EXAMPLE)
            .args(*args)
            .stdout(writer)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(!err.contains("Broken pipe"), "{args:?}: {err}");
        assert_eq!(out.status.signal(), Some(libc::SIGPIPE), "{args:?}: {err}");
    }
}
