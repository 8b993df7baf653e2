//! `libvirt patch` and `check --domain-xml` agree (issue 29): the patch adds the 64-bit MMIO
//! window the GPUs need, so that check then passes `mmio-window`; a clique set in any form
//! the patch writes is replaced, never added twice; check flags a device with two cliques;
//! and every fix check prints is in the language of the definition it is about.

const EXISTING: &str = include_str!("../../../tests/fixtures/libvirt/existing-domain.xml");

/// `vfio-p2p --example dual-socket-pcie ARGS` with `stdin`: (exit code, stdout).
fn run(args: &[&str], stdin: &str) -> (i32, String) {
    let out = crate::cli::vfio_p2p()
        .env("COLUMNS", "200")
        .args(["--example", "dual-socket-pcie"])
        .args(args)
        .write_stdin(stdin)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

fn patch(xml: &str, version: &str) -> String {
    let (code, out) = run(
        &["libvirt", "patch", "--libvirt-version", version, "-"],
        xml,
    );
    assert_eq!(code, 0, "{out}");
    out
}

/// `check --domain-xml` on `xml`: every check as (check, status, saw, fix).
fn check(xml: &str) -> Vec<(String, String, String, String)> {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("train-01.xml");
    std::fs::write(&file, xml).unwrap();
    let (_, out) = run(
        &[
            "check",
            "--domain-xml",
            file.to_str().unwrap(),
            "--format",
            "json",
        ],
        "",
    );
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let s = |k: &str| c[k].as_str().unwrap_or_default().to_string();
            (s("check"), s("status"), s("saw"), s("fix"))
        })
        .collect()
}

fn status_of(checks: &[(String, String, String, String)], name: &str) -> Vec<String> {
    checks
        .iter()
        .filter(|c| c.0 == name)
        .map(|c| c.1.clone())
        .collect()
}

#[test]
fn patch_adds_the_window_and_check_then_passes_it() {
    let before = check(EXISTING);
    assert_eq!(status_of(&before, "mmio-window"), ["fail"]);
    let once = patch(EXISTING, "9.0");
    // 3 GPUs with 64 GiB BARs: 3 × 128 GiB slots + 32 GiB = 416 GiB, in a root controller
    // the domain did not have
    assert!(
        once.contains("    <controller type='pci' index='0' model='pcie-root'>\n      <pcihole64 unit='KiB'>436207616</pcihole64>\n    </controller>\n  </devices>"),
        "{once}"
    );
    assert_eq!(status_of(&check(&once), "mmio-window"), ["pass"]);
    assert_eq!(patch(&once, "9.0"), once, "patching twice changes nothing");
}

#[test]
fn patch_raises_a_smaller_window_where_it_is_set() {
    let root = |inner: &str| {
        EXISTING.replace(
            "    <memballoon model=\"none\"/>",
            &format!("    {inner}\n    <memballoon model=\"none\"/>"),
        )
    };
    // self-closing root controller
    let xml = patch(
        &root("<controller type='pci' index='0' model='pcie-root'/>"),
        "9.0",
    );
    assert!(
        xml.contains("<controller type='pci' index='0' model='pcie-root'>\n      <pcihole64 unit='KiB'>436207616</pcihole64>\n    </controller>"),
        "{xml}"
    );
    // a smaller <pcihole64> is raised in place, whatever its unit
    let small = root("<controller type='pci' index='0' model='pcie-root'><pcihole64 unit='GiB'>64</pcihole64></controller>");
    let xml = patch(&small, "9.0");
    assert!(
        xml.contains("<controller type='pci' index='0' model='pcie-root'><pcihole64 unit='KiB'>436207616</pcihole64></controller>"),
        "{xml}"
    );
    assert_eq!(xml.matches("<pcihole64").count(), 1, "{xml}");
    // a big enough one is left alone
    let big = root("<controller type='pci' index='0' model='pcie-root'><pcihole64 unit='GiB'>1024</pcihole64></controller>");
    assert!(patch(&big, "9.0").contains("<pcihole64 unit='GiB'>1024</pcihole64>"));
    // set by a QEMU argument: that argument is raised, no <pcihole64> added
    let arg = EXISTING
        .replace("<domain type=\"kvm\">", "<domain type=\"kvm\" xmlns:qemu='http://libvirt.org/schemas/domain/qemu/1.0'>")
        .replace("</domain>", "  <qemu:commandline>\n    <qemu:arg value='-global'/>\n    <qemu:arg value='q35-pcihost.pci-hole64-size=64G'/>\n  </qemu:commandline>\n</domain>");
    let xml = patch(&arg, "9.0");
    assert!(
        xml.contains("<qemu:arg value='q35-pcihost.pci-hole64-size=416G'/>"),
        "{xml}"
    );
    assert!(!xml.contains("<pcihole64"), "{xml}");
    assert_eq!(status_of(&check(&xml), "mmio-window"), ["pass"]);
}

