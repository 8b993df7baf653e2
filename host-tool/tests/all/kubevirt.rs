//! `kubevirt on-define-domain` as KubeVirt's sidecar shim runs it: the example VMI and
//! domain of configs/kubevirt (golden), and a pod that cannot see the node's devices.

fn example(name: &str) -> String {
    std::fs::read_to_string(format!(
        "{}/../configs/kubevirt/{name}",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap()
}

/// (exit code, stdout, stderr) of the hook with `global` options first.
fn on_define_domain(global: &[&str], extra: &[&str]) -> (i32, String, String) {
    let out = crate::cli::vfio_p2p()
        .args(global)
        .args(["kubevirt", "on-define-domain", "--vmi"])
        .arg(example("example-vmi.json"))
        .arg("--domain")
        .arg(example("example-domain.xml"))
        .args(extra)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

#[test]
fn cliques_on_kubevirt_aliases_golden() {
    let (code, xml, log) = on_define_domain(&["--example", "dual-socket-pcie"], &[]);
    assert_eq!(code, 0, "{log}");
    assert!(log.contains("vfio-p2p kubevirt: ml/train0: ua-gpu-gpu3 (0000:09:00.0): clique 0"));
    // only the override is new: the rest of virt-launcher's domain is byte for byte
    let original = example("example-domain.xml");
    let end = original.rfind("</domain>").unwrap();
    assert!(xml.starts_with(&original[..end]));
    insta::assert_snapshot!("kubevirt-dual-socket-pcie", xml);
}

#[test]
fn pod_without_the_nodes_devices_says_so() {
    let empty = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(empty.path().join("sys/bus/pci/devices")).unwrap();
    let root = empty.path().to_str().unwrap();
    let (code, xml, log) = on_define_domain(&["--sysfs-root", root], &[]);
    assert_eq!(code, 0, "{log}");
    assert_eq!(
        xml,
        example("example-domain.xml"),
        "warn: the domain as it was"
    );
    assert!(
        log.contains("cannot see the node's PCI devices 0000:05:00.0 (ua-gpu-gpu1), 0000:06:00.0 (ua-gpu-gpu2), 0000:09:00.0 (ua-gpu-gpu3)")
            && log.contains("(hook_policy: warn)"),
        "{log}"
    );
    let deny = empty.path().join("host.yaml");
    std::fs::write(&deny, "hook_policy: deny\n").unwrap();
    let (code, xml, log) = on_define_domain(
        &["--sysfs-root", root],
        &["--host-config", deny.to_str().unwrap()],
    );
    assert_eq!((code, xml.as_str()), (2, ""));
    assert!(
        log.contains("the VMI does not start (hook_policy: deny)"),
        "{log}"
    );
}

/// tests/fixtures/kubevirt: KubeVirt's own sidecar shim (built from its source) ran this hook
/// from the configmap's script, called by KubeVirt's hook manager as virt-launcher calls it
/// (v1alpha2 `OnDefineDomain`). Today's hook, given what the manager sent, returns the
/// domain the shim returned then.
#[test]
fn kubevirt_shim_recording_replays() {
    let fixture = |f: &str| {
        std::fs::read_to_string(format!(
            "{}/../tests/fixtures/kubevirt/{f}",
            env!("CARGO_MANIFEST_DIR")
        ))
        .unwrap()
    };
    let transcript = fixture("transcript.txt");
    assert!(
        transcript.contains("exit 0") && transcript.contains("Executing onDefineDomain"),
        "{transcript}"
    );
    let out = crate::cli::vfio_p2p()
        .args([
            "--example",
            "dual-socket-pcie",
            "kubevirt",
            "on-define-domain",
        ])
        .arg("--vmi")
        .arg(fixture("sent-vmi.json"))
        .arg("--domain")
        .arg(fixture("sent-domain.xml"))
        .output()
        .unwrap();
    let log = String::from_utf8(out.stderr).unwrap();
    assert!(out.status.success(), "{log}");
    // what KubeVirt's DomainSpec marshalling sends has no xmlns:qemu: the hook declares it
    assert!(!fixture("sent-domain.xml").contains("xmlns:qemu"));
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        fixture("returned-domain.xml"),
        "the hook's answer changed since the shim returned it: record again (tests/fixtures/kubevirt/record)"
    );
    for line in log.lines().filter(|l| l.starts_with("vfio-p2p kubevirt:")) {
        assert!(transcript.contains(line), "not in the shim's log: {line}");
    }
    // the plan's warnings say whose they are in the sidecar's log (issue 40)
    let warnings: Vec<&str> = log.lines().filter(|l| l.starts_with("warning:")).collect();
    assert!(!warnings.is_empty(), "{log}");
    for w in warnings {
        assert!(w.starts_with("warning: kubevirt: "), "{w}");
    }
}

/// Issue 28: a `--vmi` or `--domain` that is not UTF-8 reaches the hook policy instead of
/// stopping the argument parser (exit 2, no word): under warn the domain comes back byte
/// for byte with a warning, under deny the hook refuses and says why.
#[test]
fn arguments_that_are_not_utf8_follow_the_policy() {
    use std::ffi::OsString;
    use std::os::unix::ffi::OsStringExt;
    let vmi = example("example-vmi.json");
    let domain = example("example-domain.xml");
    let mut bad_vmi = vmi.clone().into_bytes();
    bad_vmi.insert(1, 0xff);
    let mut bad_domain = domain.clone().into_bytes();
    bad_domain.insert(domain.find("</name>").unwrap(), 0xfe);
    let dir = tempfile::tempdir().unwrap();
    let deny = dir.path().join("host.yaml");
    std::fs::write(&deny, "hook_policy: deny\n").unwrap();
    for (v, d, what) in [
        (
            bad_vmi.clone(),
            domain.clone().into_bytes(),
            "--vmi is not UTF-8",
        ),
        (
            vmi.clone().into_bytes(),
            bad_domain.clone(),
            "--domain is not UTF-8",
        ),
    ] {
        let run = |extra: &[&str]| {
            crate::cli::vfio_p2p()
                .args([
                    "--example",
                    "dual-socket-pcie",
                    "kubevirt",
                    "on-define-domain",
                ])
                .arg("--vmi")
                .arg(OsString::from_vec(v.clone()))
                .arg("--domain")
                .arg(OsString::from_vec(d.clone()))
                .args(extra)
                .output()
                .unwrap()
        };
        let out = run(&[]);
        let log = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{what}: {log}");
        assert_eq!(out.stdout, d, "{what}: the domain as it was");
        assert!(
            log.contains(what) && log.contains("(hook_policy: warn)"),
            "{log}"
        );
        let out = run(&["--host-config", deny.to_str().unwrap()]);
        let log = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{what}: {log}");
        assert!(out.stdout.is_empty());
        assert!(
            log.contains(what) && log.contains("(hook_policy: deny)"),
            "{log}"
        );
    }
}
