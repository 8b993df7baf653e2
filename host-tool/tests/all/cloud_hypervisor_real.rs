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

#[test]
fn todays_argv_is_the_one_cloud_hypervisor_took() {
    // the recording ran without a console of ours (it passed --serial off --console off)
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("vm.yaml");
    std::fs::write(&config, "name: vm0\nconsole: none\n").unwrap();
    let out = crate::cli::vfio_p2p()
        .args(["--example", "dual-socket-pcie", "gen", "cloud-hypervisor"])
        .args(["--gpus", "05:00.0,06:00.0,09:00.0", "--format", "argv"])
        .arg("--config")
        .arg(&config)
        .output()
        .unwrap();
    assert!(out.status.success());
    let argv = String::from_utf8(out.stdout).unwrap();
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

#[test]
fn todays_argv_is_the_one_cloud_hypervisor_booted() {
    let out = crate::cli::vfio_p2p()
        .args([
            "--sysfs-root",
            &boot_path("snapshot"),
            "gen",
            "cloud-hypervisor",
        ])
        .args(["--config", &boot_path("vm.yaml"), "--gpus", BOOT_GPUS])
        .args(["--allow-untranslated-p2p", "--format", "json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let today: Vec<String> = serde_json::from_slice(&out.stdout).unwrap();
    let recorded: Vec<String> = serde_json::from_value(boot_json("gen.json")).unwrap();
    assert_eq!(
        today, recorded,
        "gen cloud-hypervisor changed since CH booted it: run the lab's stage ch and record again"
    );
    // CH ran gen's arguments as they are (its own path for the program), then only the lab's
    let ran = boot("argv-run.txt");
    let ran: Vec<&str> = ran.lines().collect();
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
    let info = boot_json("vm-info.json");
    let scan = boot_json("scan.json");
    let gen: Vec<String> = serde_json::from_value(boot_json("gen.json")).unwrap();
    let mut checked = 0;
    for d in gen.iter().filter(|a| a.starts_with("path=")) {
        // path=/sys/bus/pci/devices/HOST/,id=ID[,x_nv_gpudirect_clique=K]
        let host = d.split('/').nth(5).unwrap();
        let id = d.split(",id=").nth(1).unwrap().split(',').next().unwrap();
        let planned = &plan["assignments"][host];
        // where CH put it (its own report), and what the agent read there
        let guest = info["device_tree"][id]["pci_bdf"].as_str().unwrap();
        let seen = scan["gpus"]
            .as_array()
            .unwrap()
            .iter()
            .find(|g| g["bdf"] == guest)
            .unwrap_or_else(|| panic!("{guest} ({host}) not in the agent's scan"));
        assert_eq!(&seen["clique"], planned, "{host} at {guest}");
        let offset = if planned.is_null() {
            serde_json::Value::Null
        } else {
            "0xd4".into()
        };
        assert_eq!(seen["cap_offset"], offset, "{host} at {guest}");
        checked += 1;
    }
    assert_eq!(checked, 3);
    // expect passed on the expectation made from CH's addresses and failed on the wrong one
    let statuses = |name: &str| -> Vec<String> {
        let r = boot_json(name);
        r["gpus"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| g["status"].as_str().unwrap().to_string())
            .collect()
    };
    assert!(statuses("expect.json").iter().all(|s| s == "ok"));
    assert!(statuses("wrong.json").iter().all(|s| s != "ok"));
    let console = boot("console.txt");
    assert!(console.contains("LAB-B-EXPECT-END rc=0"), "{console}");
    assert!(console.contains("LAB-B-WRONG-END rc=1"), "{console}");
}