/// Issue 29's case: a domain patched for libvirt 8.0 (`-set`), its clique edited by hand,
/// patched again for 9.0, must end with one setting per GPU, the planned one.
#[test]
fn repatching_the_set_form_replaces_the_clique() {
    let old = patch(EXISTING, "8.0").replace("clique=0", "clique=3");
    assert_eq!(old.matches("-nv-gpudirect-clique=3").count(), 2, "{old}");
    for version in ["9.0", "8.0"] {
        let again = patch(&old, version);
        for alias in ["ua-gpu-0000-05-00-0", "ua-second"] {
            let set = again
                .matches(&format!("device.{alias}.x-nv-gpudirect-clique="))
                .count();
            let overridden = again
                .matches(&format!("<qemu:device alias='{alias}'>"))
                .count();
            assert_eq!(set + overridden, 1, "{alias} under {version}: {again}");
            assert!(
                again.contains(&format!("device.{alias}.x-nv-gpudirect-clique=0'/>")),
                "{again}"
            );
        }
        assert!(!again.contains("clique=3"), "{again}");
        let checks = check(&again);
        assert!(
            !checks
                .iter()
                .any(|c| c.0.starts_with("clique") && c.1 != "pass"),
            "{checks:?}"
        );
    }
}

/// Both forms at once (what earlier versions left): 9.0 keeps the override and drops the
/// `-set` pair; check, before, says the device has two cliques.
#[test]
fn two_cliques_for_one_device_are_flagged_and_patched_away() {
    let both = patch(EXISTING, "8.0")
        .replace("clique=0", "clique=3")
        .replace(
            "</domain>",
            "  <qemu:override>\n    <qemu:device alias='ua-second'>\n      <qemu:frontend>\n        <qemu:property name='x-nv-gpudirect-clique' type='unsigned' value='0'/>\n      </qemu:frontend>\n    </qemu:device>\n  </qemu:override>\n</domain>",
        );
    let checks = check(&both);
    let flagged: Vec<_> = checks.iter().filter(|c| c.0 == "clique-setting").collect();
    assert_eq!(flagged.len(), 1, "{checks:?}");
    assert_eq!(flagged[0].1, "fail");
    assert!(
        flagged[0].2.contains("2 times, to different cliques"),
        "{flagged:?}"
    );
    assert!(
        flagged[0].3.contains("vfio-p2p libvirt patch") && flagged[0].3.contains("train-01.xml"),
        "{flagged:?}"
    );
    let fixed = patch(&both, "9.0");
    assert!(!fixed.contains("device.ua-second.x-nv"), "{fixed}");
    assert!(
        fixed.contains("device.ua-gpu-0000-05-00-0.x-nv-gpudirect-clique=0"),
        "{fixed}"
    );
    assert!(
        !check(&fixed)
            .iter()
            .any(|c| c.0.starts_with("clique") && c.1 != "pass"),
        "{fixed}"
    );
}

/// Every fix of `check` is in the language of the definition it is about.
#[test]
fn fixes_speak_the_language_of_the_input() {
    let libvirt = check(EXISTING);
    let fix = &libvirt.iter().find(|c| c.0 == "mmio-window").unwrap().3;
    assert!(
        fix.contains("<pcihole64 unit='KiB'>436207616</pcihole64>"),
        "{fix}"
    );
    assert!(!fix.contains("-global"), "{fix}");
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("101.conf");
    std::fs::write(
        &conf,
        "machine: q35\nhostpci0: 0000:05:00.0,pcie=1\nhostpci1: 0000:06:00.0,pcie=1\n",
    )
    .unwrap();
    let (_, out) = run(
        &[
            "check",
            "--proxmox-conf",
            conf.to_str().unwrap(),
            "--format",
            "json",
        ],
        "",
    );
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let fixes: Vec<&str> = v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["fix"].as_str())
        .collect();
    let window = fixes.iter().find(|f| f.contains("pci-hole64")).unwrap();
    assert!(window.contains("`args:` line"), "{window}");
    let cliques = fixes.iter().find(|f| f.contains("gen proxmox")).unwrap();
    assert!(
        cliques.contains("--gpus 0000:05:00.0,0000:06:00.0`") && !cliques.contains('…'),
        "{cliques}"
    );
}

