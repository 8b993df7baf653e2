//! `gen` and vm.yaml's disks, network and console: a missing image on this host, what each
//! VMM cannot take, and the warnings for what an emitter leaves to its stack.

fn gen(dir: &std::path::Path, yaml: &str, args: &[&str]) -> (bool, String, String) {
    let config = dir.join("vm.yaml");
    std::fs::write(&config, yaml).unwrap();
    let out = crate::cli::vfio_p2p()
        .env("COLUMNS", "400")
        .args(args)
        .arg("--config")
        .arg(&config)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_missing_disk_is_an_error_here_and_a_warning_for_another_machine() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = "name: a\ndisks:\n  - path: /nonexistent/a.qcow2\n";
    // this host (sysfs root /): refused before anything is read, naming the line and the fix
    let (ok, _, err) = gen(dir.path(), yaml, &["gen", "qemu"]);
    assert!(!ok, "{err}");
    assert!(
        err.contains("vm.yaml:3:11: disks: /nonexistent/a.qcow2 does not exist: create it (`qemu-img create -f qcow2 /nonexistent/a.qcow2 64G`)"),
        "{err}"
    );
    // an example host: the VM is for another machine
    let (ok, out, err) = gen(dir.path(), yaml, &["--example", "flat-vm", "gen", "qemu"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("file=/nonexistent/a.qcow2,format=qcow2"),
        "{out}"
    );
    assert!(
        err.starts_with("warning: ")
            && err.contains("it must exist on the machine that runs the VM"),
        "{err}"
    );
    // a directory is no disk either
    let d = dir.path().display().to_string();
    let (ok, _, err) = gen(
        dir.path(),
        &format!("name: a\ndisks:\n  - path: {d}\n    format: raw\n"),
        &["gen", "libvirt"],
    );
    assert!(!ok && err.contains("is a directory"), "{err}");
    // an image that is there: no word about it
    let img = dir.path().join("a.raw");
    std::fs::write(&img, [0u8; 512]).unwrap();
    let (ok, out, err) = gen(
        dir.path(),
        &format!("name: a\ndisks:\n  - path: {}\n", img.display()),
        &["--example", "flat-vm", "gen", "qemu"],
    );
    assert!(ok && !err.contains("disks"), "{err}");
    assert!(out.contains("format=raw"), "{out}");
}

#[test]
fn a_whole_vm_without_disks_is_warned_of() {
    let dir = tempfile::tempdir().unwrap();
    for target in ["qemu", "libvirt", "cloud-hypervisor"] {
        // a kernel without an initramfs has no root without a disk: still warned of
        let yaml = match target {
            "cloud-hypervisor" => "name: a\nkernel: /boot/vmlinuz\n",
            _ => "name: a\n",
        };
        let (ok, _, err) = gen(dir.path(), yaml, &["--example", "flat-vm", "gen", target]);
        assert!(ok, "{err}");
        assert!(
            err.contains("warning: a has no disks: the VM has nothing to boot from"),
            "{target}: {err}"
        );
    }
    // with its initramfs it boots (the lab's Cloud Hypervisor guest does): nothing said
    let yaml = "name: a\nkernel: /boot/vmlinuz\ninitramfs: /boot/initrd.img\n";
    let (ok, _, err) = gen(
        dir.path(),
        yaml,
        &["--example", "flat-vm", "gen", "cloud-hypervisor"],
    );
    assert!(ok && !err.contains("has no disks"), "{err}");
    // proxmox lines and incus profiles are merged into a VM that has its disks
    let (ok, _, err) = gen(
        dir.path(),
        "name: a\n",
        &["--example", "flat-vm", "gen", "proxmox"],
    );
    assert!(ok && !err.contains("no disks"), "{err}");
}

#[test]
fn cloud_hypervisor_refuses_what_it_cannot_do_and_says_what_it_leaves() {
    let dir = tempfile::tempdir().unwrap();
    let expect = dir.path().join("expect.json");
    let expect_arg = expect.to_str().unwrap();
    let ch = [
        "--example",
        "flat-vm",
        "gen",
        "cloud-hypervisor",
        "--format",
        "argv",
        "--expect-out",
        expect_arg,
    ];
    // each refusal names vm.yaml's line (decide::cloud_hypervisor::refusal) and writes nothing
    let refusals = [
        (
            "name: a\ndisks:\n  - path: /i/a.raw\n    bus: sata\nkernel: /boot/vmlinuz\n",
            "vm.yaml:3:11: Cloud Hypervisor has only virtio disks: /i/a.raw has `bus: sata`; use `bus: virtio`",
        ),
        (
            "name: a\nnetwork: {mode: user}\nkernel: /boot/vmlinuz\n",
            "vm.yaml:2:10: Cloud Hypervisor has no user-mode networking: use `network: {bridge: br0}`",
        ),
        (
            "name: a\ndisks:\n  - path: /i/a,b.raw\nkernel: /boot/vmlinuz\n",
            "vm.yaml:3:11: Cloud Hypervisor cannot take a path with a comma in its options: /i/a,b.raw; rename the file",
        ),
        (
            "name: a\nconsole: socket\nconsole_socket: /run/a,b.sock\nkernel: /boot/vmlinuz\n",
            "vm.yaml:3:17: Cloud Hypervisor cannot take a path with a comma in its options: /run/a,b.sock",
        ),
    ];
    for (yaml, want) in refusals {
        let (ok, _, err) = gen(dir.path(), yaml, &ch);
        assert!(!ok && err.contains(want), "{want:?} in {err}");
        assert!(
            !expect.exists(),
            "{yaml}: refused, yet the expectation was written"
        );
    }
    let (ok, out, err) = gen(
        dir.path(),
        "name: train-01\ndisks:\n  - path: /i/a.raw\n    readonly: true\nnetwork:\n  bridge: br0\n  mac: 52:54:00:00:00:01\nconsole: socket\nkernel: /boot/vmlinuz\n",
        &ch,
    );
    assert!(ok, "{err}");
    for want in [
        "--disk\npath=/i/a.raw,readonly=on\n",
        "--net\ntap=tap-train-01,mac=52:54:00:00:00:01\n",
        "--serial\nsocket=/run/vfio-p2p/console/train-01.sock\n--console\noff\n",
    ] {
        assert!(out.contains(want), "{want:?} in {out}");
    }
    assert!(
        err.contains("`ip link set tap-train-01 master br0 up`"),
        "{err}"
    );
}

#[test]
fn proxmox_and_incus_write_what_their_stacks_take() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = "name: a\ndisks:\n  - path: /i/a.qcow2\n  - path: /dev/sdb\n    bus: sata\n    readonly: false\nnetwork:\n  bridge: vmbr0\n  mac: 52:54:00:ab:00:01\n";
    let (ok, out, err) = gen(
        dir.path(),
        yaml,
        &["--example", "flat-vm", "gen", "proxmox"],
    );
    assert!(ok, "{err}");
    for want in [
        "virtio0: /i/a.qcow2,format=qcow2\n",
        "sata0: /dev/sdb,format=raw\n",
        "boot: order=virtio0\n",
        "net0: model=virtio,bridge=vmbr0,macaddr=52:54:00:AB:00:01\n",
        "serial0: socket\n",
    ] {
        assert!(out.contains(want), "{want:?} in {out}");
    }
    let server = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fixtures/incus/server.json"
    );
    let incus = [
        "--example",
        "flat-vm",
        "gen",
        "incus",
        "--incus-server",
        server,
    ];
    let (ok, out, err) = gen(dir.path(), yaml, &incus);
    assert!(ok, "{err}");
    assert!(
        out.contains("  eth0:\n    type: \"nic\"\n    nictype: \"bridged\"\n    parent: \"vmbr0\"\n    hwaddr: \"52:54:00:ab:00:01\"\n"),
        "{out}"
    );
    assert!(err.contains("warning: gen incus writes no disks"), "{err}");
    let (ok, _, err) = gen(dir.path(), "name: a\nnetwork: {mode: user}\n", &incus);
    assert!(
        ok && err.contains("Incus has no user-mode networking"),
        "{err}"
    );
}

