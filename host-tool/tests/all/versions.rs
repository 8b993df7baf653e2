//! What gen and check say about the QEMU and libvirt they target (issue 40): without
//! `virsh`, gen libvirt assumed 8.2 and told the operator to upgrade; `-v` did not log the
//! versions found.

/// stderr of `vfio-p2p ARGS` with PATH holding no program at all.
fn stderr_without_tools(args: &[&str]) -> String {
    let empty = tempfile::tempdir().unwrap();
    crate::cli::succeeded(crate::cli::vfio_p2p().env("PATH", empty.path()).args(args)).1
}

#[test]
fn gen_libvirt_without_virsh_says_the_version_is_unknown_and_what_it_assumed() {
    let err = stderr_without_tools(&["--example", "flat-vm", "gen", "libvirt"]);
    let line = err
        .lines()
        .find(|l| l.contains("libvirt"))
        .unwrap_or_else(|| panic!("{err}"));
    assert!(
        line.starts_with("warning: neither `virsh --version`"),
        "{line}"
    );
    assert!(line.contains("libvirt's version is unknown"), "{line}");
    assert!(line.contains("written for libvirt 8.2"), "{line}");
    assert!(line.contains("--libvirt-version X.Y"), "{line}");
    assert!(!err.contains("upgrade libvirt"), "{err}");
    assert_eq!(err.matches("libvirt's version").count(), 1, "{err}");
    // a version given is targeted as given, and an old one still gets its advice
    let err = stderr_without_tools(&[
        "--example",
        "flat-vm",
        "gen",
        "libvirt",
        "--libvirt-version",
        "8.0",
    ]);
    assert!(err.contains("libvirt 8.0 has no <qemu:override>"), "{err}");
    assert!(!err.contains("version is unknown"), "{err}");
}

#[test]
fn verbose_logs_the_versions_found() {
    let out = crate::cli::vfio_p2p()
        .args([
            "-v",
            "--example",
            "flat-vm",
            "gen",
            "libvirt",
            "--libvirt-version",
            "10.0",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("info: targeting libvirt 10.0"), "{err}");
    // QEMU: a stand-in that prints what QEMU prints
    let dir = tempfile::tempdir().unwrap();
    let qemu = dir.path().join("qemu-system-x86_64");
    std::fs::write(
        &qemu,
        "#!/bin/sh\necho 'QEMU emulator version 9.2.1 (Debian 1:9.2.1+ds-1)'\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&qemu, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = crate::cli::vfio_p2p()
        .args(["-v", "--example", "flat-vm", "check", "--qemu"])
        .arg(&qemu)
        .output()
        .unwrap();
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.contains(&format!("info: {}: QEMU 9.2.1", qemu.display())),
        "{err}"
    );
}
