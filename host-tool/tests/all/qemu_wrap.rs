//! `qemu-wrap` with `/bin/echo` standing in for QEMU: the argv it passes on (golden), and
//! what it does when planning fails under each `hook_policy`.

/// (exit code, stdout = the argv echo received, stderr).
fn wrap(global: &[&str], extra: &[&str], qemu_args: &[&str]) -> (i32, String, String) {
    let out = crate::cli::vfio_p2p()
        .args(global)
        .args(["qemu-wrap", "--qemu", "/bin/echo"])
        .args(extra)
        .arg("--")
        .args(qemu_args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

const ARGS: [&str; 12] = [
    "-machine",
    "q35",
    "-device",
    r#"{"driver":"vfio-pci","host":"0000:05:00.0","id":"hostdev0","bus":"pci.1","addr":"0x0"}"#,
    "-device",
    "vfio-pci,host=0000:06:00.0,id=hostdev1,bus=pci.2,addr=0x0",
    "-device",
    "vfio-pci,host=0000:09:00.0,id=hostdev2",
    "-set",
    "device.hostdev2.x-nv-gpudirect-clique=0",
    "-device",
    "vfio-pci,host=0000:85:00.0,id=hostdev3",
];

#[test]
fn adds_planned_cliques_golden() {
    let (code, argv, log) = wrap(&["--example", "dual-socket-pcie"], &[], &ARGS);
    assert_eq!(code, 0, "{log}");
    insta::assert_snapshot!(
        "qemu-wrap-dual-socket-pcie",
        format!("{argv}--- stderr\n{log}")
    );
}

#[test]
fn no_vfio_devices_pass_unchanged_without_reading_the_host() {
    let args = ["-machine", "none", "-qmp", "unix:/tmp/x,server", "-S"];
    // the host cannot be read, but nothing asks for it
    let (code, argv, log) = wrap(&["--sysfs-root", "/nonexistent"], &[], &args);
    assert_eq!((code, log.as_str()), (0, ""));
    assert_eq!(argv, args.join(" ") + "\n");
}

#[test]
fn planning_failure_warn_starts_unchanged_deny_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let deny = dir.path().join("host.yaml");
    std::fs::write(&deny, "hook_policy: deny\n").unwrap();
    let global = ["--sysfs-root", "/nonexistent"];
    let (code, argv, log) = wrap(&global, &[], &ARGS);
    assert_eq!(code, 0, "{log}");
    assert_eq!(argv, ARGS.join(" ") + "\n");
    assert!(
        log.starts_with("warning: qemu-wrap: cliques could not be planned: ")
            && log.contains("QEMU starts without them (hook_policy: warn)"),
        "{log}"
    );
    let host_config = deny.to_str().unwrap();
    let (code, argv, log) = wrap(&global, &["--host-config", host_config], &ARGS);
    assert_eq!((code, argv.as_str()), (2, ""));
    assert!(
        log.contains("qemu-wrap: not starting QEMU: cliques could not be planned: ")
            && log.contains("(hook_policy: deny)"),
        "{log}"
    );
}

#[test]
fn hook_install_links_the_wrapper() {
    let prefix = tempfile::tempdir().unwrap();
    let run = |extra: &[&str]| {
        crate::cli::vfio_p2p()
            .args(["hook", "install", "--prefix"])
            .arg(prefix.path())
            .args(extra)
            .output()
            .unwrap()
    };
    let out = run(&["--qemu-wrapper"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let link = prefix
        .path()
        .join("usr/local/libexec/vfio-p2p/qemu-system-x86_64");
    assert_eq!(
        std::fs::canonicalize(std::fs::read_link(&link).unwrap()).unwrap(),
        std::fs::canonicalize(crate::cli::bin()).unwrap()
    );
    let empty = tempfile::tempdir().unwrap();
    let out = crate::cli::vfio_p2p()
        .args(["hook", "install", "--prefix"])
        .arg(empty.path())
        .args(["--qemu-wrapper", "/usr/local/bin/qemu"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        std::fs::read_dir(empty.path()).unwrap().count(),
        0,
        "nothing installed"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("must be named qemu-system-*"));
}

/// Issue 28: a vfio-pci device whose host address cannot be told (neither `host=` nor a
/// `sysfsdev=` ending in one) gets no clique and a warning, not silence; the argv passes
/// unchanged.
#[test]
fn a_device_without_a_host_address_is_named() {
    let args = [
        "-device",
        "vfio-pci,sysfsdev=/sys/bus/mdev/devices/83b8f4f2-509f-382f-3c1e-e6bfe0fa1001,id=m0",
        "-device",
        "vfio-pci,host=0000:06:00.0,id=hostdev1",
    ];
    let (code, argv, log) = wrap(&["--example", "dual-socket-pcie"], &[], &args);
    assert_eq!(code, 0, "{log}");
    assert!(
        argv.starts_with(&format!("{} {}", args[0], args[1])),
        "{argv}"
    );
    assert!(
        log.contains("warning: qemu-wrap: -device vfio-pci,sysfsdev=/sys/bus/mdev/devices/83b8f4f2-509f-382f-3c1e-e6bfe0fa1001,id=m0: left without a clique"),
        "{log}"
    );
}
