//! `gen cloud-hypervisor` against a Cloud Hypervisor built from its source
//! (tests/fixtures/cloud-hypervisor, recorded by its `record` script): CH parsed and
//! validated today's arguments, created the VM on KVM and stopped only at the VFIO device
//! (no GPU on the recording machine). Then the lab's stage ch (tests/fixtures/cloud-hypervisor/
//! boot, recorded by its `record` script): CH booted level B from gen's arguments with the
//! lab's VFIO stand-ins, and the agent there found the planned cliques at CH's 0xd4.

use crate::recording;

fn fixture(name: &str) -> String {
    recording::fixture("cloud-hypervisor", name)
}

fn block(cmd: &str) -> String {
    recording::block("cloud-hypervisor", cmd)
}

/// The boot options vm.yaml's `kernel:`, `initramfs:` and `cmdline:` give CH.
const BOOT_OPTIONS: [&str; 3] = ["--kernel", "--initramfs", "--cmdline"];

/// `argv` without its boot options, and those options with their values: the recordings
/// gave CH their own kernel (gen refuses a VM that boots nothing since they were made).
fn split_boot(argv: &[String]) -> (Vec<String>, Vec<[String; 2]>) {
    let (mut rest, mut boot) = (Vec::new(), Vec::new());
    let mut args = argv.iter();
    while let Some(a) = args.next() {
        match args.clone().next() {
            Some(value) if BOOT_OPTIONS.contains(&a.as_str()) => {
                boot.push([a.clone(), value.clone()]);
                args.next();
            }
            _ => rest.push(a.clone()),
        }
    }
    (rest, boot)
}

#[test]
fn todays_argv_is_the_one_cloud_hypervisor_took() {
    // the recording ran without a console of ours (it passed --serial off --console off)
    // and with its own (empty) kernel, `--kernel EMPTY` below
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("vm.yaml");
    std::fs::write(&config, "name: vm0\nconsole: none\nkernel: /EMPTY\n").unwrap();
    let out = crate::cli::vfio_p2p()
        .args(["--example", "dual-socket-pcie", "gen", "cloud-hypervisor"])
        .args(["--gpus", "05:00.0,06:00.0,09:00.0", "--format", "argv"])
        .arg("--config")
        .arg(&config)
        .output()
        .unwrap();
    assert!(out.status.success());
    let lines: Vec<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(String::from)
        .collect();
    let (rest, boot) = split_boot(&lines);
    assert_eq!(boot, [["--kernel".to_string(), "/EMPTY".into()]]);
    let argv = rest.iter().map(|a| format!("{a}\n")).collect::<String>();
    assert_eq!(
        argv,
        fixture("argv.txt"),
        "gen cloud-hypervisor changed since CH took it: record again"
    );
    assert_eq!(argv.matches("x_nv_gpudirect_clique=0").count(), 3);
    assert!(fixture("transcript.txt").starts_with("# cloud-hypervisor v"));
    // past the parser and the validation, the VM created: it stops at the absent VFIO device
    let run = block("cloud-hypervisor <argv.txt> --kernel EMPTY --serial off --console off \n");
    assert!(
        run.contains("Cannot create a VFIO device") && !run.contains("Error parsing config"),
        "{run}"
    );
}

#[test]
fn cloud_hypervisor_knows_the_option_and_ties_it_to_p2p_dma() {
    // a misspelt option is refused by the parser: the real one was parsed as the clique
    let misspelt = block("cloud-hypervisor <argv.txt, x_nv_gpudirect_clique spelt");
    assert!(
        misspelt.contains("Unknown option: x_nv_gpudirect_cliqe"),
        "{misspelt}"
    );
    let off = block("cloud-hypervisor <argv.txt> --kernel EMPTY --serial off --console off --platform vfio_p2p_dma=off");
    assert!(
        off.contains("Device with x_nv_gpudirect_clique requires vfio_p2p_dma=on"),
        "{off}"
    );
    // CH does not range-check the clique (a u8 shifted into the capability): 16 gets as far
    // as 0, so the 0..=15 bound is ours to keep (pci_config::clique::MAX_CLIQUE)
    let sixteen = block("cloud-hypervisor <argv.txt, gpu0's clique 16>");
    assert!(sixteen.contains("Cannot create a VFIO device"), "{sixteen}");
    assert_eq!(pci_config::clique::MAX_CLIQUE, 15);
}

