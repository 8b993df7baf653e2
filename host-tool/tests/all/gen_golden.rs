//! Golden files for every generator on the embedded example hosts.

fn gen(example: &str, args: &[&str]) -> String {
    let out = crate::cli::vfio_p2p()
        .args(["--example", example, "gen"])
        .args(args)
        .args(if args.contains(&"--libvirt-version") {
            &[][..]
        } else {
            &["--libvirt-version", "9.0"][..]
        })
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "gen {args:?} on {example} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

const EXAMPLES: [&str; 3] = ["hgx-h100", "dual-socket-pcie", "flat-vm"];

#[test]
fn qemu_mirror_and_flat() {
    for ex in EXAMPLES {
        for topo in ["mirror", "flat"] {
            let text = gen(ex, &["qemu", "--format", "argv", "--guest-topology", topo]);
            insta::assert_snapshot!(format!("qemu-{ex}-{topo}"), text);
        }
    }
}

#[test]
fn qemu_uefi_config() {
    let cfg = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../configs/hgx-h100-mirror.yaml"
    );
    insta::assert_snapshot!(gen(
        "hgx-h100",
        &["qemu", "--config", cfg, "--format", "shell"]
    ));
}

#[test]
fn libvirt_domains() {
    for ex in EXAMPLES {
        insta::assert_snapshot!(format!("libvirt-{ex}"), gen(ex, &["libvirt"]));
    }
    insta::assert_snapshot!(
        "libvirt-dual-socket-pcie-8.1",
        gen("dual-socket-pcie", &["libvirt", "--libvirt-version", "8.1"])
    );
}

/// A vm.yaml naming what Cloud Hypervisor boots (gen refuses a VM that boots nothing),
/// written into `dir`.
pub(crate) fn ch_kernel_config(dir: &std::path::Path) -> String {
    let path = dir.join("vm.yaml");
    std::fs::write(&path, "name: vm0\nkernel: /boot/vmlinuz\n").unwrap();
    path.to_str().unwrap().to_string()
}

#[test]
fn cloud_hypervisor() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = ch_kernel_config(dir.path());
    for ex in EXAMPLES {
        let text = gen(
            ex,
            &["cloud-hypervisor", "--format", "argv", "--config", &cfg],
        );
        insta::assert_snapshot!(format!("cloud-hypervisor-{ex}"), text);
    }
}

#[test]
fn nccl_topology() {
    for ex in EXAMPLES {
        insta::assert_snapshot!(format!("nccl-{ex}"), gen(ex, &["nccl"]));
    }
    // every GPU and every CX-7 of hgx-h100: each switch holds 2 GPUs and 2 NICs
    let nics = "0000:1a:00.0,0000:1b:00.0,0000:3c:00.0,0000:3d:00.0,0000:9f:00.0,0000:a0:00.0,0000:bd:00.0,0000:be:00.0";
    insta::assert_snapshot!(
        "nccl-hgx-h100-nics",
        gen("hgx-h100", &["nccl", "--nics", nics])
    );
}

#[test]
fn nccl_fixture_for_the_gpu_check_is_current() {
    let want = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fixtures/nccl/h200x2-topo.xml"
    ))
    .unwrap();
    // The file for the GPU check: the VM's sysfs, its nvidia-smi capture and its CPU
    // (the flat-vm example), described where the GPUs are.
    let out = crate::cli::vfio_p2p()
        .args(["--example", "flat-vm", "gen", "nccl", "--as-is"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), want);
}

#[test]
fn expectation_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("expect.json");
    let argv = gen(
        "dual-socket-pcie",
        &[
            "qemu",
            "--format",
            "argv",
            "--expect-out",
            path.to_str().unwrap(),
        ],
    );
    assert!(argv.contains(&format!(
        "name=opt/vfio-p2p/expect.json,file={}",
        path.display()
    )));
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(v["version"], 1);
    assert_eq!(v["gpus"].as_array().unwrap().len(), 8);
    assert_eq!(v["gpus"][0]["host_bdf"], "0000:05:00.0");
    assert_eq!(v["gpus"][0]["guest_bdf"], "0000:25:00.0");
    assert_eq!(v["gpus"][0]["clique"], 0);
    assert_eq!(v["pairs"].as_array().unwrap().len(), 28);
    insta::assert_json_snapshot!("expectation-dual-socket-pcie", v);
}

