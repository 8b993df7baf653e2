//! vm.yaml's disks, NIC and serial console as libvirt's schema and argv generator and QEMU
//! itself take them: the same pcie.0 slots from `gen qemu` and from libvirt, the disk images
//! opened (read-only where asked), the first one booting. CI installs the tools (see
//! real_tools.rs); a missing one fails unless VFIO_P2P_SKIP_REAL_TOOLS=1.

use std::path::Path;

use crate::installed_tools::{
    domxml_to_native, have, on_this_machines_nodes, qemu_fed, validate, vfio_p2p,
};

/// A vm.yaml in `dir` with three raw disk images there (the boot disk, one on SATA, one
/// read-only) plus `extra` lines.
fn config(dir: &Path, extra: &str) -> String {
    let (a, b, c) = (
        dir.join("boot.raw"),
        dir.join("data.img"),
        dir.join("ro.raw"),
    );
    for f in [&a, &b, &c] {
        std::fs::write(f, vec![0u8; 1 << 20]).unwrap();
    }
    let yaml = format!(
        "name: io\ndisks:\n  - path: {}\n  - path: {}\n    bus: sata\n  - path: {}\n    readonly: true\n{extra}",
        a.display(),
        b.display(),
        c.display()
    );
    let path = dir.join("vm.yaml");
    std::fs::write(&path, yaml).unwrap();
    path.display().to_string()
}

/// Every `-device` JSON object of an argv as libvirt prints it (one line, quoted words).
fn devices(argv: &str) -> Vec<serde_json::Value> {
    argv.split_whitespace()
        .filter_map(|w| serde_json::from_str(w.trim_matches('\'')).ok())
        .filter(|v: &serde_json::Value| v.is_object())
        .collect()
}

fn by_driver<'a>(devs: &'a [serde_json::Value], driver: &str) -> Vec<&'a serde_json::Value> {
    devs.iter().filter(|d| d["driver"] == driver).collect()
}

