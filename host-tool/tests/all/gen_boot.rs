//! Generated VMs boot as written (issue 40): Cloud Hypervisor gets its kernel or firmware
//! from vm.yaml, QEMU a copy of the OVMF vars template and, asked, a QMP socket and
//! `-daemonize`; a key a target cannot honour is refused at its vm.yaml line.

use std::path::Path;

/// `gen TARGET --config vm.yaml` (vm.yaml = `yaml`) for the flat-vm example:
/// (exit code, stdout, stderr).
fn gen(dir: &Path, target: &str, yaml: &str) -> (i32, String, String) {
    let config = dir.join("vm.yaml");
    std::fs::write(&config, yaml).unwrap();
    let argv = ["qemu", "cloud-hypervisor"].contains(&target);
    let out = crate::cli::vfio_p2p()
        .args(["--example", "flat-vm", "gen", target, "--config"])
        .arg(&config)
        .args(argv.then_some(["--format", "argv"]).into_iter().flatten())
        .output()
        .unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (
        out.status.code().unwrap(),
        text(&out.stdout),
        text(&out.stderr),
    )
}

/// The value after `flag` in an argv printed one per line.
fn after<'a>(argv: &'a str, flag: &str) -> Vec<&'a str> {
    let lines: Vec<&str> = argv.lines().collect();
    lines
        .windows(2)
        .filter(|w| w[0] == flag)
        .map(|w| w[1])
        .collect()
}

#[test]
fn cloud_hypervisor_boots_the_kernel_or_firmware_of_vm_yaml() {
    let t = tempfile::tempdir().unwrap();
    let (code, argv, _) = gen(
        t.path(),
        "cloud-hypervisor",
        "name: a\nkernel: /boot/vmlinuz\ninitramfs: /boot/initrd.img\ncmdline: console=ttyS0 root=/dev/vda1\n",
    );
    assert_eq!(code, 0);
    assert_eq!(after(&argv, "--kernel"), ["/boot/vmlinuz"]);
    assert_eq!(after(&argv, "--initramfs"), ["/boot/initrd.img"]);
    assert_eq!(after(&argv, "--cmdline"), ["console=ttyS0 root=/dev/vda1"]);
    let (code, argv, _) = gen(
        t.path(),
        "cloud-hypervisor",
        "name: a\nfirmware: uefi\novmf_code: /usr/share/cloud-hypervisor/CLOUDHV.fd\n",
    );
    assert_eq!(code, 0);
    assert_eq!(
        after(&argv, "--firmware"),
        ["/usr/share/cloud-hypervisor/CLOUDHV.fd"]
    );
    // firmware: uefi with QEMU's OVMF (gen's default ovmf_code): refused at its line
    let (code, _, err) = gen(t.path(), "cloud-hypervisor", "name: a\nfirmware: uefi\n");
    assert_eq!(code, 2);
    assert!(
        err.contains("vm.yaml:2:11: firmware: uefi under Cloud Hypervisor"),
        "{err}"
    );
    // neither: refused, naming the VM and the keys to add; nothing written
    let (code, argv, err) = gen(t.path(), "cloud-hypervisor", "name: a\n");
    assert_eq!(code, 2);
    assert!(argv.is_empty(), "{argv}");
    assert!(
        err.contains("error: a: Cloud Hypervisor boots nothing"),
        "{err}"
    );
    assert!(
        err.contains("add kernel: PATH")
            && err.contains("ovmf_code: set to")
            && err.contains("CLOUDHV.fd"),
        "{err}"
    );
    // firmware: bios (CH has none): refused at its line
    let (code, _, err) = gen(t.path(), "cloud-hypervisor", "name: a\nfirmware: bios\n");
    assert_eq!(code, 2);
    assert!(
        err.contains("vm.yaml:2:11: a: Cloud Hypervisor boots nothing"),
        "{err}"
    );
}

