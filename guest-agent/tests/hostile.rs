//! Issue 15 in the guest: the agent's readers (the fw_cfg expectation, GPU config space
//! and the other sysfs attributes) get generated mutations, special files, deep and huge
//! inputs; the real binary must end within the limit, without a panic, abort or signal,
//! with a result or an error naming the input (`tests/hostile/support.rs`).
//!
//! Replay: `VFIO_P2P_HOSTILE_SEED=N`; longer: `VFIO_P2P_SOAK=N` (N times the cases).

#[path = "../../tests/hostile/support.rs"]
mod support;

use std::fs;
use std::path::{Path, PathBuf};

use assert_cmd::Command;
use support::{
    copy_tree, iterations, make_special, mutate, mutate_file, nested, run_checked, Rng, MUTATIONS,
    SPECIALS,
};

/// A real 4×H200 VM's sysfs (GPUs at 00:06.0 to 00:09.0, no clique capability).
fn vm_tree() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/sysfs/h200x4-vm")
}

const GPUS: [&str; 4] = [
    "0000:00:06.0",
    "0000:00:07.0",
    "0000:00:08.0",
    "0000:00:09.0",
];

/// What the host would hand this VM: its four GPUs, no cliques, every pair P2P.
fn expectation() -> String {
    let gpus: Vec<String> = GPUS
        .iter()
        .enumerate()
        .map(|(i, g)| {
            format!(
                r#"{{"host_bdf":"0000:{:02x}:00.0","guest_bdf":"{g}","clique":null,"vendor":"0x10de","device":"0x2335"}}"#,
                0x41 + i
            )
        })
        .collect();
    format!(
        r#"{{"version":1,"vm":"vm0","gpus":[{}],"pairs":[{{"a":"{}","b":"{}","verdict":"p2p","path":"NV18","nvlink":18}}]}}"#,
        gpus.join(","),
        GPUS[0],
        GPUS[1]
    )
}

fn agent(args: &[&str], root: &Path) -> Command {
    let mut c = Command::cargo_bin("vfio-p2p-agent").unwrap();
    c.args(args).arg("--sysfs-root").arg(root);
    c
}

/// `expect --expect FILE`: a result (0 match, 1 mismatch) or a refusal naming the file (2).
fn expectation_readers(root: &Path, file: &Path, case: &str) {
    let shown = file.display().to_string();
    let mut c = agent(&["expect"], root);
    c.arg("--expect").arg(file);
    let o = run_checked(c, None, case, &[&shown]);
    assert!(matches!(o.code, Some(0..=2)), "{case}: exit {:?}", o.code);
}