#[test]
fn libvirt_takes_them_at_the_slots_gen_qemu_gives() {
    if !have("virt-xml-validate") || !have("virsh") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // the bridged NIC and a block device only against the schema: libvirt's argv generator
    // opens /dev/net/tun
    let cfg = config(dir.path(), "network:\n  bridge: br0\n");
    let yaml = std::fs::read_to_string(&cfg).unwrap();
    let yaml = yaml.replace("disks:\n", "disks:\n  - path: /dev/vdz\n");
    std::fs::write(&cfg, yaml).unwrap();
    let xml = vfio_p2p(
        &[
            "--example",
            "flat-vm",
            "gen",
            "libvirt",
            "--config",
            &cfg,
            "--libvirt-version",
            "9.0",
        ],
        None,
    );
    let file = dir.path().join("bridged.xml");
    std::fs::write(&file, &xml).unwrap();
    validate(&file);
    assert!(
        xml.contains("<interface type='bridge'>\n      <source bridge='br0'/>"),
        "{xml}"
    );
    assert!(
        xml.contains("<disk type='block' device='disk'>\n      <driver name='qemu' type='raw'/>\n      <source dev='/dev/vdz'/>"),
        "{xml}"
    );
    let image = format!(
        "<disk type='file' device='disk'>\n      <driver name='qemu' type='raw'/>\n      <source file='{}/boot.raw'/>",
        dir.path().display()
    );
    assert!(xml.contains(&image), "{xml}");
    for (network, console) in [
        (
            "network:\n  mode: user\n  mac: 52:54:00:12:34:56\n",
            "console: serial\n",
        ),
        ("network:\n  mode: user\n", "console: socket\n"),
    ] {
        let cfg = config(dir.path(), &format!("{network}{console}"));
        let gen = |target: &str, more: &[&str]| {
            let mut args = vec!["--example", "flat-vm", "gen", target, "--config", &cfg];
            args.extend_from_slice(more);
            vfio_p2p(&args, None)
        };
        let xml = gen("libvirt", &["--libvirt-version", "9.0"]);
        let file = dir.path().join("domain.xml");
        std::fs::write(&file, &xml).unwrap();
        validate(&file);
        // libvirt's argv generator opens /dev/net/tun for any NIC, which the unprivileged
        // session cannot: the NIC's place is read from the XML, the rest from libvirt's argv
        let (start, end) = (
            xml.find("    <interface").unwrap(),
            xml.find("</interface>\n").unwrap() + "</interface>\n".len(),
        );
        let nic = &xml[start..end];
        assert!(
            nic.contains("<model type='virtio'/>")
                && nic.contains("bus='0x00' slot='0x02' function='0x0'"),
            "{nic}"
        );
        let without_nic = format!("{}{}", &xml[..start], &xml[end..]);
        let argv = domxml_to_native(&on_this_machines_nodes(&without_nic));
        let ours: Vec<serde_json::Value> =
            serde_json::from_str::<Vec<String>>(&gen("qemu", &["--format", "json"]))
                .unwrap()
                .iter()
                .filter_map(|a| serde_json::from_str(a).ok())
                .collect();
        let theirs = devices(&argv);
        for (driver, addrs, sources) in [
            ("virtio-blk-pci", &["0x3", "0x4"][..], &[&ours, &theirs][..]),
            ("virtio-net-pci", &["0x2"][..], &[&ours][..]),
        ] {
            for devs in sources {
                let d = by_driver(devs, driver);
                let got: Vec<&serde_json::Value> = d.iter().map(|d| &d["addr"]).collect();
                assert_eq!(got, addrs, "{driver} in {devs:?}");
                assert!(d.iter().all(|d| d["bus"] == "pcie.0"), "{driver}: {argv}");
            }
        }
        // the first disk boots, the second is on the AHCI controller, read-only
        assert_eq!(by_driver(&theirs, "virtio-blk-pci")[0]["bootindex"], 1);
        assert_eq!(by_driver(&ours, "virtio-blk-pci")[0]["bootindex"], 1);
        assert_eq!(by_driver(&theirs, "ide-hd").len(), 1, "{argv}");
        assert!(argv.contains("\"read-only\":true"), "{argv}");
        assert!(
            argv.contains("boot.raw") && argv.contains("data.img"),
            "{argv}"
        );
        if console.contains("socket") {
            assert!(argv.contains("/run/vfio-p2p/console/io.sock"), "{argv}");
        } else {
            assert!(argv.contains("-chardev pty"), "{argv}");
            assert!(nic.contains("<mac address='52:54:00:12:34:56'/>"), "{nic}");
        }
        assert!(argv.contains("isa-serial"), "{argv}");
    }
}

