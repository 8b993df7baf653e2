//! `gen incus` and `check --incus-config` against what a real Incus (Debian sid's 7.0.2,
//! incusd in a private root) said of them: tests/fixtures/incus, recorded by its `record`
//! script. Today's generator must print what Incus accepted; Incus's own rewrite of the
//! profile must pass `check`, and fail it once the cliques are gone.

const GEN: &[&str] = &[
    "--example",
    "dual-socket-pcie",
    "gen",
    "incus",
    "--gpus",
    "05:00.0,06:00.0,09:00.0",
    "--nics",
    "0000:0b:00.0",
];

fn fixture(name: &str) -> String {
    format!(
        "{}/../tests/fixtures/incus/{name}",
        env!("CARGO_MANIFEST_DIR")
    )
}

fn read(name: &str) -> String {
    std::fs::read_to_string(fixture(name)).unwrap()
}

/// (exit code, stdout, stderr).
fn vfio_p2p(args: &[&str]) -> (i32, String, String) {
    let out = crate::cli::vfio_p2p().args(args).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

/// The transcript's block for the command line starting with `cmd`: its output and status.
fn transcript_block(cmd: &str) -> String {
    let t = read("transcript.txt");
    let start = t
        .find(&format!("$ {cmd}"))
        .unwrap_or_else(|| panic!("{cmd} not in the transcript"));
    let rest = &t[start..];
    let end = rest.find("\nrc=").unwrap() + "\nrc=0".len();
    rest[..end.min(rest.len())].to_string()
}

#[test]
fn todays_profile_is_the_one_incus_accepted() {
    let server = fixture("server.json");
    let (code, out, err) = vfio_p2p(&[GEN, &["--incus-server", &server]].concat());
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out,
        read("profile.yaml"),
        "gen incus changed since Incus accepted it: record again (tests/fixtures/incus/record)"
    );
    assert!(!err.contains("gpu_physical_clique"), "{err}");
    let edit = transcript_block("incus profile edit vfio-p2p-vm0 < profile.yaml");
    assert!(edit.ends_with("rc=0"), "{edit}");
}

#[test]
fn incus_refuses_a_wrong_key_and_a_clique_past_15() {
    let key = transcript_block("incus profile edit vfio-p2p-bad < wrong-key.yaml");
    assert!(
        key.contains("Invalid device option \"nvidia.cliqe\"") && key.ends_with("rc=1"),
        "{key}"
    );
    let value = transcript_block("incus profile edit vfio-p2p-bad < wrong-value.yaml");
    assert!(value.ends_with("rc=1"), "{value}");
    // Incus's range is the one our planner and check use (pci_config::clique::MAX_CLIQUE)
    let range = format!("Must be between 0 and {}", pci_config::clique::MAX_CLIQUE);
    assert!(
        value.contains("\"nvidia.clique\"") && value.contains(&range),
        "{value}"
    );
    let meta = read("metadata-nvidia-clique.json");
    assert!(
        meta.contains("\"nvidia.clique\"") && meta.contains("(VM only)"),
        "{meta}"
    );
    // and only on VMs: a container with the profile is refused
    let c0 = transcript_block("incus init --empty c0");
    assert!(
        c0.contains("Invalid device option \"nvidia.clique\"") && c0.ends_with("rc=1"),
        "{c0}"
    );
}

#[test]
fn a_server_without_the_extension_gets_raw_qemu_conf() {
    let dir = tempfile::tempdir().unwrap();
    let old = dir.path().join("old.json");
    let server: serde_json::Value = serde_json::from_str(&read("server.json")).unwrap();
    let mut server = server;
    let list = server["api_extensions"].as_array_mut().unwrap();
    let before = list.len();
    list.retain(|e| e != "gpu_physical_clique");
    assert_eq!(
        list.len(),
        before - 1,
        "the real server lists gpu_physical_clique"
    );
    std::fs::write(&old, server.to_string()).unwrap();
    let (code, out, err) = vfio_p2p(&[GEN, &["--incus-server", old.to_str().unwrap()]].concat());
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, read("profile-raw-qemu-conf.yaml"));
    assert!(
        err.contains("lacks API extension gpu_physical_clique"),
        "{err}"
    );
    let edit = transcript_block("incus profile edit vfio-p2p-old < profile-raw-qemu-conf.yaml");
    assert!(edit.ends_with("rc=0"), "{edit}");
}