/// gen's warnings wrap to the width like the rest of the output (`$COLUMNS` here; the
/// terminal's when stderr is one), each a `warning: ` line with indented continuations.
#[test]
fn warnings_wrap_to_the_width() {
    for width in [80usize, 120] {
        let out = crate::cli::vfio_p2p()
            .env("COLUMNS", width.to_string())
            .args(["--example", "flat-vm", "gen", "qemu"])
            .output()
            .unwrap();
        assert!(out.status.success());
        let err = String::from_utf8(out.stderr).unwrap();
        assert!(err.starts_with("warning: vm0 has no disks"), "{err}");
        assert!(err.lines().count() > 1, "{err}");
        for line in err.lines() {
            assert!(line.chars().count() <= width, "{width}: {line:?}");
            assert!(
                line.starts_with("warning: ") || line.starts_with("  "),
                "{line:?}"
            );
        }
    }
}

/// Cloud Hypervisor numbers the `--device`s in the order given, so gen passes them in the
/// order of the guest addresses it expects (decide::cloud_hypervisor): the GPU and its audio
/// function, then a NIC whose host address is lower.
#[test]
fn cloud_hypervisor_passes_devices_in_the_order_of_their_guest_addresses() {
    let dir = tempfile::tempdir().unwrap();
    let expect = dir.path().join("expect.json");
    let (ok, out, err) = gen(
        dir.path(),
        "name: a\nkernel: /boot/vmlinuz\n",
        &[
            "--example",
            "dual-socket-pcie",
            "gen",
            "cloud-hypervisor",
            "--gpus",
            "85:00.0",
            "--nics",
            "0b:00.0",
            "--format",
            "argv",
            "--expect-out",
            expect.to_str().unwrap(),
        ],
    );
    assert!(ok, "{err}");
    let devices: Vec<&str> = out
        .lines()
        .filter_map(|l| l.strip_prefix("path=/sys/bus/pci/devices/"))
        .map(|l| &l[..12])
        .collect();
    assert_eq!(devices, ["0000:85:00.0", "0000:85:00.1", "0000:0b:00.0"]);
    // the rng at 00:01.0 (`--console off`: no console of CH's), the GPU next
    let e = std::fs::read_to_string(&expect).unwrap();
    assert!(e.contains("\"guest_bdf\":\"0000:00:02.0\""), "{e}");
}

/// Proxmox's refusal (decide::proxmox::refusal) names vm.yaml's line and writes nothing.
#[test]
fn proxmox_refuses_a_disk_path_qemu_server_would_split_at_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = "name: a\ndisks:\n  - path: /i/a=b.raw\n";
    let args = ["--example", "flat-vm", "gen", "proxmox"];
    let (ok, out, err) = gen(dir.path(), yaml, &args);
    assert!(!ok && out.is_empty(), "{out}{err}");
    assert!(
        err.contains("vm.yaml:3:11: Proxmox cannot take a disk path with ',' or '=': /i/a=b.raw; rename the file"),
        "{err}"
    );
    let (ok, out, err) = gen(dir.path(), "name: a\ndisks:\n  - path: /i/a.raw\n", &args);
    assert!(
        ok && out.contains("virtio0: /i/a.raw,format=raw"),
        "{out}{err}"
    );
}
