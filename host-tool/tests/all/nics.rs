//! NICs passed with the GPUs (issue #22): named by BDF, interface or RDMA device name,
//! read from sysfs (`net/`, `infiniband/`), bound and checked like the GPUs, never in a clique.

use assert_cmd::Command;

use crate::cli::succeeded;

fn vfio_p2p() -> Command {
    crate::cli::vfio_p2p()
}

/// `gen libvirt --nics mlx5_0` for two hgx-h100 GPUs (libvirt 9.0).
fn gen_domain_with_a_nic() -> Command {
    let mut c = vfio_p2p();
    c.args(["--example", "hgx-h100", "gen", "libvirt"])
        .args([
            "--libvirt-version",
            "9.0",
            "--gpus",
            "0000:18:00.0,0000:19:00.0",
        ])
        .args(["--nics", "mlx5_0"]);
    c
}

/// The domain [`gen_domain_with_a_nic`] prints.
fn domain_with_a_nic() -> String {
    succeeded(&mut gen_domain_with_a_nic()).0
}

/// A snapshot of hgx-h100 carries its NICs' `net/` and `infiniband/` names, and `gen`
/// run on it (`--sysfs-root`) resolves `--nics` by either name to the same vfio-pci device.
#[test]
fn names_are_read_from_a_sysfs_tree() {
    let dir = tempfile::tempdir().unwrap();
    let snap = dir.path().join("snap");
    vfio_p2p()
        .args(["--example", "hgx-h100", "snapshot", "-o"])
        .arg(&snap)
        .assert()
        .success();
    assert!(snap
        .join("sys/bus/pci/devices/0000:1a:00.0/infiniband/mlx5_0")
        .is_dir());
    let gen = |nics: &str| {
        let mut cmd = vfio_p2p();
        cmd.arg("--sysfs-root")
            .arg(&snap)
            .args([
                "gen",
                "qemu",
                "--format",
                "argv",
                "--libvirt-version",
                "9.0",
            ])
            .args(["--gpus", "0000:18:00.0,0000:19:00.0", "--nics", nics]);
        succeeded(&mut cmd).0
    };
    let by_rdma = gen("mlx5_0");
    assert!(
        by_rdma.contains(r#""driver":"vfio-pci","host":"0000:1a:00.0","id":"nic0""#),
        "{by_rdma}"
    );
    assert_eq!(gen("ibp26s0"), by_rdma);
    assert_eq!(gen("0000:1a:00.0"), by_rdma);
    // a NIC never carries a clique property
    let nic_line = by_rdma.lines().find(|l| l.contains("\"nic0\"")).unwrap();
    assert!(!nic_line.contains("clique"), "{nic_line}");
}

/// vm.yaml `nics:` with an unknown name: the error names the file, the name and the fix.
#[test]
fn unknown_name_in_vm_yaml_names_the_file_and_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("vm.yaml");
    std::fs::write(&cfg, "name: a\ngpus: [0000:18:00.0]\nnics: [eth9]\n").unwrap();
    let out = vfio_p2p()
        .args(["--example", "hgx-h100", "gen", "qemu", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("vm.yaml: nics: no network interface or RDMA device 'eth9'"),
        "{err}"
    );
    assert!(err.contains("name it by PCI address"), "{err}");
    // a GPU named as a NIC
    let out = vfio_p2p()
        .args([
            "--example",
            "hgx-h100",
            "gen",
            "qemu",
            "--nics",
            "0000:19:00.0",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr)
        .contains("--nics: 0000:19:00.0 is not a network device"));
}

/// `check --domain-xml` on a domain `gen libvirt --nics` wrote: the NIC gets the
/// passed-device checks (IOMMU group, VFIO group, reset), no clique check, and its group
/// is not "foreign" to the GPUs'.
#[test]
fn check_treats_a_domain_nic_as_a_passed_device() {
    let dir = tempfile::tempdir().unwrap();
    let xml = dir.path().join("dom.xml");
    gen_domain_with_a_nic()
        .arg("-o")
        .arg(&xml)
        .assert()
        .success();
    let text = std::fs::read_to_string(&xml).unwrap();
    assert_eq!(text.matches("<hostdev ").count(), 3, "{text}");
    let out = vfio_p2p()
        .args([
            "--example",
            "hgx-h100",
            "check",
            "--format",
            "json",
            "--domain-xml",
        ])
        .arg(&xml)
        .output()
        .unwrap();
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let nic: Vec<&str> = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["subject"] == "0000:1a:00.0")
        .map(|c| c["check"].as_str().unwrap())
        .collect();
    assert_eq!(nic, ["iommu-group", "vfio-group", "reset"]);
    let plan = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["check"] == "p2p-plan")
        .unwrap();
    assert!(plan["saw"].as_str().unwrap().contains("2 GPU(s)"), "{plan}");
}