#[test]
fn incus_info_of_incus_7_lists_no_extensions_and_is_refused_with_the_fix() {
    let (code, _, err) = vfio_p2p(&[GEN, &["--incus-server", &fixture("info.yaml")]].concat());
    assert_ne!(code, 0);
    assert!(
        err.contains("only their count") && err.contains("incus query /1.0"),
        "{err}"
    );
}

/// `check --incus-config` on the profile as Incus stored it (`incus profile show`).
fn check(path: &str) -> (i32, String) {
    let (code, out, err) = vfio_p2p(&[
        "--example",
        "dual-socket-pcie",
        "check",
        "--incus-config",
        path,
        "--format",
        "json",
    ]);
    assert!(err.is_empty() || !err.contains("error"), "{err}");
    (code, out)
}

fn failed_checks(report: &str) -> Vec<String> {
    let v: serde_json::Value = serde_json::from_str(report).unwrap_or_default();
    v["checks"]
        .as_array()
        .map(|r| {
            r.iter()
                .filter(|c| c["status"] == "fail")
                .map(|c| format!("{} {}", c["check"], c["subject"]))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn check_reads_what_incus_stored_and_finds_a_missing_clique() {
    for stored in ["profile-show.yaml", "profile-raw-qemu-conf-show.yaml"] {
        let (_, report) = check(&fixture(stored));
        assert!(report.contains("\"checks\""), "no report parsed: {report}");
        // the example's GPUs are still on nvidia: Incus binds them at start (issue 40)
        let fails = failed_checks(&report);
        assert!(fails.is_empty(), "{stored}: {fails:?}");
        assert!(report.contains("Incus (incus start) binds"), "{report}");
    }
    let dir = tempfile::tempdir().unwrap();
    let without = dir.path().join("no-clique.yaml");
    let text: String = read("profile-show.yaml")
        .lines()
        .filter(|l| !l.contains("nvidia.clique"))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&without, text).unwrap();
    let (code, report) = check(without.to_str().unwrap());
    assert_eq!(code, 2);
    let missing: Vec<_> = failed_checks(&report)
        .into_iter()
        .filter(|f| f.contains("clique-missing"))
        .collect();
    assert_eq!(missing.len(), 3, "{report}");
}

#[test]
fn todays_commands_are_the_ones_incus_took() {
    let server = fixture("server.json");
    let args = [
        GEN,
        &["--incus-server", &server, "--incus-output", "commands"],
    ]
    .concat();
    let (code, out, err) = vfio_p2p(&args);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out,
        read("commands.sh"),
        "gen incus --incus-output commands changed: record again"
    );
    // replayed on a profile (`incus profile set|device add` take the same arguments): each took
    let mut ran = 0;
    for cmd in out.lines().filter(|l| l.starts_with("incus ")) {
        let on_profile = cmd
            .replace("incus config set vm0 ", "incus profile set vfio-p2p-cmds ")
            .replace(
                "incus config device add vm0 ",
                "incus profile device add vfio-p2p-cmds ",
            );
        let block = transcript_block(&on_profile);
        assert!(block.ends_with("rc=0"), "{block}");
        ran += 1;
    }
    assert_eq!(ran, 8);
    // and Incus stored the same devices and keys as from the profile
    let body = |f: &str| -> Vec<String> {
        read(f)
            .lines()
            .filter(|l| !l.starts_with("name:") && !l.starts_with("description:"))
            .map(str::to_string)
            .collect()
    };
    assert_eq!(body("commands-show.yaml"), body("profile-show.yaml"));
}

#[test]
fn check_incus_config_errors_name_the_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let (code, _, err) = vfio_p2p(&[
        "--example",
        "dual-socket-pcie",
        "check",
        "--incus-config",
        d,
    ]);
    assert_ne!(code, 0);
    assert!(err.contains("is not a regular file"), "{err}");
    let bad = dir.path().join("vm0.yaml");
    std::fs::write(
        &bad,
        "config: {}\ndevices:\n  gpu0:\n    type: gpu\n    pci: 0000:05:00\n",
    )
    .unwrap();
    let path = bad.to_str().unwrap();
    let (code, _, err) = vfio_p2p(&[
        "--example",
        "dual-socket-pcie",
        "check",
        "--incus-config",
        path,
    ]);
    assert_ne!(code, 0);
    assert!(
        err.contains(&format!("{path}:5: devices.gpu0.pci: `0000:05:00`")),
        "{err}"
    );
}