/// A fix that several rows share is printed once, under one number.
#[test]
fn check_prints_each_fix_once() {
    let (_, out) = run(&["check"], "");
    let fixes: Vec<&str> = out
        .lines()
        .filter_map(|l| l.strip_prefix("fix ["))
        .map(|l| l.split_once("]: ").unwrap().1)
        .collect();
    let mut distinct = fixes.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(fixes.len(), distinct.len(), "{out}");
    assert!(out.matches("on the host itself").count() == 1, "{out}");
}

/// `vfio-p2p --example EXAMPLE ARGS` with `stdin`: (exit code, stdout, stderr).
fn run_on(example: &str, args: &[&str], stdin: &str) -> (i32, String, String) {
    let out = crate::cli::vfio_p2p()
        .env("COLUMNS", "200")
        .args(["--example", example])
        .args(args)
        .write_stdin(stdin)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `gen libvirt`'s Grace domain for `example`, then `libvirt patch` of `xml` on it.
fn grace_domain(example: &str) -> String {
    let (code, xml, err) = run_on(
        example,
        &["gen", "libvirt", "--libvirt-version", "12.8"],
        "",
    );
    assert_eq!(code, 0, "{err}");
    xml
}

fn grace_patch(example: &str, xml: &str) -> (String, String) {
    let args = ["libvirt", "patch", "--libvirt-version", "12.8", "-"];
    let (code, out, err) = run_on(example, &args, xml);
    assert_eq!(code, 0, "{err}");
    (out, err)
}

/// The `mmio-window` rows of `check --domain-xml` on `xml` for `example`: (status, saw).
fn grace_window_check(example: &str, xml: &str) -> Vec<(String, String)> {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("grace.xml");
    std::fs::write(&file, xml).unwrap();
    let args = [
        "check",
        "--domain-xml",
        file.to_str().unwrap(),
        "--format",
        "json",
    ];
    let (_, out, _) = run_on(example, &args, "");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let rows = v["checks"].as_array().unwrap().iter();
    rows.filter(|c| c["check"] == "mmio-window")
        .map(|c| {
            (
                c["status"].as_str().unwrap().into(),
                c["saw"].as_str().unwrap().into(),
            )
        })
        .collect()
}

/// An aarch64 `virt` domain (gen's own Grace guest) is never given q35's `<pcihole64>`:
/// gh200's one GPU fits the 512 GiB window gen wrote, so the patch changes nothing.
#[test]
fn a_grace_domain_gets_no_pcihole64() {
    let gh200 = grace_domain("gh200");
    assert!(
        gh200.contains("<type arch='aarch64' machine='virt'>"),
        "{gh200}"
    );
    let (patched, err) = grace_patch("gh200", &gh200);
    assert!(!patched.contains("pcihole64"), "{patched}");
    assert_eq!(patched, gh200, "{err}");
    let rows = grace_window_check("gh200", &patched);
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].0, "pass", "{}", rows[0].1);
}

/// gb200's four GPUs need a 4 TiB high window: a domain without one gets
/// `-machine highmem-mmio-size=4096G` in `<qemu:commandline>` (as gen writes it), one set
/// smaller is raised where it is set, and check then passes `mmio-window`.
#[test]
fn a_grace_domain_gets_the_high_window_its_gpus_need() {
    let gb200 = grace_domain("gb200");
    let lines = "    <!-- libvirt has no element for virt's highmem-mmio-size -->\n    <qemu:arg value='-machine'/>\n    <qemu:arg value='highmem-mmio-size=4096G'/>\n";
    assert!(gb200.contains(lines), "{gb200}");
    let without = gb200.replace(lines, "");
    assert_eq!(grace_window_check("gb200", &without)[0].0, "fail");
    let (patched, err) = grace_patch("gb200", &without);
    assert!(!patched.contains("pcihole64"), "{patched}");
    assert!(
        patched.contains("<qemu:arg value='-machine'/>\n    <qemu:arg value='highmem-mmio-size=4096G'/>\n  </qemu:commandline>"),
        "{patched}"
    );
    assert!(
        err.contains("-machine highmem-mmio-size=4096G in <qemu:commandline>"),
        "{err}"
    );
    assert_eq!(grace_window_check("gb200", &patched)[0].0, "pass");
    assert_eq!(
        grace_patch("gb200", &patched).0,
        patched,
        "patching twice changes nothing"
    );

    let smaller = gb200.replace("highmem-mmio-size=4096G", "highmem-mmio-size=1024G");
    let (raised, _) = grace_patch("gb200", &smaller);
    assert_eq!(raised, gb200, "raised in its own argument, nothing added");
    assert_eq!(
        grace_patch("gb200", &gb200).0,
        gb200,
        "a big enough window is left alone"
    );
}