#[test]
fn qemu_gets_its_own_copy_of_the_vars_template() {
    let t = tempfile::tempdir().unwrap();
    let template = "name: a\nfirmware: uefi\novmf_vars: /usr/share/OVMF/OVMF_VARS_4M.fd\n";
    let (code, _, err) = gen(t.path(), "qemu", template);
    assert_eq!(code, 2);
    assert!(
        err.contains("vm.yaml:3:12: ovmf_vars: /usr/share/OVMF/OVMF_VARS_4M.fd is the template"),
        "{err}"
    );
    let (code, _, err) = gen(t.path(), "qemu", "name: a\nfirmware: uefi\n");
    assert_eq!(code, 2);
    assert!(
        err.contains("vm.yaml:2:11: firmware: uefi needs OVMF's variable store"),
        "{err}"
    );
    let copy = t.path().join("a_VARS.fd");
    let yaml = format!("{template}ovmf_vars_copy: {}\n", copy.display());
    let (code, argv, err) = gen(t.path(), "qemu", &yaml);
    assert_eq!(code, 0, "{err}");
    let drives = after(&argv, "-drive");
    assert!(
        drives.contains(&format!("if=pflash,format=raw,unit=1,file={}", copy.display()).as_str()),
        "{drives:?}"
    );
    assert!(!argv.contains("unit=1,file=/usr/share/OVMF"), "{argv}");
    // generated from an example: the copy is for the machine that runs the VM
    assert!(!copy.exists());
    assert!(
        err.contains("install -m 600 /usr/share/OVMF/OVMF_VARS_4M.fd"),
        "{err}"
    );
    // libvirt copies the template itself, to the file named
    let (code, xml, _) = gen(t.path(), "libvirt", &yaml);
    assert_eq!(code, 0);
    let nvram = format!(
        "<nvram template='/usr/share/OVMF/OVMF_VARS_4M.fd'>{}</nvram>",
        copy.display()
    );
    assert!(xml.contains(&nvram), "{xml}");
}

#[test]
fn qemu_as_a_service_gets_a_qmp_socket_and_daemonizes() {
    let t = tempfile::tempdir().unwrap();
    let yaml = "name: a\nconsole: socket\nqmp_socket: /run/vfio-p2p/a.qmp\ndaemonize: true\n";
    let (code, argv, err) = gen(t.path(), "qemu", yaml);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        after(&argv, "-qmp"),
        ["unix:/run/vfio-p2p/a.qmp,server=on,wait=off"]
    );
    assert_eq!(after(&argv, "-pidfile"), ["/run/vfio-p2p/a.pid"]);
    assert!(argv.lines().any(|l| l == "-daemonize"), "{argv}");
    assert!(!argv.contains("stdio"), "{argv}");
    // without daemonize: the socket only
    let (_, argv, _) = gen(t.path(), "qemu", "name: a\nqmp_socket: /run/a.qmp\n");
    assert_eq!(after(&argv, "-qmp"), ["unix:/run/a.qmp,server=on,wait=off"]);
    assert!(!argv.contains("-daemonize"));
    // the terminal's serial console cannot go with -daemonize
    let (code, _, err) = gen(
        t.path(),
        "qemu",
        "name: a\nqmp_socket: /run/a.qmp\ndaemonize: true\n",
    );
    assert_eq!(code, 2);
    assert!(
        err.contains("vm.yaml:3:12") && err.contains("console: socket or none"),
        "{err}"
    );
}

#[test]
fn a_key_the_target_cannot_honour_is_refused_at_its_line() {
    let t = tempfile::tempdir().unwrap();
    for target in ["qemu", "libvirt", "proxmox", "incus"] {
        let (code, _, err) = gen(t.path(), target, "name: a\nkernel: /boot/vmlinuz\n");
        assert_eq!(code, 2, "{target}");
        assert!(
            err.contains("vm.yaml:2:9: kernel: is booted by Cloud Hypervisor only"),
            "{target}: {err}"
        );
    }
    for target in ["libvirt", "cloud-hypervisor", "proxmox", "incus"] {
        let (code, _, err) = gen(t.path(), target, "name: a\nqmp_socket: /run/a.qmp\n");
        assert_eq!(code, 2, "{target}");
        assert!(
            err.contains("vm.yaml:2:13: qmp_socket: and daemonize:"),
            "{target}: {err}"
        );
    }
}

/// Issue 40: an unknown key said "error:" twice and named `<input>` in the parser's snippet.
#[test]
fn a_vm_yaml_parse_error_says_error_once_and_names_the_file() {
    let t = tempfile::tempdir().unwrap();
    let (code, _, err) = gen(t.path(), "qemu", "name: a\nbogus: 1\n");
    assert_eq!(code, 2);
    let config = t.path().join("vm.yaml");
    let expected = format!("error: {}:2:1: unknown field `bogus`", config.display());
    assert!(err.starts_with(&expected), "{err}");
    assert_eq!(err.matches("error").count(), 1, "{err}");
    assert!(!err.contains("<input>"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}
