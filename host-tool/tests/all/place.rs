//! `vfio-p2p place` end to end: the JSON contract, the example configs under
//! `configs/` (all loaded here), and the place → gen workflow.

use std::path::{Path, PathBuf};

use serde_json::Value;
use vfio_p2p_config::host::HostConfig;
use vfio_p2p_config::vm::VmConfig;

fn configs() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs")
}

fn vfio_p2p(args: &[&str]) -> std::process::Output {
    crate::cli::vfio_p2p().args(args).output().unwrap()
}

fn place_json(example: &str, args: &[&str]) -> Value {
    let mut all = vec!["--example", example, "place", "--format", "json"];
    all.extend(args);
    let out = vfio_p2p(&all);
    assert!(
        out.status.success(),
        "place {args:?} on {example}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Our yaml files below `dir`; configs/kubevirt holds Kubernetes manifests, not ours.
fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.ends_with("kubevirt") {
            continue;
        }
        if p.is_dir() {
            yaml_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "yaml") {
            out.push(p);
        }
    }
}

#[test]
fn every_config_file_loads() {
    let mut files = Vec::new();
    yaml_files(&configs(), &mut files);
    files.sort();
    let (mut hosts, mut vms) = (0, 0);
    for f in &files {
        if f.file_name().unwrap() == "host.yaml" {
            HostConfig::load(f).unwrap_or_else(|e| panic!("{e}"));
            hosts += 1;
        } else {
            VmConfig::load(f).unwrap_or_else(|e| panic!("{e}"));
            vms += 1;
        }
    }
    assert_eq!(hosts, 4, "configs/host.yaml and one per example host");
    assert!(vms >= 6, "{files:?}");
}

/// (example host, shape): `configs/examples/HOST/` holds the host.yaml used and the
/// vm.yaml files `place --write-configs` writes.
const EXAMPLES: [(&str, &str); 3] = [
    ("hgx-h100", "2x4"),
    ("dual-socket-pcie", "2x4"),
    ("flat-vm", "1x2"),
];

