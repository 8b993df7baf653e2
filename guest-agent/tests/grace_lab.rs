//! The aarch64 Grace lab run (tests/lab/grace/run, kept by tests/fixtures/grace/lab/record):
//! an aarch64 `virt` guest booted under TCG from gen's arguments, GPUs played by stand-ins
//! with real pxb-pcie, arm-smmuv3 and acpi-generic-initiator objects. Replayed here: the
//! guest's NUMA files, written back into a tree, are judged by today's agent as they were
//! in the guest (gen's expectation passes, the wrong one fails on the node it changed), and
//! the recorded reports and PCI tree say what the stage asserted.

use std::collections::BTreeSet;
use std::fs;
use std::path::Path;

use serde_json::Value;
use vfio_p2p_agent::{guest_numa, sysfs};
use vfio_p2p_contract::Expectation;

const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/grace/lab");
/// The gb200 run on Debian's 16-node arm64 kernel (tests/fixtures/grace/lab-gb200/record).
const GB200: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../tests/fixtures/grace/lab-gb200"
);

fn text(name: &str) -> String {
    text_in(DIR, name)
}

fn text_in(dir: &str, name: &str) -> String {
    fs::read_to_string(Path::new(dir).join(name)).unwrap_or_else(|e| panic!("{dir}/{name}: {e}"))
}

