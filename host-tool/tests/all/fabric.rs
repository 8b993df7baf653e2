//! NVSwitch boards under Fabric Manager, end to end: `place` hands out FM's partitions,
//! `gen`/`plan --gpus` warn on a set that is not one, `topo` shows module ids and
//! partitions, a saved `fmpm -l` capture named in host.yaml is what planning follows on a
//! real root, and `fabric: none` turns it all off.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_json::Value;

fn vfio_p2p(args: &[&str]) -> std::process::Output {
    crate::cli::vfio_p2p().args(args).output().unwrap()
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/fabric")
        .join(name)
}

/// GPU sets of the placed VMs.
fn placed_sets(out: &std::process::Output) -> Vec<BTreeSet<String>> {
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v["vms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|vm| {
            vm["gpus"]
                .as_array()
                .unwrap()
                .iter()
                .map(|g| g.as_str().unwrap().to_string())
                .collect()
        })
        .collect()
}

fn set(bdfs: &[&str]) -> BTreeSet<String> {
    bdfs.iter().map(|b| format!("0000:{b}:00.0")).collect()
}

#[test]
fn place_two_by_four_gives_fms_four_gpu_partitions() {
    let out = vfio_p2p(&[
        "--example",
        "hgx-h100",
        "place",
        "--shape",
        "2x4",
        "--format",
        "json",
    ]);
    assert!(out.status.success());
    // hgx-h100's partition 2 (modules 5-8) and 1 (modules 1-4).
    assert_eq!(
        placed_sets(&out),
        [
            set(&["18", "19", "3a", "3b"]),
            set(&["9d", "9e", "bb", "bc"])
        ]
    );
    // 2x3: FM has no 3-GPU partition; nothing placed, and the shape that fits is said.
    let out = vfio_p2p(&["--example", "hgx-h100", "place", "--shape", "2x3"]);
    assert_eq!(out.status.code(), Some(2));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("no partition of 3 GPUs"), "{text}");
    assert!(text.contains("largest shape that fits: 2x2"), "{text}");
}