fn patch(xml: &str, extra: &[&str]) -> (bool, String, String) {
    let out = crate::cli::vfio_p2p()
        .args(["--example", "dual-socket-pcie", "libvirt", "patch", "-"])
        .args(extra)
        .write_stdin(xml)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

const EXISTING: &str = include_str!("../../../tests/fixtures/libvirt/existing-domain.xml");

#[test]
fn libvirt_patch_keeps_the_rest_and_is_idempotent() {
    let (ok, once, err) = patch(EXISTING, &["--libvirt-version", "9.0"]);
    assert!(ok, "{err}");
    insta::assert_snapshot!("libvirt-patch-existing", once);
    // Everything that was there is still there, in order, byte for byte.
    let mut rest = once.as_str();
    for line in EXISTING.lines() {
        // The domain start tag gains xmlns:qemu before its `>`.
        let line = line.strip_suffix('>').unwrap_or(line);
        let at = rest
            .find(line)
            .unwrap_or_else(|| panic!("lost line {line:?}"));
        rest = &rest[at + line.len()..];
    }
    let (ok, twice, _) = patch(&once, &["--libvirt-version", "9.0"]);
    assert!(ok);
    assert_eq!(once, twice);
}

#[test]
fn libvirt_patch_old_libvirt_uses_set_and_warns() {
    let (ok, once, err) = patch(EXISTING, &["--libvirt-version", "8.0"]);
    assert!(ok, "{err}");
    assert!(err.contains("-set"), "{err}");
    assert!(once.contains("<qemu:arg value='device.ua-second.x-nv-gpudirect-clique=0'/>"));
    let (_, twice, _) = patch(&once, &["--libvirt-version", "8.0"]);
    assert_eq!(once, twice);
}

#[test]
fn libvirt_patch_refuses_hidden_hypervisor() {
    let hidden = EXISTING.replace("<hidden state=\"off\"/>", "<hidden state='on'/>");
    let (ok, _, err) = patch(&hidden, &["--libvirt-version", "9.0"]);
    assert!(!ok);
    assert!(err.contains("hides the hypervisor"), "{err}");
}

/// The guest tree as `gen qemu` emits it, read back from the argv: each GPU's root
/// complex (an expander's `bus_nr` and `numa_node`, or `pcie.0`) and the bridges above it.
fn guest_places(
    argv: &[String],
) -> Vec<(String, pci_config::RootComplex, Vec<pci_config::PathBridge>)> {
    use pci_config::{Bdf, PathBridge, RootComplex};
    let devices: Vec<serde_json::Value> = argv
        .windows(2)
        .filter(|w| w[0] == "-device" && w[1].starts_with('{'))
        .map(|w| serde_json::from_str(&w[1]).unwrap())
        .collect();
    let by_id = |id: &str| devices.iter().position(|d| d["id"] == id);
    let mut out = Vec::new();
    for gpu in devices.iter().filter(|d| d["driver"] == "vfio-pci") {
        if gpu["id"].as_str().unwrap().contains("-fn") {
            continue;
        }
        let mut root = RootComplex {
            domain: 0,
            bus: 0,
            numa_node: None,
        };
        let mut chain = Vec::new();
        let mut parent = gpu["bus"].as_str().unwrap().to_string();
        while let Some(i) = by_id(&parent) {
            let d = &devices[i];
            if d["driver"] == "pxb-pcie" {
                root.bus = d["bus_nr"].as_u64().unwrap() as u8;
                root.numa_node = d["numa_node"].as_u64().map(|n| n as u32);
                break;
            }
            // Identity is all a bridge needs here: its index in the argv.
            chain.push(PathBridge {
                bdf: Bdf::new(1, i as u8, 0, 0),
                switch: d["driver"] == "x3130-upstream",
            });
            parent = d["bus"].as_str().unwrap().to_string();
        }
        chain.reverse();
        out.push((gpu["host"].as_str().unwrap().to_string(), root, chain));
    }
    out
}

/// `vfio-p2p topo --format json` of an example: the host's labels.
fn host_topo(example: &str) -> serde_json::Value {
    let out = crate::cli::vfio_p2p()
        .args(["--example", example, "topo", "--format", "json"])
        .output()
        .unwrap();
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Issue #22: with `mirror`, every GPU pair reads the same PIX/PXB/PHB/NODE/SYS label in
/// the guest as on the host. The guest label is computed from the emitted QEMU argv
/// (expanders, their NUMA nodes, ports and switches), the host's from `topo`.
#[test]
fn mirror_guest_labels_equal_host_labels() {
    for ex in ["hgx-h100", "dual-socket-pcie"] {
        let topo = host_topo(ex);
        let host_gpus: Vec<&str> = topo["gpus"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| g["bdf"].as_str().unwrap())
            .collect();
        let argv: Vec<String> = serde_json::from_str(&gen(
            ex,
            &["qemu", "--format", "json", "--guest-topology", "mirror"],
        ))
        .unwrap();
        let places = guest_places(&argv);
        assert_eq!(places.len(), host_gpus.len(), "{ex}");
        let mut table = String::new();
        let mut pairs = 0;
        for i in 0..places.len() {
            for j in i + 1..places.len() {
                let path = |k: usize| pci_config::DevicePath {
                    device: places[k].0.parse().unwrap(),
                    root: places[k].1,
                    bridges: &places[k].2,
                };
                let guest = pci_config::path_label(&path(i), &path(j));
                let hi = host_gpus.iter().position(|b| *b == places[i].0).unwrap();
                let hj = host_gpus.iter().position(|b| *b == places[j].0).unwrap();
                let host = topo["pcie_matrix"][hi][hj].as_str().unwrap();
                assert_eq!(guest.label(), host, "{ex}: {} {}", places[i].0, places[j].0);
                table.push_str(&format!(
                    "{} {}  host {host:<4}  guest {guest}\n",
                    places[i].0, places[j].0
                ));
                pairs += 1;
            }
        }
        assert_eq!(pairs, 28, "{ex}");
        insta::assert_snapshot!(format!("guest-labels-{ex}"), table);
    }
}

/// Issue #22: NICs passed with the GPUs (`--nics`) sit where they sit on the host, so
/// every GPU–NIC and NIC–NIC pair reads the same label in the guest as in `topo`'s
/// `gpu_paths`/`nic_paths`. hgx-h100: 8 GPUs + 8 CX-7 (64 GPU–NIC pairs, 28 NIC–NIC);
/// dual-socket-pcie: 8 GPUs + 2 (16 and 1).
#[test]
fn mirror_guest_labels_equal_host_labels_for_nics() {
    for (ex, expect_pairs) in [("hgx-h100", 64 + 28), ("dual-socket-pcie", 16 + 1)] {
        let topo = host_topo(ex);
        let bdfs = |key: &str| -> Vec<String> {
            topo[key]
                .as_array()
                .unwrap()
                .iter()
                .map(|g| g["bdf"].as_str().unwrap().to_string())
                .collect()
        };
        let (host_gpus, host_nics) = (bdfs("gpus"), bdfs("nics"));
        let argv: Vec<String> = serde_json::from_str(&gen(
            ex,
            &["qemu", "--format", "json", "--nics", &host_nics.join(",")],
        ))
        .unwrap();
        let places = guest_places(&argv);
        assert_eq!(places.len(), host_gpus.len() + host_nics.len(), "{ex}");
        let nic_index = |b: &str| host_nics.iter().position(|n| n == b);
        let mut table = String::new();
        let mut pairs = 0;
        for i in 0..places.len() {
            for j in i + 1..places.len() {
                let (a, b) = (places[i].0.as_str(), places[j].0.as_str());
                let host = match (nic_index(a), nic_index(b)) {
                    (None, None) => continue,
                    (Some(n), None) | (None, Some(n)) => {
                        let g = host_gpus.iter().position(|x| x == a || x == b).unwrap();
                        topo["nics"][n]["gpu_paths"][g]
                            .as_str()
                            .unwrap()
                            .to_string()
                    }
                    (Some(n), Some(m)) => topo["nics"][n]["nic_paths"][m]
                        .as_str()
                        .unwrap()
                        .to_string(),
                };
                let path = |k: usize| pci_config::DevicePath {
                    device: places[k].0.parse().unwrap(),
                    root: places[k].1,
                    bridges: &places[k].2,
                };
                let guest = pci_config::path_label(&path(i), &path(j));
                assert_eq!(guest.label(), host, "{ex}: {a} {b}");
                table.push_str(&format!("{a} {b}  host {host:<4}  guest {guest}\n"));
                pairs += 1;
            }
        }
        assert_eq!(pairs, expect_pairs, "{ex}");
        insta::assert_snapshot!(format!("guest-labels-nics-{ex}"), table);
    }
}

/// Where mirror cannot keep a label, gen names each pair before the VM exists: without
/// guest NUMA nodes, hgx-h100's 16 cross-socket pairs read NODE in the guest.
#[test]
fn mirror_names_every_pair_whose_label_will_differ() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("vm.yaml");
    std::fs::write(
        &cfg,
        "name: no-numa\nguest_topology: mirror\nguest_numa: false\nmemory_mib: 4096\nvcpus: 4\n",
    )
    .unwrap();
    let out = crate::cli::vfio_p2p()
        .args(["--example", "hgx-h100", "gen", "qemu", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let differ: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("in the guest,"))
        .collect();
    assert_eq!(differ.len(), 16, "{stderr}");
    assert!(differ.iter().all(|l| l.starts_with("warning: GPUs ")
        && l.contains("will read NODE in the guest, SYS on the host")));
    // With guest NUMA (the default) nothing differs.
    let quiet = crate::cli::vfio_p2p()
        .args(["--example", "hgx-h100", "gen", "qemu"])
        .output()
        .unwrap();
    assert!(!String::from_utf8_lossy(&quiet.stderr).contains("in the guest,"));
}

#[test]
fn proxmox_config() {
    let cfg = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../configs/hgx-h100-mirror.yaml"
    );
    insta::assert_snapshot!(
        "proxmox-dual-socket-pcie",
        gen(
            "dual-socket-pcie",
            &[
                "proxmox",
                "--config",
                cfg,
                "--gpus",
                "05:00.0,06:00.0,09:00.0,85:00.0"
            ]
        )
    );
    insta::assert_snapshot!("proxmox-flat-vm", gen("flat-vm", &["proxmox"]));
}

/// `check --proxmox-conf` on a config: (exit code, stdout as JSON).
fn check_proxmox(conf: &str) -> (i32, serde_json::Value) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("100.conf");
    std::fs::write(&path, conf).unwrap();
    let out = crate::cli::vfio_p2p()
        .args(["--example", "dual-socket-pcie", "check", "--format", "json"])
        .arg("--proxmox-conf")
        .arg(&path)
        .output()
        .unwrap();
    let json = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("{e}: {}", String::from_utf8_lossy(&out.stderr));
    });
    (out.status.code().unwrap(), json)
}

