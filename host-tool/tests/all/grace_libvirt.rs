//! gen's Grace domains as Debian sid's libvirt 12.8 and QEMU 11.1 took them
//! (tests/fixtures/grace/libvirt, kept by its `record` script): today's `gen libvirt` must
//! still write the recorded domains, which libvirt validated and turned into a QEMU command
//! line with every GPU's eight generic initiators — from `<acpi nodeset>` on 12.8, from
//! `<qemu:commandline>` on 11.3 — and, on 12.8, an `arm-smmuv3` per physical SMMU on its
//! expander bus (`<driver pciBus>`), one for the machine on 11.3.

use std::collections::BTreeSet;

fn read(name: &str) -> String {
    let path = format!(
        "{}/../tests/fixtures/grace/libvirt/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

const RUNS: [(&str, &str, usize); 4] = [
    ("gh200", "12.8", 1),
    ("gh200", "11.3", 1),
    ("gb200", "12.8", 4),
    ("gb200", "11.3", 4),
];

#[test]
fn todays_gen_writes_the_recorded_domains() {
    for (example, version, _) in RUNS {
        let out = crate::cli::vfio_p2p()
            .args([
                "--example",
                example,
                "gen",
                "libvirt",
                "--libvirt-version",
                version,
            ])
            .output()
            .unwrap();
        assert!(out.status.success(), "{example} {version}");
        assert_eq!(
            String::from_utf8(out.stdout).unwrap(),
            read(&format!("{example}-{version}.xml")),
            "{example} {version}: gen's domain changed; run tests/fixtures/grace/libvirt/record"
        );
    }
}

/// The `node` of each `acpi-generic-initiator` in libvirt's argv (both argument syntaxes).
fn initiator_nodes(native: &str) -> Vec<u32> {
    native
        .lines()
        .filter(|l| l.contains("acpi-generic-initiator"))
        .map(|l| {
            let at = l.find("node").unwrap() + 4;
            let digits: String = l[at..]
                .chars()
                .skip_while(|c| !c.is_ascii_digit())
                .take_while(char::is_ascii_digit)
                .collect();
            digits.parse().unwrap()
        })
        .collect()
}

#[test]
fn sids_libvirt_validates_each_domain_and_writes_every_generic_initiator() {
    let versions = read("versions.txt");
    assert!(versions.contains("12.8.0") && versions.contains("QEMU emulator version 11.1"));
    for (example, version, gpus) in RUNS {
        let name = format!("{example}-{version}");
        let validate = read(&format!("{name}.validate"));
        assert!(
            validate.contains("validates") && validate.ends_with("exit 0\n"),
            "{name}: {validate}"
        );
        let native = read(&format!("{name}.native"));
        assert!(native.trim_end().ends_with("exit 0"), "{name}: {native}");
        assert!(native.contains("/usr/bin/qemu-system-aarch64"), "{name}");
        let machine = native
            .lines()
            .find(|l| l.starts_with("-machine virt"))
            .unwrap();
        assert!(machine.contains("gic-version=3"), "{machine}");
        // 11.10+: an arm-smmuv3 per physical SMMU on its expander bus (gh200 1, gb200 4, one
        // per GPU); before: one SMMUv3 for the machine
        let per_bus = native
            .matches("\"driver\":\"arm-smmuv3\",\"primary-bus\":\"pci.")
            .count();
        let machine_wide = machine.contains("iommu=smmuv3");
        match version {
            "12.8" => assert_eq!((per_bus, machine_wide), (gpus, false), "{name}"),
            _ => assert_eq!((per_bus, machine_wide), (0, true), "{name}"),
        }
        assert_eq!(
            native.matches("\"driver\":\"vfio-pci\"").count(),
            gpus,
            "{name}"
        );
        // 8 distinct guest nodes per GPU, after the CPU nodes
        let nodes = initiator_nodes(&native);
        let distinct: BTreeSet<u32> = nodes.iter().copied().collect();
        assert_eq!(
            (nodes.len(), distinct.len()),
            (8 * gpus, 8 * gpus),
            "{name}: {nodes:?}"
        );
        assert!(!distinct.contains(&0), "{name}: node 0 is a CPU node");
        // 12.8 writes them itself (JSON objects); 11.3 takes ours from <qemu:commandline>
        let from_libvirt = native.contains("\"qom-type\":\"acpi-generic-initiator\"");
        assert_eq!(from_libvirt, version == "12.8", "{name}");
    }
}