/// `gen qemu`'s arguments without the GPUs (none here) under TCG, the machine built and
/// stopped before it runs (`-S`); QMP on stdin.
fn qemu_with(argv: &[String], qmp: &str) -> (bool, String, String) {
    let mut args: Vec<String> = Vec::new();
    for pair in argv[1..].chunks(2) {
        let (k, v) = (&pair[0], &pair[1]);
        if k == "-device" && v.contains("\"vfio-pci\"") {
            continue;
        }
        args.push(k.clone());
        args.push(match k.as_str() {
            "-machine" => "q35,accel=tcg".into(),
            "-cpu" => "max,phys-bits=46".into(),
            "-object" => on_this_machines_nodes(v),
            _ => v.clone(),
        });
    }
    let out = qemu_fed(120, &["-S", "-qmp", "stdio"], &args, qmp.as_bytes());
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn qemu_opens_the_disks_and_puts_them_where_gen_says() {
    if !have("qemu-system-x86_64") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("console.sock");
    let cfg = config(
        dir.path(),
        &format!(
            "network:\n  mode: user\nconsole: socket\nconsole_socket: {}\n",
            socket.display()
        ),
    );
    let argv: Vec<String> = serde_json::from_str(&vfio_p2p(
        &[
            "--example",
            "flat-vm",
            "gen",
            "qemu",
            "--config",
            &cfg,
            "--format",
            "json",
        ],
        None,
    ))
    .unwrap();
    let (ok, stdout, stderr) = qemu_with(
        &argv,
        concat!(
            "{\"execute\":\"qmp_capabilities\"}\n",
            "{\"execute\":\"query-block\"}\n",
            "{\"execute\":\"query-pci\"}\n",
            "{\"execute\":\"query-chardev\"}\n",
            "{\"execute\":\"quit\"}\n"
        ),
    );
    assert!(ok, "qemu refused the machine: {stderr}");
    let replies: Vec<serde_json::Value> = stdout
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .filter(|v: &serde_json::Value| v.get("return").is_some())
        .collect();
    let block = replies
        .iter()
        .find_map(|r| {
            r["return"]
                .as_array()
                .filter(|a| a.iter().any(|b| b.get("device").is_some()))
        })
        .unwrap_or_else(|| panic!("no query-block reply: {stdout}"));
    let files: Vec<(String, bool)> = block
        .iter()
        .filter_map(|b| {
            let i = b.get("inserted")?;
            Some((i["file"].as_str()?.to_string(), i["ro"].as_bool()?))
        })
        .collect();
    assert_eq!(files.len(), 3, "{files:?}");
    assert!(files[0].0.ends_with("boot.raw") && !files[0].1, "{files:?}");
    assert!(files[1].0.ends_with("data.img") && !files[1].1, "{files:?}");
    assert!(files[2].0.ends_with("ro.raw") && files[2].1, "{files:?}");
    // pcie.0: slot 2 the virtio-net NIC (1af4:1000), slot 3 the virtio-blk disk (1af4:1001)
    let pci = stdout
        .lines()
        .find(|l| l.contains("\"devices\""))
        .unwrap_or_else(|| panic!("no query-pci reply: {stdout}"));
    let v: serde_json::Value = serde_json::from_str(pci).unwrap();
    let root = v["return"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["bus"] == 0)
        .unwrap();
    let on_root: Vec<(u64, u64)> = root["devices"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["bus"] == 0 && d["id"]["vendor"] == 0x1af4)
        .map(|d| {
            (
                d["slot"].as_u64().unwrap(),
                d["id"]["device"].as_u64().unwrap(),
            )
        })
        .collect();
    assert!(on_root.contains(&(2, 0x1000)), "{on_root:?} {pci}");
    assert!(on_root.contains(&(3, 0x1001)), "{on_root:?}");
    assert!(on_root.contains(&(4, 0x1001)), "{on_root:?}");
    // the console: a listening socket (QEMU removes it when it quits)
    let chardev = format!(
        "\"disconnected:unix:{},server=on\", \"label\": \"console0\"",
        socket.display()
    );
    assert!(stdout.contains(&chardev), "no {chardev} in {stdout}");
}

/// The default console: the guest's ttyS0 on QEMU's stdio, the monitor behind Ctrl-a c.
#[test]
fn the_default_console_is_the_terminal_with_the_monitor_behind_it() {
    if !have("qemu-system-x86_64") {
        return;
    }
    let argv: Vec<String> = serde_json::from_str(&vfio_p2p(
        &["--example", "flat-vm", "gen", "qemu", "--format", "json"],
        None,
    ))
    .unwrap();
    let serial = argv.iter().position(|a| a == "-serial").unwrap();
    assert_eq!(argv[serial + 1], "mon:stdio");
    let argv: Vec<String> = argv.into_iter().filter(|a| a != "-qmp").collect();
    let mut args: Vec<String> = Vec::new();
    for pair in argv[1..].chunks(2) {
        if pair[0] == "-device" && pair[1].contains("\"vfio-pci\"") {
            continue;
        }
        let v = match pair[0].as_str() {
            "-machine" => "q35,accel=tcg".to_string(),
            "-cpu" => "max,phys-bits=46".to_string(),
            "-object" => on_this_machines_nodes(&pair[1]),
            _ => pair[1].clone(),
        };
        args.extend([pair[0].clone(), v]);
    }
    // Ctrl-a c: to the monitor; then quit
    let out = qemu_fed(120, &["-S"], &args, b"\x01cquit\n");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("QEMU"),
        "no monitor banner"
    );
}