fn failing_checks(report: &serde_json::Value) -> Vec<String> {
    report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["status"] == "fail")
        .map(|c| format!("{} {}", c["check"], c["subject"]))
        .collect()
}

#[test]
fn proxmox_config_passes_its_own_check() {
    let conf = gen(
        "dual-socket-pcie",
        &["proxmox", "--gpus", "05:00.0,06:00.0,09:00.0,85:00.0"],
    );
    let (_, report) = check_proxmox(&conf);
    // the example's GPUs are still on nvidia, which Proxmox binds at start: nothing fails
    assert!(failing_checks(&report).is_empty(), "{report:#}");
    let planned = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["check"] == "clique-placement")
        .count();
    assert_eq!(planned, 3, "85:00.0 is on the other socket: no clique");
}

#[test]
fn proxmox_check_finds_missing_cliques_and_hidden_hypervisor() {
    let (code, report) = check_proxmox(
        "machine: q35\ncpu: host,hidden=1\nhostpci0: 0000:05:00.0,pcie=1\n\
         hostpci1: 0000:06:00.0,pcie=1\n\
         args: -set device.hostpci0.x-nv-gpudirect-clique=0\n\n[snap]\ncpu: host\n",
    );
    assert_eq!(code, 2);
    assert_eq!(
        failing_checks(&report),
        [
            // the audio functions (snd_hda_intel) share the groups and are not passed:
            // qm start binds only the functions it is given
            "\"iommu-group\" \"0000:05:00.0\"",
            "\"iommu-group\" \"0000:06:00.0\"",
            "\"mmio-window\" null",
            "\"hypervisor-visible\" null",
            "\"clique-missing\" \"0000:06:00.0\""
        ]
    );
}

