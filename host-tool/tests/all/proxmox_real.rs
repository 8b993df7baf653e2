//! `gen proxmox` and `check --proxmox-conf` against what Proxmox VE's own code did with
//! them: qemu-server's hostpci parser and `-device` builder, pve-common's `split_args`, then
//! Debian sid's QEMU 11.1; and qemu-server's `cpu` parser and -cpu builder (tests/fixtures/proxmox,
//! recorded by its `record` script).

use crate::recording;

fn fixture(name: &str) -> String {
    recording::fixture("proxmox", name)
}

fn block(cmd: &str) -> String {
    recording::block("proxmox", cmd)
}

fn gen_proxmox() -> String {
    // recorded before vm.yaml had a console: the file without one
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("vm.yaml");
    std::fs::write(&config, "name: vm0\nconsole: none\n").unwrap();
    let out = crate::cli::vfio_p2p()
        .args(["--example", "dual-socket-pcie", "gen", "proxmox"])
        .args(["--gpus", "05:00.0,06:00.0,09:00.0"])
        .arg("--config")
        .arg(&config)
        .output()
        .unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap()
}

/// Failing check names and subjects of `check --proxmox-conf TEXT`.
fn check_fails(text: &str) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("100.conf");
    std::fs::write(&path, text).unwrap();
    let out = crate::cli::vfio_p2p()
        .args(["--example", "dual-socket-pcie", "check", "--format", "json"])
        .arg("--proxmox-conf")
        .arg(&path)
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["status"] == "fail")
        .map(|c| format!("{} {}", c["check"].as_str().unwrap(), c["subject"]))
        .collect()
}

#[test]
fn qemu_server_names_the_devices_our_args_set() {
    let conf = gen_proxmox();
    assert_eq!(
        conf,
        fixture("gen-proxmox.conf"),
        "gen proxmox changed: record again"
    );
    let argv = fixture("qemu-server-argv.txt");
    let args = conf.lines().find_map(|l| l.strip_prefix("args: ")).unwrap();
    let targets: Vec<&str> = args
        .split_whitespace()
        .filter_map(|w| {
            w.strip_prefix("device.")?
                .split_once(".x-nv-gpudirect-clique=")
        })
        .map(|(id, _)| id)
        .collect();
    assert_eq!(targets, ["hostpci0", "hostpci2", "hostpci4"]);
    for id in targets {
        assert!(
            argv.lines()
                .any(|l| l.starts_with("vfio-pci,") && l.contains(&format!(",id={id},"))),
            "qemu-server made no device {id}: {argv}"
        );
    }
    // QEMU took every -set and property; it stops only at the absent host device
    let run = block("qemu-server.pl gen-proxmox.conf");
    assert!(
        run.contains("no such host device") && !run.contains("there is no device"),
        "{run}"
    );
}

#[test]
fn qemu_checks_the_clique_that_reached_the_device() {
    let run = block("qemu-server.pl clique16.conf");
    let range = format!("valid range 0-{}", pci_config::clique::MAX_CLIQUE);
    assert!(
        run.contains("Property x-nv-gpudirect-clique") && run.contains(&range),
        "{run}"
    );
}

#[test]
fn a_slot_without_its_function_loses_the_clique_in_qemu_server_and_in_check() {
    let ids = block("qemu-server.pl whole-slot.conf   (hostpci0");
    assert!(
        ids.contains("id=hostpci0.0,") && ids.contains("id=hostpci0.1,"),
        "{ids}"
    );
    let run = block("qemu-server.pl whole-slot.conf | qemu-system-x86_64");
    assert!(
        run.contains("there is no device \"hostpci0\" defined"),
        "{run}"
    );
    // the same config, as the recording made it: check finds the GPU without its clique
    let whole: String = gen_proxmox()
        .lines()
        .filter(|l| !l.starts_with("hostpci1:"))
        .map(|l| l.replace("hostpci0: 0000:05:00.0,", "hostpci0: 0000:05:00,") + "\n")
        .collect();
    let fails = check_fails(&whole);
    assert!(
        fails.iter().any(|f| f == "clique-missing \"0000:05:00.0\""),
        "{fails:?}"
    );
}

#[test]
fn x_vga_hides_the_hypervisor_in_qemu_server_and_check_fails_it() {
    assert_eq!(block("qemu-server.pl x-vga.conf").trim(), "# kvm_off=1");
    let conf = gen_proxmox().replace(
        "hostpci0: 0000:05:00.0,pcie=1",
        "hostpci0: 0000:05:00.0,pcie=1,x-vga=1",
    );
    let fails = check_fails(&conf);
    assert!(
        fails.iter().any(|f| f.starts_with("hypervisor-visible")),
        "{fails:?}"
    );
    assert!(!check_fails(&gen_proxmox())
        .iter()
        .any(|f| f.starts_with("hypervisor-visible") || f.starts_with("clique")));
}

#[test]
fn qemu_server_gives_the_guest_the_hosts_width_from_our_cpu_line() {
    // qemu-server's own `cpu` parser and -cpu builder (CPUConfig::get_cpu_options)
    assert!(gen_proxmox().contains("\ncpu: host,phys-bits=host\n"));
    let cpu = block("cpu-options.pl gen-proxmox.conf");
    assert!(
        cpu.trim().starts_with("-cpu host,") && cpu.trim().ends_with(",host-phys-bits=true"),
        "{cpu}"
    );
    // the property is checked: a misspelt value is refused, so `host` was understood
    let typo = block("cpu-options.pl phys-bits-typo.conf");
    assert!(typo.contains("phys-bits: invalid format"), "{typo}");
}