/// The GPUs, options and host of the lab's stage ch (level A's sysfs, as our tool saw it).
const BOOT_GPUS: &str = "0000:13:00.0,0000:14:00.0,0000:81:00.0";

fn boot(name: &str) -> String {
    fixture(&format!("boot/{name}"))
}

fn boot_json(name: &str) -> serde_json::Value {
    serde_json::from_str(&boot(name)).unwrap_or_else(|e| panic!("boot/{name}: {e}"))
}

fn boot_path(name: &str) -> String {
    format!(
        "{}/../tests/fixtures/cloud-hypervisor/boot/{name}",
        env!("CARGO_MANIFEST_DIR")
    )
}

/// The lab's vm.yaml of stage ch with the kernel, initramfs and command line its recording
/// gave CH on the command line (argv-run.txt), now vm.yaml's boot keys.
fn with_lab_boot(yaml: &str) -> String {
    if yaml.contains("kernel:") {
        return yaml.to_string(); // recorded since gen takes them from vm.yaml
    }
    let ran: Vec<String> = boot("argv-run.txt").lines().map(String::from).collect();
    let (_, lab_boot) = split_boot(&ran);
    let keys: String = lab_boot
        .iter()
        .map(|[flag, value]| format!("{}: \"{value}\"\n", flag.trim_start_matches('-')))
        .collect();
    format!("{yaml}{keys}")
}

#[test]
fn todays_argv_is_the_one_cloud_hypervisor_booted() {
    let (today, _) = gen_expecting(&with_lab_boot(&boot("vm.yaml")));
    let recorded: Vec<String> = serde_json::from_value(boot_json("gen.json")).unwrap();
    let (recorded, _) = split_boot(&recorded);
    let ran = boot("argv-run.txt");
    let ran: Vec<&str> = ran.lines().collect();
    // gen's boot options are the ones the lab gave CH, the rest as CH booted it
    let (today, today_boot) = split_boot(&today);
    let ran_owned: Vec<String> = ran.iter().map(|a| a.to_string()).collect();
    assert_eq!(today_boot, split_boot(&ran_owned).1);
    assert_eq!(today_boot.len(), 3);
    assert_eq!(
        today, recorded,
        "gen cloud-hypervisor changed since CH booted it: run the lab's stage ch and record again"
    );
    // CH ran gen's arguments as they are (its own path for the program), then only the lab's
    assert!(ran[0].ends_with("/cloud-hypervisor"), "{}", ran[0]);
    assert_eq!(ran[1..today.len()], today[1..]);
    let lab: Vec<&str> = ran[today.len()..]
        .iter()
        .copied()
        .filter(|a| a.starts_with("--"))
        .collect();
    let lab_options = [
        "--kernel",
        "--initramfs",
        "--cmdline",
        "--serial",
        "--console",
    ];
    let reporting = ["--api-socket", "--vsock"];
    assert!(
        lab.iter()
            .all(|a| lab_options.contains(a) || reporting.contains(a)),
        "{lab:?}"
    );
    assert_eq!(
        today
            .iter()
            .filter(|a| a.contains("x_nv_gpudirect_clique=0"))
            .count(),
        2
    );
    assert!(boot("version.txt").starts_with("cloud-hypervisor v54."));
}

#[test]
fn the_agent_under_cloud_hypervisor_found_the_planned_cliques_at_0xd4() {
    let plan = boot_json("plan.json");
    let scan = boot_json("scan.json");
    // where CH put each GPU (its own report), and what the agent read there
    let placed = cloud_hypervisors_addresses();
    for (host, guest) in &placed {
        recording::assert_scan_found(&scan, host, guest, &plan["assignments"][host], "0xd4");
    }
    let checked = placed.len();
    assert_eq!(checked, 3);
    // expect passed on the expectation made from CH's addresses and failed on the wrong one
    recording::assert_agent_verdicts("cloud-hypervisor/boot");
}