/// The iommufd backend: `-object iommufd` and `iommufd=` on every vfio-pci (QEMU); libvirt
/// >= 12.1's `<driver iommufd='yes'/>`, and QEMU's own options on an older libvirt (11.3).
#[test]
fn iommufd_backend() {
    insta::assert_snapshot!(
        "qemu-flat-vm-iommufd",
        gen(
            "flat-vm",
            &["qemu", "--format", "argv", "--iommu-backend", "iommufd"]
        )
    );
    for v in ["11.3", "12.8"] {
        insta::assert_snapshot!(
            format!("libvirt-flat-vm-iommufd-{v}"),
            gen(
                "flat-vm",
                &[
                    "libvirt",
                    "--libvirt-version",
                    v,
                    "--iommu-backend",
                    "iommufd"
                ]
            )
        );
    }
    // auto on an example (no live host): legacy, and it says so
    let out = crate::cli::vfio_p2p()
        .args([
            "--example",
            "flat-vm",
            "gen",
            "qemu",
            "--iommu-backend",
            "auto",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(!String::from_utf8_lossy(&out.stdout).contains("iommufd"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("iommu backend auto: legacy"), "{err}");
}

/// Cloud Hypervisor under iommufd cannot map peer BARs: cliques are refused with the fix;
/// without cliques it gets `--platform iommufd=on,vfio_p2p_dma=off`.
#[test]
fn cloud_hypervisor_iommufd() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = ch_kernel_config(dir.path());
    let out = crate::cli::vfio_p2p()
        .args([
            "--example",
            "dual-socket-pcie",
            "gen",
            "cloud-hypervisor",
            "--iommu-backend",
            "iommufd",
            "--config",
            &cfg,
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--iommu-backend legacy"), "{err}");
    let text = gen(
        "flat-vm",
        &[
            "cloud-hypervisor",
            "--iommu-backend",
            "iommufd",
            "--gpus",
            "00:06.0",
            "--format",
            "argv",
            "--config",
            &cfg,
        ],
    );
    assert!(text.contains("iommufd=on,vfio_p2p_dma=off"), "{text}");
}
