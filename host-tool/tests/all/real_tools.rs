//! Checks with the real tools: libvirt's schema and QEMU argv generator, and QEMU itself.
//! CI installs them (libvirt-clients libvirt-daemon-driver-qemu libxml2-utils
//! qemu-system-x86); a missing tool fails the test unless VFIO_P2P_SKIP_REAL_TOOLS=1.

use std::io::Write;
use std::path::Path;
use std::process::{Command as Process, Stdio};

use crate::installed_tools::{
    domxml_to_native, have, on_this_machines_nodes, qemu_fed, validate, vfio_p2p,
};

/// `(id, clique)` of every vfio-pci device in a QEMU argv printed by libvirt.
fn vfio_cliques(argv: &str) -> Vec<(String, Option<u64>)> {
    argv.split_whitespace()
        .filter_map(|w| {
            let w = w.trim_matches('\'');
            let v: serde_json::Value = serde_json::from_str(w).ok()?;
            (v["driver"] == "vfio-pci").then(|| {
                (
                    v["id"].as_str().unwrap_or_default().to_string(),
                    v["x-nv-gpudirect-clique"].as_u64(),
                )
            })
        })
        .collect()
}

#[test]
fn generated_domains_validate_and_carry_cliques() {
    if !have("virt-xml-validate") || !have("virsh") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    for ex in ["hgx-h100", "dual-socket-pcie", "flat-vm"] {
        for topo in ["mirror", "flat"] {
            let xml = vfio_p2p(
                &[
                    "--example",
                    ex,
                    "gen",
                    "libvirt",
                    "--guest-topology",
                    topo,
                    "--libvirt-version",
                    "9.0",
                ],
                None,
            );
            let path = dir.path().join(format!("{ex}-{topo}.xml"));
            std::fs::write(&path, &xml).unwrap();
            validate(&path);
            let plan: serde_json::Value = serde_json::from_str(&vfio_p2p(
                &["--example", ex, "plan", "--format", "json"],
                None,
            ))
            .unwrap();
            let argv = domxml_to_native(&on_this_machines_nodes(&xml));
            // Each guest NUMA cell's memory bound to a host node (<numatune> memnode).
            let cells = xml.matches("<cell ").count();
            assert_eq!(
                argv.matches("\"policy\":\"bind\"").count(),
                cells,
                "{ex} {topo}: memory backends bound to host nodes in {argv}"
            );
            assert_eq!(xml.contains("<vcpupin "), cells > 0, "{ex} {topo}");
            let got = vfio_cliques(&argv);
            assert!(!got.is_empty(), "{ex}: no vfio-pci in {argv}");
            let gpus: Vec<(String, Option<u64>)> = got
                .into_iter()
                .filter(|(id, _)| !id.contains("-fn"))
                .collect();
            let want: Vec<Option<u64>> = plan["assignments"]
                .as_object()
                .unwrap()
                .values()
                .map(|v| v.as_u64())
                .collect();
            assert_eq!(
                gpus.iter().map(|g| g.1).collect::<Vec<_>>(),
                want,
                "{ex} {topo}: cliques in libvirt's argv"
            );
        }
    }
    // dual-socket-pcie has cliques: make sure the test above saw some.
    let xml = vfio_p2p(
        &[
            "--example",
            "dual-socket-pcie",
            "gen",
            "libvirt",
            "--libvirt-version",
            "9.0",
        ],
        None,
    );
    let argv = domxml_to_native(&on_this_machines_nodes(&xml));
    assert!(argv.contains("\"x-nv-gpudirect-clique\":1"), "{argv}");
}

