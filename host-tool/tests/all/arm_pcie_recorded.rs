//! gen's guest for an aarch64 host with plain PCIe GPUs (`--example altra-pcie`) as Debian
//! sid's libvirt 12.8 and QEMU 11.1 took it (tests/fixtures/arm-pcie, kept by its `record`
//! script): today's gen must still write the recorded domain and command line, which libvirt
//! validated and turned into an aarch64 `virt` QEMU line with each GPU's clique, and whose
//! machine QEMU started under TCG (stand-ins with 128 GiB BARs at the GPUs' places) while
//! AAVMF numbered the buses the guest agent is told to expect and put every switch port's
//! window in the 2 TiB high window.

use std::collections::BTreeMap;

fn read(name: &str) -> String {
    let path = format!(
        "{}/../tests/fixtures/arm-pcie/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The vm.yaml the record script generates `altra-pcie.argv` with.
const VM_YAML: &str = "name: vm0\nmemory_mib: 2048\nvcpus: 2\n";
const TIB: u64 = 1 << 40;

fn gen(args: &[&str]) -> String {
    let out = crate::cli::vfio_p2p()
        .args(["--example", "altra-pcie", "gen"])
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "{args:?}");
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn todays_gen_writes_the_recorded_domain_and_command_line() {
    let stale = "gen's output changed; run tests/fixtures/arm-pcie/record";
    let xml = gen(&["libvirt", "--libvirt-version", "12.8"]);
    assert_eq!(xml, read("altra-pcie-12.8.xml"), "{stale}");
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("vm.yaml");
    std::fs::write(&cfg, VM_YAML).unwrap();
    let argv = gen(&[
        "qemu",
        "--format",
        "argv",
        "--config",
        cfg.to_str().unwrap(),
    ]);
    assert_eq!(argv, read("altra-pcie.argv"), "{stale}");
}

#[test]
fn sids_libvirt_validates_the_domain_and_writes_an_aarch64_virt_line() {
    let versions = read("versions.txt");
    assert!(versions.contains("12.8.0") && versions.contains("QEMU emulator version 11.1"));
    let validate = read("altra-pcie-12.8.validate");
    assert!(
        validate.contains("validates") && validate.ends_with("exit 0\n"),
        "{validate}"
    );
    let native = read("altra-pcie-12.8.native");
    assert!(native.trim_end().ends_with("exit 0"), "{native}");
    assert!(native.contains("/usr/bin/qemu-system-aarch64"));
    let machine = native
        .lines()
        .find(|l| l.starts_with("-machine virt"))
        .unwrap();
    assert!(machine.contains("gic-version=3"), "{machine}");
    assert!(!machine.contains("iommu=smmuv3"), "{machine}");
    assert!(native.contains("-machine highmem-mmio-size=2048G"));
    for (gpu, clique) in [(0, 0), (1, 0), (2, 1), (3, 1)] {
        let line = native
            .lines()
            .find(|l| l.contains(&format!("\"id\":\"ua-gpu{gpu}\"")))
            .unwrap();
        assert!(line.contains("\"driver\":\"vfio-pci\""), "{line}");
        assert!(
            line.contains(&format!("\"x-nv-gpudirect-clique\":{clique}")),
            "{line}"
        );
    }
    assert_eq!(native.matches("\"driver\":\"x3130-upstream\"").count(), 2);
    assert!(!native.contains("acpi-generic-initiator") && !native.contains("arm-smmuv3"));
}

/// Each device of `info pci` by its QEMU id: its bus and its bridge window, if any.
fn devices(info: &str) -> BTreeMap<String, (u32, Option<(u64, u64)>)> {
    let mut out = BTreeMap::new();
    let (mut bus, mut window) = (None, None);
    for l in info.lines().map(str::trim) {
        if let Some(rest) = l.strip_prefix("Bus ") {
            bus = rest.split(',').next().and_then(|b| b.trim().parse().ok());
            window = None;
        } else if let Some(r) = l.strip_prefix("prefetchable memory range [") {
            let (a, b) = r.trim_end_matches(']').split_once(", ").unwrap();
            let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).unwrap();
            window = Some((hex(a), hex(b)));
        } else if let Some(id) = l.strip_prefix("id \"") {
            out.insert(id.trim_end_matches('"').to_string(), (bus.unwrap(), window));
        }
    }
    out
}

#[test]
fn qemu_started_the_machine_and_aavmf_numbered_the_expected_buses() {
    let info = read("altra-pcie.info-pci");
    assert!(info.trim_end().ends_with("exit 0"), "{info}");
    let devices = devices(&info);
    // the buses the guest agent is told to expect (the expectation in the recorded argv)
    let argv = read("altra-pcie.argv");
    let fw_cfg = argv.lines().find(|l| l.contains("expect.json")).unwrap();
    let json = fw_cfg.split_once("string=").unwrap().1.replace(",,", ",");
    let e: serde_json::Value = serde_json::from_str(&json).unwrap();
    for (k, g) in e["gpus"].as_array().unwrap().iter().enumerate() {
        let guest: pci_config::Bdf = g["guest_bdf"].as_str().unwrap().parse().unwrap();
        let (bus, _) = devices[&format!("gpu{k}")];
        assert_eq!(bus, u32::from(guest.bus), "gpu{k}: {info}");
    }
    // every downstream port's window holds its stand-in's 128 GiB, inside virt's high
    // window of highmem-mmio-size=2048G, which QEMU placed at 2 TiB (aligned to its size)
    for ds in ["ds0", "ds1", "ds2", "ds3"] {
        let (_, window) = devices[ds];
        let (start, end) = window.unwrap_or_else(|| panic!("{ds} has no window: {info}"));
        assert!(end - start + 1 >= 128 << 30, "{ds}: {start:#x}..{end:#x}");
        assert!(
            start >= 2 * TIB && end < 4 * TIB,
            "{ds}: {start:#x}..{end:#x}"
        );
    }
}