#[test]
fn gen_of_a_set_that_is_not_a_partition_warns_with_the_ones_that_fit() {
    let out = vfio_p2p(&[
        "--example",
        "hgx-h100",
        "gen",
        "qemu",
        "--gpus",
        "0000:18:00.0,0000:9d:00.0",
    ]);
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(
            "warning: GPUs 0000:18:00.0, 0000:9d:00.0 are not one of Fabric Manager's partitions"
        ),
        "{err}"
    );
    assert!(
        err.contains("3 (modules 1, 3: 0000:9d:00.0 0000:9e:00.0)")
            && err.contains("5 (modules 5, 7: 0000:18:00.0 0000:19:00.0)"),
        "{err}"
    );
    // A partition: no warning, and the expectation carries it.
    let out = vfio_p2p(&[
        "--example",
        "hgx-h100",
        "gen",
        "qemu",
        "--gpus",
        "0000:9d:00.0,0000:9e:00.0",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("Fabric Manager"), "{err}");
    let argv = String::from_utf8_lossy(&out.stdout);
    assert!(
        argv.contains(r#""fabric":{"model":"shared-nvswitch",,"partition_id":3"#),
        "{argv}"
    );
    let plan = vfio_p2p(&[
        "--example",
        "hgx-h100",
        "plan",
        "--gpus",
        "0000:18:00.0,0000:9d:00.0",
    ]);
    assert!(
        String::from_utf8_lossy(&plan.stderr).contains("not one of Fabric Manager's partitions")
    );
}

#[test]
fn topo_shows_module_ids_and_partitions() {
    let out = vfio_p2p(&["--example", "hgx-h100", "topo", "--format", "json"]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let parts = v["fabric"]["state"]["partitions"].as_array().unwrap();
    assert_eq!(parts.len(), 15);
    assert_eq!(v["fabric"]["model"], "shared-nvswitch");
    let text =
        String::from_utf8_lossy(&vfio_p2p(&["--example", "hgx-h100", "topo"]).stdout).into_owned();
    assert!(text.contains("Fabric Manager partitions"), "{text}");
    assert!(text.contains("GPU4   0000:9d:00.0   1"), "{text}");
    // A board without NVSwitches shows none.
    let out = vfio_p2p(&["--example", "dual-socket-pcie", "topo", "--format", "json"]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v.get("fabric").is_none());
}

#[test]
fn a_capture_in_host_yaml_is_followed_on_a_real_root_and_none_turns_it_off() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let snap = vfio_p2p(&[
        "--example",
        "hgx-h100",
        "snapshot",
        "-o",
        root.to_str().unwrap(),
    ]);
    assert!(
        snap.status.success(),
        "{}",
        String::from_utf8_lossy(&snap.stderr)
    );
    let root = root.to_str().unwrap();
    // Without a capture and without FM's library: under `auto` a host without Fabric
    // Manager (nothing said, place splits as on any host); under shared-nvswitch FM's
    // absence is said once, naming the library.
    let no_fm = |args: &[&str]| {
        crate::cli::vfio_p2p()
            .args(args)
            .env("VFIO_P2P_FM_LIBRARY", "/nonexistent/libnvfm.so.1")
            .output()
            .unwrap()
    };
    let out = no_fm(&["--sysfs-root", root, "place", "--shape", "4x2"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(!err.contains("Fabric Manager"), "{err}");
    let shared = dir.path().join("shared.yaml");
    std::fs::write(&shared, "fabric: shared-nvswitch\n").unwrap();
    let shared = shared.to_str().unwrap();
    let args = ["--sysfs-root", root, "place", "--host-config", shared];
    let out = no_fm(&[&args[..], &["--shape", "4x2"]].concat());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        err.matches(
            "warning: fabric: shared-nvswitch, but Fabric Manager's partitions are unknown"
        )
        .count(),
        1,
        "{err}"
    );
    assert!(err.contains("/nonexistent/libnvfm.so.1"), "{err}");
    let cfg = dir.path().join("host.yaml");
    std::fs::write(
        &cfg,
        format!(
            "fabric_manager:\n  partitions: {}\n",
            fixture("fmpm-l-hgx-h100.json").display()
        ),
    )
    .unwrap();
    let cfg = cfg.to_str().unwrap();
    // The capture has partition 3 (modules 1, 3: 9d, 9e) active: three pairs fit.
    let args = [
        "--sysfs-root",
        root,
        "place",
        "--host-config",
        cfg,
        "--shape",
        "4x2",
        "--format",
        "json",
    ];
    let out = vfio_p2p(&args);
    assert_eq!(out.status.code(), Some(2));
    let sets = placed_sets(&out);
    assert_eq!(sets.len(), 3);
    assert!(sets.iter().all(|s| !s.contains("0000:9d:00.0")), "{sets:?}");
    let none = Path::new(cfg).with_file_name("none.yaml");
    std::fs::write(&none, "fabric: none\n").unwrap();
    let out = vfio_p2p(&[
        "--example",
        "hgx-h100",
        "place",
        "--host-config",
        none.to_str().unwrap(),
        "--shape",
        "2x3",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn full_passthrough_passes_the_nvswitches_and_check_refuses_them_on_the_host_driver() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("host.yaml");
    std::fs::write(&cfg, "fabric: full-passthrough\n").unwrap();
    let cfg = cfg.to_str().unwrap();
    let out = vfio_p2p(&["--example", "hgx-h100", "gen", "qemu", "--host-config", cfg]);
    let argv = String::from_utf8_lossy(&out.stdout);
    for sw in ["03", "04", "05", "06"] {
        assert!(
            argv.contains(&format!(r#""host":"0000:{sw}:00.0""#)),
            "{argv}"
        );
    }
    assert!(String::from_utf8_lossy(&out.stderr).contains("Fabric Manager must run in the guest"));
    let out = vfio_p2p(&[
        "--example",
        "hgx-h100",
        "check",
        "--host-config",
        cfg,
        "--format",
        "json",
    ]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let failed: Vec<&Value> = v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["check"] == "nvswitch-driver" && c["status"] == "fail")
        .collect();
    assert_eq!(failed.len(), 4, "{v}");
}