/// The host's width through libvirt: from 8.7 `<maxphysaddr mode='passthrough'/>`, which
/// libvirt's schema takes and its argv generator turns into `host-phys-bits=on` on `-cpu`;
/// below 8.7 a `-global` on the host CPU type in `<qemu:commandline>`, passed as it is.
#[test]
fn libvirt_gives_the_guest_the_hosts_width() {
    if !have("virt-xml-validate") || !have("virsh") || !have("qemu-system-x86_64") {
        return;
    }
    // the -global names a property of the CPU type libvirt's host-passthrough starts
    let help = Process::new("qemu-system-x86_64")
        .args(["-device", "host-x86_64-cpu,help"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&help.stdout).contains("host-phys-bits=<bool>"));
    let dir = tempfile::tempdir().unwrap();
    for version in ["9.0", "8.7", "8.6"] {
        let args = [
            "--example",
            "hgx-h100",
            "gen",
            "libvirt",
            "--libvirt-version",
            version,
        ];
        let xml = vfio_p2p(&args, None);
        let element = version != "8.6";
        assert_eq!(
            xml.contains("<maxphysaddr mode='passthrough'/>"),
            element,
            "{version}"
        );
        let path = dir.path().join(format!("{version}.xml"));
        std::fs::write(&path, &xml).unwrap();
        validate(&path);
        let argv = domxml_to_native(&on_this_machines_nodes(&xml));
        let cpu = argv
            .split(" -cpu ")
            .nth(1)
            .and_then(|a| a.split_whitespace().next())
            .unwrap_or_default();
        assert_eq!(
            cpu.contains(",host-phys-bits=on"),
            element,
            "{version}: -cpu {cpu}"
        );
        assert_eq!(
            argv.contains("-global host-x86_64-cpu.host-phys-bits=on"),
            !element,
            "{version}: {argv}"
        );
    }
}

#[test]
fn patched_domain_validates_and_carries_cliques() {
    if !have("virt-xml-validate") || !have("virsh") {
        return;
    }
    let existing = include_str!("../../../tests/fixtures/libvirt/existing-domain.xml");
    let dir = tempfile::tempdir().unwrap();
    let before = dir.path().join("before.xml");
    std::fs::write(&before, existing).unwrap();
    validate(&before);
    let xml = vfio_p2p(
        &[
            "--example",
            "dual-socket-pcie",
            "libvirt",
            "patch",
            "--libvirt-version",
            "9.0",
            "-",
        ],
        Some(existing),
    );
    let after = dir.path().join("after.xml");
    std::fs::write(&after, &xml).unwrap();
    validate(&after);
    let argv = domxml_to_native(&xml);
    // the 64-bit window the patch added (<pcihole64>), as libvirt passes it to QEMU
    assert!(
        argv.contains("q35-pcihost.pci-hole64-size=436207616K"),
        "{argv}"
    );
    let got = vfio_cliques(&argv);
    assert_eq!(
        got,
        vec![
            ("ua-gpu-0000-05-00-0".to_string(), Some(0)),
            ("ua-second".to_string(), Some(0)),
            // Alone on its socket: no peer, no clique.
            ("ua-gpu-0000-85-00-0".to_string(), None),
        ]
    );
}

#[test]
fn qemu_accepts_the_generated_machine() {
    if !have("qemu-system-x86_64") {
        return;
    }
    for ex in ["hgx-h100", "dual-socket-pcie", "flat-vm"] {
        for topo in ["mirror", "flat"] {
            let argv: Vec<String> = serde_json::from_str(&vfio_p2p(
                &[
                    "--example",
                    ex,
                    "gen",
                    "qemu",
                    "--format",
                    "json",
                    "--guest-topology",
                    topo,
                ],
                None,
            ))
            .unwrap();
            // Everything but the vfio-pci devices (no GPUs here), under TCG.
            let mut args: Vec<String> = Vec::new();
            for pair in argv[1..].chunks(2) {
                let (k, v) = (&pair[0], &pair[1]);
                if k == "-device" && v.contains("\"vfio-pci\"") {
                    continue;
                }
                let v = match k.as_str() {
                    "-machine" => "q35,accel=tcg".to_string(),
                    // stdio is QMP's here
                    "-serial" => "null".to_string(),
                    "-cpu" => "max,phys-bits=46".to_string(),
                    "-object" => on_this_machines_nodes(v),
                    _ => v.clone(),
                };
                args.push(k.clone());
                args.push(v);
            }
            let out = qemu_fed(
                300,
                &["-S", "-display", "none", "-nodefaults", "-qmp", "stdio"],
                &args,
                b"{\"execute\":\"qmp_capabilities\"}\n{\"execute\":\"query-pci\"}\n{\"execute\":\"quit\"}\n",
            );
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success(),
                "{ex} {topo}: qemu refused the machine: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(
                argv.iter().any(|a| a.contains("pcie-root-port")),
                "{ex} {topo}: no root port generated"
            );
            assert!(stdout.contains("\"return\""), "{ex} {topo}: {stdout}");
            // Two-socket examples under mirror: a guest node per host node, memory bound.
            let bound = argv
                .iter()
                .filter(|a| a.contains("host-nodes=") && a.ends_with("policy=bind"))
                .count();
            let want = if topo == "mirror" && ex != "flat-vm" {
                2
            } else {
                0
            };
            assert_eq!(bound, want, "{ex} {topo}: {argv:?}");
        }
    }
}