#[test]
fn written_vm_configs_match_the_examples_and_feed_gen() {
    for (example, shape) in EXAMPLES {
        let dir = configs().join("examples").join(example);
        let tmp = tempfile::tempdir().unwrap();
        // Created as `snapshot -o DIR` creates its directory.
        let out_dir = tmp.path().join("configs/new");
        let host = dir.join("host.yaml");
        let out = vfio_p2p(&[
            "--example",
            example,
            "place",
            "--shape",
            shape,
            "--host-config",
            host.to_str().unwrap(),
            "--write-configs",
            out_dir.to_str().unwrap(),
        ]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut written: Vec<PathBuf> = std::fs::read_dir(&out_dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        written.sort();
        let count: usize = shape.split('x').next().unwrap().parse().unwrap();
        assert_eq!(written.len(), count);
        for w in &written {
            let golden = dir.join(w.file_name().unwrap());
            assert_eq!(
                std::fs::read_to_string(w).unwrap(),
                std::fs::read_to_string(&golden).unwrap(),
                "{} differs from {}",
                w.display(),
                golden.display()
            );
            let gen = vfio_p2p(&[
                "--example",
                example,
                "gen",
                "qemu",
                "--config",
                w.to_str().unwrap(),
                "--libvirt-version",
                "9.0",
            ]);
            assert!(
                gen.status.success(),
                "gen on {}: {}",
                w.display(),
                String::from_utf8_lossy(&gen.stderr)
            );
        }
    }
}

#[test]
fn dual_socket_two_by_four_json_contract() {
    let v = place_json("dual-socket-pcie", &["--shape", "2x4"]);
    let vms = v["vms"].as_array().unwrap();
    assert_eq!(vms.len(), 2);
    assert_eq!(v["unplaced"], serde_json::json!([]));
    for (vm, socket) in vms.iter().zip([0x00, 0x80]) {
        let gpus: Vec<&str> = vm["gpus"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| g.as_str().unwrap())
            .collect();
        assert_eq!(gpus.len(), 4);
        for g in &gpus {
            let bus = u8::from_str_radix(&g[5..7], 16).unwrap();
            assert_eq!(
                bus & 0x80,
                socket,
                "{g} is not on the socket of {}",
                vm["name"]
            );
            assert!(vm["cliques"][*g].is_u64(), "{g} has no clique");
        }
        assert_eq!(vm["worst_path"], "PXB");
    }
    insta::assert_json_snapshot!("place-dual-socket-pcie-2x4", v);
}

#[test]
fn hgx_two_by_four_json_contract() {
    let v = place_json("hgx-h100", &["--shape", "2x4"]);
    for (vm, node) in v["vms"].as_array().unwrap().iter().zip([0, 1]) {
        assert_eq!(vm["worst_path"], "NV18");
        assert_eq!(vm["numa_nodes"], serde_json::json!([node]));
        for (_, clique) in vm["cliques"].as_object().unwrap() {
            assert!(clique.is_null(), "NVLink peers need no clique");
        }
    }
    insta::assert_json_snapshot!("place-hgx-h100-2x4", v);
}

#[test]
fn named_vms_taken_gpus_and_the_alternative() {
    let v = place_json(
        "dual-socket-pcie",
        &[
            "--vm",
            "big=4",
            "--vm",
            "small=2",
            "--taken",
            "0000:85:00.0",
        ],
    );
    assert_eq!(v["vms"][0]["name"], "big");
    assert_eq!(v["vms"][0]["worst_path"], "PXB");
    assert_eq!(v["vms"][1]["name"], "small");
    assert_eq!(v["vms"][1]["worst_path"], "PIX");
    let text = v.to_string();
    assert!(
        !text.contains("0000:85:00.0"),
        "a taken GPU was placed or listed free"
    );

    let out = vfio_p2p(&["--example", "dual-socket-pcie", "place", "--shape", "3x4"]);
    assert_eq!(out.status.code(), Some(2));
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        stdout.contains("vm2 (4 GPUs): not placed: needs 4 GPUs, 0 are free"),
        "{stdout}"
    );
    assert!(stdout.contains("largest shape that fits: 2x4"), "{stdout}");
}

/// Runs `--example hgx-h100 place ARGS`, which must fail; its stderr.
fn place_error(args: &[&str]) -> String {
    let mut all = vec!["--example", "hgx-h100", "place"];
    all.extend(args);
    let out = vfio_p2p(&all);
    assert!(!out.status.success(), "place {args:?} succeeded");
    String::from_utf8(out.stderr).unwrap()
}

#[test]
fn bad_input_is_refused_with_the_fix() {
    let err = place_error(&["--shape", "1x2", "--taken", "0000:aa:00.0"]);
    assert!(
        err.contains("0000:aa:00.0 is not a device of this host"),
        "{err}"
    );

    let dir = tempfile::tempdir().unwrap();
    let host = dir.path().join("host.yaml");
    std::fs::write(
        &host,
        "p2p_level: pxb\nreserved: [0000:18:00.0, 0000:18:00.0]\n",
    )
    .unwrap();
    let err = place_error(&["--shape", "1x2", "--host-config", host.to_str().unwrap()]);
    assert!(
        err.contains("host.yaml:2:") && err.contains("listed twice"),
        "{err}"
    );

    std::fs::write(dir.path().join("vm0.yaml"), "name: keep\n").unwrap();
    let err = place_error(&[
        "--shape",
        "2x2",
        "--write-configs",
        dir.path().to_str().unwrap(),
    ]);
    assert!(
        err.contains("vm0.yaml already exists") && err.contains("nothing was written"),
        "{err}"
    );
    assert!(!dir.path().join("vm1.yaml").exists());
    assert_eq!(
        std::fs::read_to_string(dir.path().join("vm0.yaml")).unwrap(),
        "name: keep\n"
    );

    place_error(&["--shape", "2x", "--vm", "a=1"]);
    let err = place_error(&["--vm", "a=1", "--vm", "a=2"]);
    assert!(err.contains("'a' is given twice"), "{err}");
}

/// Counts no host can hold are refused at once, naming the limit (issue 15: `1x4294967296`
/// aborted allocating 34 GB, `100000x1` ran for minutes).
#[test]
fn impossible_counts_are_refused_at_once() {
    for args in [
        &["--shape", "1x4294967296"][..],
        &["--shape", "100000x1"][..],
        &["--vm", "big=4294967296"][..],
    ] {
        let err = place_error(args);
        assert!(
            err.contains("this host") && err.contains("8"),
            "{args:?}: {err}"
        );
    }
}

/// Issue 40: a place that placed nothing printed a table of no rows above its reasons.
#[test]
fn a_place_that_places_nothing_prints_no_empty_table() {
    let out = crate::cli::vfio_p2p()
        .args(["--example", "dual-socket-pcie", "place", "--shape", "2x4"])
        .args(["--max-path", "pix"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        !text.contains('┌') && !text.contains("worst path   NUMA"),
        "{text}"
    );
    assert!(text.starts_with("vm0 (4 GPUs): not placed:"), "{text}");
    // placing one still shows it in a table
    let out = crate::cli::vfio_p2p()
        .args(["--example", "dual-socket-pcie", "place", "--shape", "1x2"])
        .output()
        .unwrap();
    assert!(String::from_utf8(out.stdout).unwrap().starts_with('┌'));
}