#[test]
fn gen_incus_refuses_what_incus_decides_itself() {
    let (code, _, err) = vfio_p2p(&[GEN, &["--expect-out", "/nonexistent/e.json"]].concat());
    assert_ne!(code, 0);
    assert!(err.contains("writes no expectation"), "{err}");
    let (code, _, err) = vfio_p2p(&[GEN, &["--guest-topology", "mirror"]].concat());
    assert_ne!(code, 0);
    assert!(
        err.contains("lays out the guest's PCIe tree itself"),
        "{err}"
    );
}

/// `check --incus-config` with `--allow-untranslated-p2p` on level A's sysfs.
fn check_lab(config: &str) -> serde_json::Value {
    let snapshot = format!(
        "{}/../tests/fixtures/cloud-hypervisor/boot/snapshot",
        env!("CARGO_MANIFEST_DIR")
    );
    let (_, out, err) = vfio_p2p(&[
        "--sysfs-root",
        &snapshot,
        "check",
        "--incus-config",
        config,
        "--allow-untranslated-p2p",
        "--format",
        "json",
    ]);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}{err}"))
}

fn lab_findings(report: &serde_json::Value, status: &str) -> Vec<String> {
    let checks = report["checks"].as_array().unwrap();
    checks
        .iter()
        .filter(|c| c["status"] == status)
        .map(|c| format!("{} {}", c["check"], c["subject"]))
        .collect()
}

/// The lab's stage incus (tests/lab/stage-incus.sh): `incus config show --expanded` of the VM
/// that Incus 7.0.2 made from `gen incus`'s profile in level A (tests/fixtures/incus/lab), read
/// on level A's sysfs (the snapshot stage ch recorded: the same emulated host, whose switch has
/// no ACS). The cliques are planned with the command's `--allow-untranslated-p2p`, as `gen` had
/// them: the switch pair's shared clique is right, and without it clique-missing names both.
#[test]
fn check_plans_the_lab_vms_cliques_with_the_commands_options() {
    let report = check_lab(&fixture("lab/expanded.yaml"));
    let fails = lab_findings(&report, "fail");
    assert!(
        fails
            .iter()
            .all(|f| !f.contains("p2p-plan") && !f.contains("clique")),
        "{fails:?}"
    );
    let dir = tempfile::tempdir().unwrap();
    let without = dir.path().join("no-clique.yaml");
    let text: String = read("lab/expanded.yaml")
        .lines()
        .filter(|l| !l.contains("nvidia.clique"))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&without, text).unwrap();
    let missing: Vec<String> = lab_findings(&check_lab(without.to_str().unwrap()), "fail")
        .into_iter()
        .filter(|f| f.contains("clique-missing"))
        .collect();
    assert_eq!(missing.len(), 2, "{missing:?}");
    assert!(
        missing.iter().any(|f| f.contains("0000:13:00.0")),
        "{missing:?}"
    );
    assert!(
        missing.iter().any(|f| f.contains("0000:14:00.0")),
        "{missing:?}"
    );
}

/// The lab's stage incus run to its end (tests/fixtures/incus/lab/boot, kept by its `record`
/// script): Incus 7.0.2 started level B from `gen incus`'s profile and the agent in it read the
/// cliques. `boot(name)`: one of its files.
fn boot(name: &str) -> String {
    read(&format!("lab/boot/{name}"))
}