/// The real QEMU's path (`command -v`), or `None` when skipping is allowed.
fn real_qemu() -> Option<std::path::PathBuf> {
    if !have("qemu-system-x86_64") {
        return None;
    }
    let out = Process::new("sh")
        .args(["-c", "command -v qemu-system-x86_64"])
        .output()
        .unwrap();
    Some(String::from_utf8(out.stdout).unwrap().trim().into())
}

/// Installed as `qemu-system-x86_64` (argv[0] dispatch, the real QEMU beside it as
/// `.real`), the wrapper execs QEMU 7.2 itself: same pid, same argv, same exit status.
#[test]
fn qemu_wrap_argv0_execs_real_qemu() {
    let Some(qemu) = real_qemu() else { return };
    let dir = tempfile::tempdir().unwrap();
    let wrapper = dir.path().join("qemu-system-x86_64");
    std::os::unix::fs::symlink(crate::cli::bin(), &wrapper).unwrap();
    std::os::unix::fs::symlink(&qemu, dir.path().join("qemu-system-x86_64.real")).unwrap();
    let mut child = Process::new(&wrapper)
        .args(["-machine", "none", "-nodefaults", "-display", "none", "-S"])
        .args(["-qmp", "stdio"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut greeting = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.as_mut().unwrap()),
        &mut greeting,
    )
    .unwrap();
    assert!(greeting.contains("\"QMP\""), "no QMP greeting: {greeting}");
    // the process the wrapper started as is QEMU now (exec, not a child)
    let exe = std::fs::read_link(format!("/proc/{}/exe", child.id())).unwrap();
    assert_eq!(exe, std::fs::canonicalize(&qemu).unwrap());
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"{\"execute\":\"qmp_capabilities\"}\n{\"execute\":\"quit\"}\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let direct = Process::new(&qemu)
        .args(["-nodefaults", "-no-such-option"])
        .output()
        .unwrap();
    let wrapped = Process::new(&wrapper)
        .args(["-nodefaults", "-no-such-option"])
        .output()
        .unwrap();
    assert_eq!(direct.status.code(), Some(1));
    assert_eq!(wrapped.status.code(), direct.status.code());
    assert!(String::from_utf8_lossy(&wrapped.stderr).contains("-no-such-option: invalid option"));
}