#[test]
fn expectation_mutations() {
    let mut rng = Rng::from_env("expectation");
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("vm");
    copy_tree(&vm_tree(), &root);
    let raw_dir = root.join("sys/firmware/qemu_fw_cfg/by_name/opt/vfio-p2p/expect.json");
    fs::create_dir_all(&raw_dir).unwrap();
    let raw = raw_dir.join("raw");
    let base = expectation().into_bytes();
    fs::write(&raw, &base).unwrap();
    let o = run_checked(
        agent(&["expect"], &root),
        None,
        "expectation: as written",
        &[],
    );
    assert!(o.code == Some(0) || o.code == Some(1), "{}", o.stderr);
    let file = t.path().join("expect.json");
    for _ in 0..iterations(12) {
        let m = *rng.pick(MUTATIONS);
        let bytes = mutate(&mut rng, m, &base);
        fs::write(&file, &bytes).unwrap();
        expectation_readers(&root, &file, &format!("expectation: {m:?}"));
        fs::write(&raw, &bytes).unwrap();
        let shown = raw.display().to_string();
        run_checked(
            agent(&["expect"], &root),
            None,
            &format!("fw_cfg raw: {m:?}"),
            &[&shown],
        );
    }
    let gpu = r#"{"host_bdf":"0000:41:00.0","guest_bdf":"0000:00:06.0","clique":null,"vendor":"0x10de","device":"0x2335"}"#;
    let hostile = [
        ("100,000 nested arrays", nested("[", "]", 100_000)),
        ("100,000 nested objects", nested(r#"{"a":"#, "}", 100_000)),
        (
            "20,000 duplicate GPUs",
            format!(
                r#"{{"version":1,"vm":"v","gpus":[{}],"pairs":[]}}"#,
                vec![gpu; 20_000].join(",")
            ),
        ),
        ("5 MiB", format!(r#"{{"vm":"{}"}}"#, "x".repeat(5 << 20))),
        (
            "version 4294967296",
            expectation().replace(r#""version":1"#, r#""version":4294967296"#),
        ),
        ("clique 255", expectation().replacen("null", "255", 1)),
    ];
    for (what, text) in hostile {
        fs::write(&file, text).unwrap();
        expectation_readers(&root, &file, &format!("expectation: {what}"));
    }
    for kind in SPECIALS {
        make_special(&file, *kind);
        expectation_readers(&root, &file, &format!("expectation: {kind:?}"));
        make_special(&raw, *kind);
        let shown = raw.display().to_string();
        run_checked(
            agent(&["expect"], &root),
            None,
            &format!("fw_cfg raw: {kind:?}"),
            &[&shown],
        );
    }
}

/// Capability lists that end badly: loops (standard and extended), a pointer out of the
/// header, a list running off a 64-byte (unprivileged) read.
fn broken_capability_lists(config: &[u8]) -> Vec<(&'static str, Vec<u8>)> {
    let with = |edits: &[(usize, u8)]| {
        let mut b = config.to_vec();
        for (at, v) in edits {
            b[*at] = *v;
        }
        b
    };
    let first = usize::from(config[0x34]);
    vec![
        (
            "standard list pointing at itself",
            with(&[(first + 1, first as u8)]),
        ),
        ("capability pointer into the header", with(&[(0x34, 0x10)])),
        (
            "extended list at 0x100 pointing at itself",
            with(&[(0x102, 0x01), (0x103, 0x10)]),
        ),
        ("64 bytes with a capability list", config[..64].to_vec()),
        ("all ones", vec![0xff; 4096]),
    ]
}

#[test]
fn config_space_mutations() {
    let mut rng = Rng::from_env("config space");
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("vm");
    copy_tree(&vm_tree(), &root);
    let expect = t.path().join("expect.json");
    fs::write(&expect, expectation()).unwrap();
    let gpu_dir = |g: &str| fs::canonicalize(root.join("sys/bus/pci/devices").join(g)).unwrap();
    let base = fs::read(gpu_dir(GPUS[0]).join("config")).unwrap();
    let run = |case: &str, names: &[&str]| {
        run_checked(agent(&["scan"], &root), None, case, names);
        let mut c = agent(&["expect"], &root);
        c.arg("--expect").arg(&expect);
        run_checked(c, None, &format!("{case} (expect)"), names);
    };
    for _ in 0..iterations(10) {
        let gpu = *rng.pick(&GPUS);
        let file = *rng.pick(&["config", "vendor", "device", "class", "numa_node", "driver"]);
        let path = gpu_dir(gpu).join(file);
        let what = mutate_file(&mut rng, &path);
        run(&format!("{gpu}/{file}: {what}"), &[gpu]);
        // The next case starts from the real tree.
        fs::remove_dir_all(&root).unwrap();
        copy_tree(&vm_tree(), &root);
    }
    for (what, bytes) in broken_capability_lists(&base) {
        let path = gpu_dir(GPUS[1]).join("config");
        fs::write(&path, bytes).unwrap();
        run(&format!("{}/config: {what}", GPUS[1]), &[GPUS[1]]);
    }
}

/// A saved report (`report --from`, `--baseline`) that is a FIFO, `/dev/zero`, a 1 GiB file
/// or garbage: an error naming the file, never a hang or a read into memory.
#[test]
fn saved_report_mutations() {
    let mut rng = Rng::from_env("saved report");
    let t = tempfile::tempdir().unwrap();
    let file = t.path().join("report.json");
    let base = fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/agent/h200x2-report.json"),
    )
    .unwrap();
    let shown = file.display().to_string();
    let run = |case: &str| {
        let mut c = Command::cargo_bin("vfio-p2p-agent").unwrap();
        c.args(["report", "--from"]).arg(&file);
        run_checked(c, None, case, &[&shown])
    };
    for _ in 0..iterations(6) {
        let m = *rng.pick(MUTATIONS);
        fs::write(&file, mutate(&mut rng, m, &base)).unwrap();
        run(&format!("saved report: {m:?}"));
    }
    for kind in SPECIALS {
        make_special(&file, *kind);
        let o = run(&format!("saved report: {kind:?}"));
        assert_ne!(o.code, Some(0), "saved report: {kind:?}");
    }
}

/// Issue 28: `nccl-topo` on a deeply nested file took time with the square of the depth
/// (595k levels in 4 MiB: killed at 600 s): now a depth limit (256, the domain reader's)
/// refuses it at once, a file within the limit is read in one step per element, and a
/// FIFO, /dev/zero or a huge file is refused without blocking.
#[test]
fn nccl_topo_deep_and_special_files() {
    let t = tempfile::tempdir().unwrap();
    let root = vm_tree();
    let file = t.path().join("topo.xml");
    let shown = file.display().to_string();
    let nccl = |case: &str| {
        let mut c = Command::cargo_bin("vfio-p2p-agent").unwrap();
        c.arg("nccl-topo").arg(&file).arg("--sysfs-root").arg(&root);
        run_checked(c, None, case, &[&shown])
    };
    let deep = |n| {
        format!(
            "<system version=\"1\">{}</system>",
            nested("<a>", "</a>", n)
        )
    };
    fs::write(&file, deep(595_000)).unwrap();
    let o = nccl("595,000 nested elements");
    assert!(
        o.stderr.contains("nested deeper than 256 levels"),
        "{}",
        o.stderr
    );
    fs::write(&file, deep(250)).unwrap();
    let o = nccl("250 nested elements");
    assert!(!o.stderr.contains("nested deeper"), "{}", o.stderr);
    for kind in SPECIALS {
        make_special(&file, *kind);
        nccl(&format!("nccl-topo file: {kind:?}"));
    }
}

/// Issue 28: a GPU whose `driver` link points at itself has no driver (it was shown with
/// driver "driver"); the real link names `nvidia`.
#[test]
fn a_driver_link_to_itself_names_no_driver() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("vm");
    copy_tree(&vm_tree(), &root);
    let dev = fs::canonicalize(root.join("sys/bus/pci/devices").join(GPUS[0])).unwrap();
    let scan = |case: &str| {
        let o = run_checked(agent(&["scan", "--format", "json"], &root), None, case, &[]);
        let v: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
        v["gpus"][0]["driver"].clone()
    };
    assert_eq!(scan("real link"), "nvidia");
    fs::remove_file(dev.join("driver")).unwrap();
    std::os::unix::fs::symlink("driver", dev.join("driver")).unwrap();
    assert_eq!(scan("driver -> driver"), serde_json::Value::Null);
}