fn json(name: &str) -> Value {
    serde_json::from_str(&text(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn expectation(name: &str) -> Expectation {
    Expectation::from_json(&text(name)).unwrap()
}

/// `tree.txt`'s lines, `path<TAB>content`.
fn tree() -> Vec<(String, String)> {
    tree_in(DIR)
}

fn tree_in(dir: &str) -> Vec<(String, String)> {
    text_in(dir, "tree.txt")
        .lines()
        .filter_map(|l| l.split_once('\t'))
        .map(|(p, c)| (p.to_string(), c.to_string()))
        .collect()
}

/// The guest's node files written back below `root` as the kernel showed them.
fn node_tree(root: &Path) {
    node_tree_of(DIR, root)
}

fn node_tree_of(dir: &str, root: &Path) {
    for (path, content) in tree_in(dir) {
        if !path.starts_with("/sys/devices/system/node/") {
            continue;
        }
        let file = root.join(&path[1..]);
        fs::create_dir_all(file.parent().unwrap()).unwrap();
        fs::write(file, format!("{content}\n")).unwrap();
    }
}

#[test]
fn the_stage_passed_and_its_guest_was_aarch64() {
    assert!(
        text("result.txt").starts_with("GRACE-STAGE PASS"),
        "{}",
        text("result.txt")
    );
    assert!(text("console.txt").contains(" aarch64, up "));
    assert!(text("qemu-version.txt").starts_with("QEMU emulator version"));
}

#[test]
fn todays_agent_judges_the_recorded_nodes_as_the_guest_did() {
    let t = tempfile::tempdir().unwrap();
    node_tree(t.path());
    let found = sysfs::numa::scan(t.path());
    let right = expectation("expect.json");
    let report = guest_numa::judge(right.numa.as_ref().unwrap(), &right.gpus, found.clone());
    assert_eq!(report.problems, Vec::<String>::new());
    // the record's own judgement saw the same nodes
    let recorded: sysfs::numa::NumaScan =
        serde_json::from_value(json("expect-report.json")["numa"]["found"].clone()).unwrap();
    assert_eq!(recorded, found);
    // every GPU node: no CPU, no memory, a generic initiator
    let gi = found.generic_initiators.clone().unwrap();
    for g in &right.gpus {
        assert!(
            !g.numa_nodes.is_empty(),
            "{} has no nodes planned",
            g.guest_bdf
        );
        for n in &g.numa_nodes {
            let node = found.node(*n).unwrap();
            assert_eq!((node.cpulist.as_str(), node.mem_total_kib), ("", Some(0)));
            assert!(gi.contains(n), "node {n} has no generic initiator");
        }
    }
    let wrong = expectation("wrong.json");
    let report = guest_numa::judge(wrong.numa.as_ref().unwrap(), &wrong.gpus, found);
    assert_eq!(report.problems.len(), 1, "{:?}", report.problems);
    assert!(
        report.problems[0].starts_with("node 1 "),
        "{:?}",
        report.problems
    );
}

#[test]
fn expect_passed_on_gens_expectation_and_failed_on_the_wrong_one() {
    assert_eq!(text("expect-report.json.rc").trim(), "0");
    assert_eq!(text("wrong-report.json.rc").trim(), "1");
    let right = json("expect-report.json");
    assert!(
        right["gpus"]
            .as_array()
            .unwrap()
            .iter()
            .all(|g| g["status"] == "ok"),
        "{right}"
    );
    let wrong = json("wrong-report.json");
    let problems = wrong["numa"]["problems"].as_array().unwrap();
    assert_eq!(problems.len(), 1, "{wrong}");
    assert!(
        problems[0].as_str().unwrap().starts_with("node 1 "),
        "{wrong}"
    );
}

#[test]
fn each_gpu_is_at_its_planned_address_behind_its_own_vsmmu() {
    let e = expectation("expect.json");
    let tree = tree();
    let get = |p: String| tree.iter().find(|(k, _)| *k == p).map(|(_, v)| v.clone());
    let scan = json("scan.json");
    let mut smmus = BTreeSet::new();
    for g in &e.gpus {
        let dev = format!("/sys/bus/pci/devices/{}", g.guest_bdf);
        // a stand-in (bochs-display, class 0x038000) at the planned address, shown to the
        // agent as the planned part by init.sh's overlay
        assert!(text("console.txt").contains(&format!(
            "GRACE: stand-in {} shown as 10de:{:04x}",
            g.guest_bdf, g.device.0
        )));
        assert_eq!(
            get(format!("{dev}/class")).as_deref(),
            Some("0x038000"),
            "{dev}"
        );
        assert!(scan["gpus"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["bdf"] == g.guest_bdf.to_string()));
        smmus.insert(get(format!("{dev}/iommu")).unwrap_or_else(|| panic!("{dev} has no iommu")));
    }
    let argv: Vec<String> = serde_json::from_value(json("argv-run.json")).unwrap();
    let vsmmus = argv.iter().filter(|a| a.contains("arm-smmuv3")).count();
    assert_eq!(smmus.len(), vsmmus.min(e.gpus.len()), "{smmus:?}");
    assert!(smmus.iter().all(|s| s.contains("arm-smmu-v3")), "{smmus:?}");
}

#[test]
fn a_16_node_guest_kernel_fails_gb200_naming_the_gpus_without_their_nodes() {
    assert!(text_in(GB200, "dmesg.txt").contains("SRAT: Too many proximity domains"));
    assert_eq!(text_in(GB200, "expect-report.json.rc").trim(), "1");
    let t = tempfile::tempdir().unwrap();
    node_tree_of(GB200, t.path());
    let found = sysfs::numa::scan(t.path());
    assert_eq!(found.nodes.len(), 16);
    let e = Expectation::from_json(&text_in(GB200, "expect.json")).unwrap();
    assert_eq!(e.numa.as_ref().unwrap().nodes, 34);
    let report = guest_numa::judge(e.numa.as_ref().unwrap(), &e.gpus, found);
    assert!(
        report.problems[0].contains("planned 0..34"),
        "{:?}",
        report.problems
    );
    // nodes 16..34 are missing: each one's GPU is named
    let missing: Vec<&String> = report
        .problems
        .iter()
        .filter(|p| p.contains("is not in this guest"))
        .collect();
    assert_eq!(missing.len(), 18, "{:?}", report.problems);
    for g in e
        .gpus
        .iter()
        .filter(|g| g.numa_nodes.iter().any(|n| *n >= 16))
    {
        let who = format!("GPU {} (host {})", g.guest_bdf, g.host_bdf);
        assert!(
            missing.iter().any(|p| p.starts_with(&who)),
            "{who}: {missing:?}"
        );
    }
}