fn boot_json(name: &str) -> serde_json::Value {
    serde_json::from_str(&boot(name)).unwrap_or_else(|e| panic!("lab/boot/{name}: {e}"))
}

#[test]
fn todays_gen_incus_is_the_profile_incus_booted_the_lab_guest_from() {
    let snapshot = format!(
        "{}/../tests/fixtures/cloud-hypervisor/boot/snapshot",
        env!("CARGO_MANIFEST_DIR")
    );
    let vm = fixture("lab/boot/vm.yaml");
    let server = fixture("server.json");
    let (code, out, err) = vfio_p2p(&[
        "--sysfs-root",
        &snapshot,
        "gen",
        "incus",
        "--config",
        &vm,
        "--gpus",
        "0000:13:00.0,0000:14:00.0,0000:81:00.0",
        "--allow-untranslated-p2p",
        "--incus-server",
        &server,
    ]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out,
        boot("profile.yaml"),
        "gen incus changed since Incus booted the lab's guest from it: run the stage again (tests/fixtures/incus/lab/boot/record)"
    );
}

/// `[device "dev-incus_gpuN"]` sections of the QEMU configuration Incus wrote: (qdev id, host
/// address, the clique Incus gave QEMU).
fn incus_gpu_devices(conf: &str) -> Vec<(String, String, Option<String>)> {
    let mut out = Vec::new();
    for section in conf.split("\n[").skip(1) {
        let Some(id) = section
            .strip_prefix("device \"")
            .and_then(|s| s.split('"').next())
            .filter(|id| id.starts_with("dev-incus_gpu"))
        else {
            continue;
        };
        let value = |key: &str| {
            section.lines().find_map(|l| {
                l.strip_prefix(&format!("{key} = \""))
                    .map(|v| v.trim_end_matches('"').to_string())
            })
        };
        out.push((
            id.to_string(),
            value("host").unwrap(),
            value("x-nv-gpudirect-clique"),
        ));
    }
    out
}

/// The guest address QEMU reported (query-pci) for the device with this qdev id.
fn guest_bdf(query: &serde_json::Value, qdev: &str) -> String {
    fn find(devs: &[serde_json::Value], qdev: &str) -> Option<String> {
        devs.iter().find_map(|d| {
            if d["qdev_id"] == qdev {
                let n = |k: &str| d[k].as_u64().unwrap();
                return Some(format!(
                    "0000:{:02x}:{:02x}.{}",
                    n("bus"),
                    n("slot"),
                    n("function")
                ));
            }
            find(d["pci_bridge"]["devices"].as_array()?, qdev)
        })
    }
    query["return"]
        .as_array()
        .unwrap()
        .iter()
        .find_map(|bus| find(bus["devices"].as_array()?, qdev))
        .unwrap_or_else(|| panic!("{qdev} not in QEMU's query-pci"))
}

#[test]
fn the_agent_under_incus_found_the_planned_cliques_at_0xc8() {
    let plan = boot_json("plan.json");
    let scan = boot_json("scan.json");
    let query = boot_json("query-pci.json");
    let devices = incus_gpu_devices(&boot("qemu.conf"));
    assert_eq!(devices.len(), 3, "{devices:?}");
    for (qdev, host, clique) in &devices {
        let planned = &plan["assignments"][host];
        // Incus passed gen's nvidia.clique to QEMU as it was planned
        assert_eq!(
            clique.as_deref().map(|c| c.parse::<u64>().unwrap()),
            planned.as_u64(),
            "{qdev} ({host}) in Incus's QEMU configuration"
        );
        let guest = guest_bdf(&query, qdev);
        crate::recording::assert_scan_found(&scan, host, &guest, planned, "0xc8");
    }
    crate::recording::assert_agent_verdicts("incus/lab/boot");
    assert!(boot("version.txt").starts_with("Server version: 7.0.2"));
}