/// The cliques qemu-wrap adds reach QEMU 7.2 in both -device syntaxes and QEMU accepts
/// them: it gets as far as opening the (absent) host device.
#[test]
fn qemu_wrap_cliques_reach_qemu() {
    let Some(qemu) = real_qemu() else { return };
    let json =
        |bdf: &str, id: &str| format!(r#"{{"driver":"vfio-pci","host":"{bdf}","id":"{id}"}}"#);
    for (gpu0, gpu1, echoed) in [
        (
            json("0000:05:00.0", "gpu0"),
            json("0000:06:00.0", "gpu1"),
            r#"-device {"driver":"vfio-pci","host":"0000:05:00.0","id":"gpu0","x-nv-gpudirect-clique":0}: vfio "#,
        ),
        (
            "vfio-pci,host=0000:05:00.0,id=gpu0".to_string(),
            "vfio-pci,host=0000:06:00.0,id=gpu1".to_string(),
            "-device vfio-pci,host=0000:05:00.0,id=gpu0,x-nv-gpudirect-clique=0: vfio ",
        ),
    ] {
        let out = crate::cli::vfio_p2p()
            .args(["--example", "dual-socket-pcie", "qemu-wrap", "--qemu"])
            .arg(&qemu)
            .args([
                "--",
                "-machine",
                "q35,accel=tcg",
                "-nodefaults",
                "-display",
                "none",
            ])
            .args(["-device", &gpu0, "-device", &gpu1])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(
            stderr
                .contains("vfio-p2p qemu-wrap: gpu1 (0000:06:00.0): added x-nv-gpudirect-clique=0"),
            "{stderr}"
        );
        // QEMU accepted the property and names the argument as it got it when it
        // fails to open the (absent) host device
        assert!(
            stderr.contains(echoed) && stderr.contains("no such host device"),
            "{stderr}"
        );
    }
}

/// The domain KubeVirt's onDefineDomain hook returns is one libvirt accepts.
#[test]
fn kubevirt_patched_domain_validates() {
    if !have("virt-xml-validate") {
        return;
    }
    let config = |f: &str| format!("{}/../configs/kubevirt/{f}", env!("CARGO_MANIFEST_DIR"));
    let vmi = std::fs::read_to_string(config("example-vmi.json")).unwrap();
    let domain = std::fs::read_to_string(config("example-domain.xml")).unwrap();
    let xml = vfio_p2p(
        &[
            "--example",
            "dual-socket-pcie",
            "kubevirt",
            "on-define-domain",
            "--vmi",
            &vmi,
            "--domain",
            &domain,
        ],
        None,
    );
    assert!(xml.contains("<qemu:device alias='ua-gpu-gpu1'>"));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubevirt.xml");
    std::fs::write(&path, xml).unwrap();
    validate(&path);
    validate(Path::new(&config("example-domain.xml")));
}

/// Issue 28: every `-device` spelling QEMU 7.2 starts with still starts after qemu-wrap
/// edits it — a trailing comma (not doubled into `,,`), bytes that are not UTF-8 (passed
/// byte for byte), a `sysfsdev=` path with a trailing slash, the `vfio-pci-nohotplug`
/// subclass — and a `-global` clique is kept and reported. QEMU gets as far as opening
/// the (absent) host device both with the original argv and the edited one.
#[test]
fn qemu_wrap_edits_are_what_qemu_accepts() {
    use std::ffi::OsString;
    use std::os::unix::ffi::OsStringExt;
    let Some(qemu) = real_qemu() else { return };
    let raw = |b: &[u8]| OsString::from_vec(b.to_vec());
    let gpu1 = "vfio-pci,host=0000:06:00.0,id=gpu1";
    let cases: [(&[u8], &[&str], &[u8]); 5] = [
        (
            b"vfio-pci,host=0000:05:00.0,id=gpu0,",
            &[],
            b"-device vfio-pci,host=0000:05:00.0,id=gpu0,x-nv-gpudirect-clique=0: vfio ",
        ),
        (
            b"vfio-pci,host=0000:05:00.0,id=gpu0,romfile=/r\xff\xfe.rom",
            &[],
            b"-device vfio-pci,host=0000:05:00.0,id=gpu0,romfile=/r\xff\xfe.rom,x-nv-gpudirect-clique=0: vfio ",
        ),
        (
            b"vfio-pci,sysfsdev=/sys/bus/pci/devices/0000:05:00.0/,id=gpu0",
            &[],
            b"-device vfio-pci,sysfsdev=/sys/bus/pci/devices/0000:05:00.0/,id=gpu0,x-nv-gpudirect-clique=0: vfio ",
        ),
        (
            b"vfio-pci-nohotplug,host=0000:05:00.0,id=gpu0",
            &[],
            b"-device vfio-pci-nohotplug,host=0000:05:00.0,id=gpu0,x-nv-gpudirect-clique=0: vfio ",
        ),
        (
            b"vfio-pci,host=0000:05:00.0,id=gpu0",
            &["-global", "vfio-pci.x-nv-gpudirect-clique=5"],
            b"-device vfio-pci,host=0000:05:00.0,id=gpu0: vfio ",
        ),
    ];
    let base = [
        "-machine",
        "q35,accel=tcg",
        "-nodefaults",
        "-display",
        "none",
    ];
    for (gpu0, extra, echoed) in cases {
        let shown = String::from_utf8_lossy(gpu0).into_owned();
        let mut argv: Vec<OsString> = base.iter().chain(extra).map(OsString::from).collect();
        argv.extend([raw(b"-device"), raw(gpu0), raw(b"-device"), gpu1.into()]);
        let direct = Process::new(&qemu).args(&argv).output().unwrap();
        let direct_err = String::from_utf8_lossy(&direct.stderr);
        assert!(
            direct_err.contains("no such host device"),
            "{shown}: QEMU itself: {direct_err}"
        );
        let out = crate::cli::vfio_p2p()
            .args(["--example", "dual-socket-pcie", "qemu-wrap", "--qemu"])
            .arg(&qemu)
            .arg("--")
            .args(&argv)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), direct.status.code(), "{shown}: {stderr}");
        assert!(
            out.stderr.windows(echoed.len()).any(|w| w == echoed)
                && stderr.contains("no such host device"),
            "{shown}: QEMU got {stderr}"
        );
        assert!(
            stderr.contains("gpu1 (0000:06:00.0): added x-nv-gpudirect-clique=0")
                || !extra.is_empty(),
            "{shown}: {stderr}"
        );
        if !extra.is_empty() {
            assert!(
                stderr.contains(
                    "0000:05:00.0 keeps x-nv-gpudirect-clique=5 as written (from -global vfio-pci.x-nv-gpudirect-clique); the plan says 0"
                ),
                "{shown}: {stderr}"
            );
        }
    }
}