/// `gen cloud-hypervisor --expect-out` on the booted host, for `yaml` (`vm.yaml` as the lab
/// wrote it, or another): gen's arguments and each GPU's expected guest address by host.
fn gen_expecting(yaml: &str) -> (Vec<String>, Vec<(String, String)>) {
    let dir = tempfile::tempdir().unwrap();
    let (config, expect) = (dir.path().join("vm.yaml"), dir.path().join("expect.json"));
    std::fs::write(&config, yaml).unwrap();
    let out = crate::cli::vfio_p2p()
        .args([
            "--sysfs-root",
            &boot_path("snapshot"),
            "gen",
            "cloud-hypervisor",
        ])
        .args([
            "--gpus",
            BOOT_GPUS,
            "--allow-untranslated-p2p",
            "--format",
            "json",
        ])
        .arg("--config")
        .arg(&config)
        .arg("--expect-out")
        .arg(&expect)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let argv: Vec<String> = serde_json::from_slice(&out.stdout).unwrap();
    let e: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&expect).unwrap()).unwrap();
    let gpus = e["gpus"].as_array().unwrap().iter();
    let by_host = gpus
        .map(|g| {
            (
                g["host_bdf"].as_str().unwrap().into(),
                g["guest_bdf"].as_str().unwrap().into(),
            )
        })
        .collect();
    (argv, by_host)
}

/// Where CH put each GPU it booted (vm.info's device tree, by gen's `id=gpuN`), by host.
fn cloud_hypervisors_addresses() -> Vec<(String, String)> {
    let info = boot_json("vm-info.json");
    let gen: Vec<String> = serde_json::from_value(boot_json("gen.json")).unwrap();
    gen.iter()
        .filter(|a| a.starts_with("path="))
        .map(|d| {
            let host = d.split('/').nth(5).unwrap();
            let id = d.split(",id=").nth(1).unwrap().split(',').next().unwrap();
            let guest = info["device_tree"][id]["pci_bdf"].as_str().unwrap();
            (host.to_string(), guest.to_string())
        })
        .collect()
}

/// The options of a CH command line that make a PCI device ahead of the VFIO devices
/// (decide::cloud_hypervisor: virtio devices; `--console off` takes CH's console away).
fn pci_makers(argv: &[String]) -> Vec<String> {
    let makers = [
        "--disk",
        "--net",
        "--rng",
        "--fs",
        "--pmem",
        "--vsock",
        "--balloon",
        "--watchdog",
        "--vdpa",
    ];
    let mut out = Vec::new();
    for (i, a) in argv.iter().enumerate() {
        if makers.contains(&a.as_str())
            || (a == "--console" && argv.get(i + 1).is_some_and(|v| v == "off"))
        {
            out.push(if a == "--console" {
                "--console off".into()
            } else {
                a.clone()
            });
        }
    }
    out.sort();
    out
}

/// gen's expectation names the guest addresses CH v54 gave the GPUs it booted (vm.info),
/// for gen's own arguments and for the lab's additions: CH numbers its root bus as it
/// creates devices, virtio devices (console, disks, NICs, rng, …, vsock) first, then the
/// `--device`s in order.
#[test]
fn gen_expects_the_guest_addresses_cloud_hypervisor_gave() {
    let ch = cloud_hypervisors_addresses();
    assert_eq!(
        ch.iter().map(|(_, g)| g.as_str()).collect::<Vec<_>>(),
        ["0000:00:03.0", "0000:00:04.0", "0000:00:05.0"]
    );
    // what CH made ahead of them: its entropy device, then the lab's vsock (--console off)
    let info = boot_json("vm-info.json");
    let tree = &info["device_tree"];
    assert_eq!(tree["_virtio-pci-__rng"]["pci_bdf"], "0000:00:01.0");
    assert_eq!(tree["_virtio-pci-_vsock0"]["pci_bdf"], "0000:00:02.0");
    let ran: Vec<String> = boot("argv-run.txt").lines().map(String::from).collect();
    assert_eq!(pci_makers(&ran), ["--console off", "--vsock"]);
    // the lab's vm.yaml (console: none): gen writes no console, so CH's own (--console tty)
    // takes 00:01.0, its rng 00:02.0; the lab traded that console for its vsock
    let (argv, expected) = gen_expecting(&with_lab_boot(&boot("vm.yaml")));
    assert_eq!(pci_makers(&argv), Vec::<String>::new());
    assert_eq!(expected, ch, "gen's expectation for its own arguments");
    // the lab's devices from vm.yaml (a serial console: gen writes --console off; verify:
    // vsock: gen writes the vsock): gen's arguments make what the lab's did
    let lab = format!(
        "{}console: serial\nverify: vsock\nvsock_cid: 3\n",
        with_lab_boot(&boot("vm.yaml")).replace("console: none\n", "")
    );
    let (argv, expected) = gen_expecting(&lab);
    assert_eq!(pci_makers(&argv), pci_makers(&ran));
    assert_eq!(expected, ch, "gen's expectation for the lab's devices");
}