/// `place --with-nics`: every hgx-h100 GPU gets the PIX NIC of its own switch, the vm.yaml
/// written lists them under `nics:`, and `gen` from it passes them beside their GPUs.
#[test]
fn place_with_nics_keeps_gpu_nic_affinity_into_gen() {
    let dir = tempfile::tempdir().unwrap();
    let mut place = vfio_p2p();
    place
        .args([
            "--example",
            "hgx-h100",
            "place",
            "--shape",
            "2x4",
            "--with-nics",
        ])
        .args(["--format", "json", "--write-configs"])
        .arg(dir.path());
    let r: serde_json::Value = serde_json::from_str(&succeeded(&mut place).0).unwrap();
    let mut given = std::collections::BTreeSet::new();
    for vm in r["vms"].as_array().unwrap() {
        for c in vm["nics"].as_array().unwrap() {
            assert_eq!(c["path"], "PIX", "{c}");
            assert!(given.insert(c["nic"].as_str().unwrap().to_string()), "{c}");
        }
    }
    assert_eq!(given.len(), 8);
    let cfg = dir.path().join("vm0.yaml");
    let text = std::fs::read_to_string(&cfg).unwrap();
    assert!(
        text.contains("nics:\n  - 0000:1a:00.0  # PIX to 0000:18:00.0\n"),
        "{text}"
    );
    let argv = vfio_p2p()
        .args([
            "--example",
            "hgx-h100",
            "gen",
            "qemu",
            "--format",
            "argv",
            "--config",
        ])
        .arg(&cfg)
        .output()
        .unwrap();
    let argv = String::from_utf8(argv.stdout).unwrap();
    assert_eq!(argv.matches(r#""id":"nic"#).count(), 4, "{argv}");
}

/// `gen nccl --nics` read by the guest agent's `nccl-topo` check, against a guest laid out
/// as gen decided (the layout's guest addresses, mlx5 numbering its CX-7s in address
/// order): no problem; the same file against a guest whose NIC sits elsewhere: one.
#[test]
fn the_agent_accepts_gen_nccls_nics_where_the_layout_puts_them() {
    use std::collections::BTreeMap;
    use vfio_p2p_agent::nccl_topo::check_text;
    use vfio_p2p_agent::sysfs::gpus::{NetFunction, Scan};
    use vfio_p2p_config::vm::GuestTopology;
    use vfio_p2p_decide::guest_layout::{decide_with_nics, LayoutOptions};
    use vfio_p2p_model::Topology;

    let gpus = "0000:18:00.0,0000:19:00.0,0000:9d:00.0";
    let nics = "0000:1a:00.0,0000:1b:00.0,0000:9f:00.0";
    let xml = String::from_utf8(
        vfio_p2p()
            .args([
                "--example",
                "hgx-h100",
                "gen",
                "nccl",
                "--gpus",
                gpus,
                "--nics",
                nics,
            ])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    let topo = Topology::from_record(&vfio_p2p_read::synth::example("hgx-h100").unwrap());
    let bdfs =
        |s: &str| -> Vec<pci_config::Bdf> { s.split(',').map(|b| b.parse().unwrap()).collect() };
    let opts = LayoutOptions {
        topology: GuestTopology::Mirror,
        guest_numa: true,
    };
    let layout = decide_with_nics(&topo, &bdfs(gpus), &bdfs(nics), &BTreeMap::new(), opts).unwrap();
    let mut scan: Scan = serde_json::from_value(serde_json::json!({
        "sysfs_root": "/", "gpus": [], "note": null, "warnings": []
    }))
    .unwrap();
    for g in &layout.gpus {
        scan.gpus.push(
            serde_json::from_value(serde_json::json!({
                "bdf": g.guest, "vendor": "0x10de", "device": "0x2330", "class": "0x030200",
                "driver": "nvidia", "config_bytes": 4096, "caps_readable": true,
                "clique": null, "cap_offset": null, "cap_linked": null, "problem": null,
                "link_speed": null, "link_width": null, "max_link_speed": null,
                "max_link_width": null, "numa_node": null
            }))
            .unwrap(),
        );
    }
    let mut guest_nics: BTreeMap<pci_config::Bdf, NetFunction> = BTreeMap::new();
    let mut order: Vec<_> = layout.nics.iter().map(|n| n.guest).collect();
    order.sort();
    for (i, b) in order.iter().enumerate() {
        guest_nics.insert(
            *b,
            NetFunction {
                vendor: 0x15b3,
                device: 0x1021,
                rdma: vec![format!("mlx5_{i}")],
                net: vec![],
            },
        );
    }
    // the agent compares the arch with its own; the example is x86_64
    let xml = xml.replace(
        "arch=\"x86_64\"",
        &format!(
            "arch=\"{}\"",
            match std::env::consts::ARCH {
                "aarch64" => "arm64",
                a => a,
            }
        ),
    );
    let c = check_text(&xml, "gen.xml", &scan, &guest_nics).unwrap();
    assert_eq!(c.problems, Vec::<String>::new());
    assert_eq!(c.nics.len(), 3);
    assert!(c.nics.iter().all(|n| n.in_guest));
    // one NIC elsewhere in the guest
    let (first, f) = guest_nics.pop_first().unwrap();
    guest_nics.insert(pci_config::Bdf::new(0, first.bus + 0x10, 0, 0), f);
    let c = check_text(&xml, "gen.xml", &scan, &guest_nics).unwrap();
    assert_eq!(c.problems.len(), 1, "{:?}", c.problems);
    assert!(c.problems[0].contains(&format!(
        "NIC {first} is in the file but this guest has no network device there"
    )));
}

/// The hook on a domain `gen libvirt --nics` wrote, its hostdevs managed='no': prepare
/// binds the NIC like the GPUs (dry run on the example), and raises no clique finding for it.
#[test]
fn the_hook_binds_a_domain_nic_like_a_gpu() {
    let xml = domain_with_a_nic().replace("managed='yes'", "managed='no'");
    let out = vfio_p2p()
        .args(["--example", "hgx-h100", "hook", "run", "--dry-run"])
        .args(["vm0", "prepare", "begin", "-"])
        .write_stdin(xml)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("0000:1a:00.0  mlx5_core → (dry run)  (named)"),
        "{stdout}"
    );
    assert!(
        stdout.contains("0000:18:00.0  nvidia → (dry run)  (named)"),
        "{stdout}"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("1a:00.0"), "{stderr}");
}