/// Whether QEMU starts a q35 guest of `ram_gib` GiB on CPU model `cpu` at 40 bits with its
/// default 32 GiB 64-bit hole (the RAM is never touched: `reserve=off`, `-S`), or refuses it
/// ("phys-bits too low").
fn qemu_starts(cpu: &str, ram_gib: u64) -> bool {
    let args: Vec<String> = [
        "-machine",
        "q35,memory-backend=m",
        "-accel",
        "tcg",
        "-cpu",
        &format!("{cpu},phys-bits=40"),
        "-object",
        &format!("memory-backend-ram,id=m,size={ram_gib}G,reserve=off"),
        "-m",
        &format!("{ram_gib}G"),
        "-nodefaults",
        "-display",
        "none",
        "-S",
        "-monitor",
        "stdio",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let out = qemu_fed(30, &[], &args, b"quit\n");
    let err = String::from_utf8_lossy(&out.stderr);
    !err.contains("phys-bits too low")
}

/// The address-space model's largest RAM is where QEMU itself stops starting the guest, on an
/// AMD vCPU (RAM moved above 1 TiB at the HyperTransport range: 978 GiB) and an Intel one (990
/// GiB): QEMU takes the largest and refuses one GiB more.
#[test]
fn the_largest_ram_is_where_qemu_stops_starting_the_guest() {
    use vfio_p2p_decide::address_space::{plan, GuestVendor};
    if !have("qemu-system-x86_64") {
        return;
    }
    const GIB: u64 = 1 << 30;
    for (cpu, vendor) in [
        ("EPYC", GuestVendor::Amd),
        ("Skylake-Server", GuestVendor::Other),
    ] {
        let largest = plan(64 * GIB, 32 * GIB, 40, vendor).largest_ram / GIB;
        assert!(
            qemu_starts(cpu, largest),
            "{cpu}: QEMU refused {largest} GiB"
        );
        assert!(
            !qemu_starts(cpu, largest + 1),
            "{cpu}: QEMU took {} GiB",
            largest + 1
        );
    }
}
