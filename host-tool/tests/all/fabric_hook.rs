//! Fabric Manager partitions in the libvirt hook and `vfio-p2p fabric`, against the stand-in
//! FM library (`tests/fm-standin`, built here and loaded through `VFIO_P2P_FM_LIBRARY`), on
//! the `dual-socket-pcie` example host written as a sysfs tree. Its GPUs 05:00.0 and
//! 06:00.0 (one switch) play FM's partition 1, 09:00.0 and 0a:00.0 partition 2, all four
//! partition 0. The hostdevs are managed='yes' (libvirt binds them), so the hook's own work
//! here is the fabric; the bind's rollback is in `fabric_rollback.rs` and the lab.

use crate::fm_standin;

use std::fs;
use std::path::Path;

use assert_cmd::Command;
use predicates::prelude::*;
use serde_json::{json, Value};
use vfio_p2p_bind::sim::write_tree;
use vfio_p2p_read::synth::example;

use fm_standin::{board, standin_library};

struct Host {
    dir: tempfile::TempDir,
}

impl Host {
    /// The example host, host.yaml `yaml`, and the stand-in FM in state `fm`.
    fn new(yaml: &str, fm: &Value) -> Host {
        let dir = tempfile::tempdir().unwrap();
        write_tree(&example("dual-socket-pcie").unwrap(), dir.path()).unwrap();
        fs::create_dir_all(dir.path().join("etc/vfio-p2p")).unwrap();
        fs::write(dir.path().join("etc/vfio-p2p/host.yaml"), yaml).unwrap();
        let h = Host { dir };
        h.set_fm(fm);
        h
    }
    fn root(&self) -> &Path {
        self.dir.path()
    }
    fn fm_path(&self) -> std::path::PathBuf {
        self.root().join("fm-standin.json")
    }
    fn set_fm(&self, fm: &Value) {
        fs::write(self.fm_path(), serde_json::to_string_pretty(fm).unwrap()).unwrap();
    }
    fn fm(&self) -> Value {
        serde_json::from_str(&fs::read_to_string(self.fm_path()).unwrap()).unwrap()
    }
    fn calls(&self) -> Vec<String> {
        serde_json::from_value(self.fm()["calls"].clone()).unwrap_or_default()
    }
    fn active(&self) -> Vec<u64> {
        self.fm()["partitions"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["active"] == json!(true))
            .map(|p| p["id"].as_u64().unwrap())
            .collect()
    }
    fn record(&self) -> Option<Value> {
        let text = fs::read_to_string(self.root().join("run/vfio-p2p/fabric.json")).ok()?;
        Some(serde_json::from_str(&text).unwrap())
    }
    fn cmd(&self) -> Command {
        let mut c = crate::cli::vfio_p2p();
        c.arg("--sysfs-root")
            .arg(self.root())
            .env("VFIO_P2P_FM_LIBRARY", standin_library())
            .env("VFIO_P2P_FM_STANDIN", self.fm_path())
            .env_remove("VFIO_P2P_FAIL_AFTER");
        c
    }
    fn hook(&self, op: &str, sub: &str, xml: &str) -> assert_cmd::assert::Assert {
        self.cmd()
            .args(["hook", "run", "vm1", op, sub, "-"])
            .write_stdin(xml)
            .assert()
    }
}

/// A domain with these GPUs (bus numbers) as managed hostdevs, all in clique 0.
fn domain(buses: &[u8]) -> String {
    let mut x = String::from(
        "<domain type='kvm' xmlns:qemu='http://libvirt.org/schemas/domain/qemu/1.0'>\n  <name>vm1</name>\n  <devices>\n",
    );
    for b in buses {
        x.push_str(&format!(
            "    <hostdev mode='subsystem' type='pci' managed='yes'>\n      <source><address domain='0x0000' bus='{b:#04x}' slot='0x00' function='0x0'/></source>\n      <alias name='ua-gpu{b}'/>\n    </hostdev>\n"
        ));
    }
    x.push_str("  </devices>\n  <qemu:override>\n");
    for b in buses {
        x.push_str(&format!("    <qemu:device alias='ua-gpu{b}'><qemu:frontend><qemu:property name='x-nv-gpudirect-clique' type='unsigned' value='0'/></qemu:frontend></qemu:device>\n"));
    }
    x.push_str("  </qemu:override>\n</domain>\n");
    x
}

const SHARED: &str = "fabric: shared-nvswitch\n";
const SHARED_DENY: &str = "fabric: shared-nvswitch\nhook_policy: deny\n";

fn reset_value(h: &Host, bdf: &str) -> String {
    fs::read_to_string(h.root().join("sys/bus/pci/devices").join(bdf).join("reset")).unwrap()
}

#[test]
fn prepare_resets_and_activates_the_vms_partition_and_release_deactivates_it() {
    let h = Host::new(SHARED_DENY, &board());
    h.hook("prepare", "begin", &domain(&[0x05, 0x06]))
        .success()
        .stdout("")
        .stderr("");
    assert_eq!(h.active(), vec![1]);
    assert_eq!(
        h.calls(),
        [
            "connect tcp 127.0.0.1:6666 -> 0",
            "get_supported",
            "get_unsupported",
            "get_nvlink_failed",
            "activate 1"
        ]
    );
    assert_eq!(reset_value(&h, "0000:05:00.0"), "1");
    assert_eq!(reset_value(&h, "0000:06:00.0"), "1");
    assert_eq!(reset_value(&h, "0000:09:00.0"), "");
    let rec = h.record().unwrap();
    assert_eq!(rec["partitions"]["1"]["guest"], "vm1");
    // libvirt may run prepare again for the same guest: nothing changes.
    h.hook("prepare", "begin", &domain(&[0x05, 0x06]))
        .success()
        .stderr("");
    assert_eq!(h.calls().last().unwrap(), "get_nvlink_failed");
    // Another guest's release leaves it; vm1's deactivates it.
    h.cmd()
        .args(["hook", "run", "vm2", "release", "end", "-"])
        .assert()
        .success()
        .stderr("");
    assert_eq!(h.active(), vec![1]);
    h.hook("release", "end", "").success().stdout("").stderr("");
    assert_eq!(h.active(), Vec::<u64>::new());
    assert_eq!(h.calls().last().unwrap(), "deactivate 1");
    assert_eq!(h.record().unwrap()["partitions"], json!({}));
}

#[test]
fn an_unreachable_fm_warns_and_starts_or_denies_naming_the_fix() {
    let mut fm = board();
    fm["running"] = json!(false);
    let h = Host::new(SHARED, &fm);
    h.hook("prepare", "begin", &domain(&[0x05, 0x06]))
        .success()
        .stderr(predicate::str::contains(
            "warning: hook: vm1: Fabric Manager at 127.0.0.1:6666: fmConnect failed with FM_ST_CONNECTION_NOT_VALID (-9)",
        ))
        .stderr(predicate::str::contains("systemctl start nvidia-fabricmanager"))
        .stderr(predicate::str::contains("the guest starts without NVLink (hook_policy: warn)"));
    let h = Host::new(SHARED_DENY, &fm);
    h.hook("prepare", "begin", &domain(&[0x05, 0x06]))
        .code(1)
        .stderr(predicate::str::contains(
            "systemctl start nvidia-fabricmanager",
        ))
        .stderr(predicate::str::contains("(hook_policy: deny)"));
    assert!(h.record().is_none());
    assert_eq!(
        reset_value(&h, "0000:05:00.0"),
        "",
        "nothing is done before FM answers"
    );
}

#[test]
fn a_failed_activation_leaves_no_partition_active_and_follows_the_policy() {
    for (error, words) in [
        ("nvlink_error", "FM_ST_NVLINK_ERROR"),
        ("in_use", "already active for another VM"),
        ("not_supported", "FABRIC_MODE=1"),
    ] {
        let mut fm = board();
        fm["fail_activate"] = json!({ "1": error });
        let h = Host::new(SHARED_DENY, &fm);
        h.hook("prepare", "begin", &domain(&[0x05, 0x06]))
            .code(1)
            .stderr(predicate::str::contains(
                "vfio-p2p hook: vm1: activating Fabric Manager partition 1: Fabric Manager at 127.0.0.1:6666: fmActivateFabricPartition(1) failed",
            ))
            .stderr(predicate::str::contains(words))
            .stderr(predicate::str::contains("nothing was bound for it"));
        assert_eq!(h.active(), Vec::<u64>::new());
        assert!(h.record().is_none(), "{error}: nothing recorded");
        let h = Host::new(SHARED, &fm);
        h.hook("prepare", "begin", &domain(&[0x05, 0x06]))
            .success()
            .stderr(predicate::str::contains(words))
            .stderr(predicate::str::contains(
                "starts without NVLink (hook_policy: warn)",
            ));
        assert_eq!(h.active(), Vec::<u64>::new());
    }
    // The connection lost after the three queries: the activation is what fails.
    let mut fm = board();
    fm["connection_lost_after"] = json!(3);
    let h = Host::new(SHARED_DENY, &fm);
    h.hook("prepare", "begin", &domain(&[0x05, 0x06]))
        .code(1)
        .stderr(predicate::str::contains(
            "the connection to Fabric Manager was lost",
        ))
        .stderr(predicate::str::contains("fabric resync"));
    assert_eq!(h.active(), Vec::<u64>::new());
}

#[test]
fn gpus_that_are_not_a_partition_are_a_finding() {
    let h = Host::new(SHARED, &board());
    h.hook("prepare", "begin", &domain(&[0x05, 0x09]))
        .success()
        .stderr(predicate::str::contains(
            "warning: hook: vm1: GPUs 0000:05:00.0, 0000:09:00.0 are not one of Fabric Manager's partitions (partitions holding them all: 0 (",
        ));
    assert!(!h.calls().iter().any(|c| c.starts_with("activate")));
    let h = Host::new(SHARED_DENY, &board());
    h.hook("prepare", "begin", &domain(&[0x05, 0x09]))
        .code(1)
        .stderr(predicate::str::contains(
            "not one of Fabric Manager's partitions",
        ));
    // The whole board is partition 0.
    let h = Host::new(SHARED_DENY, &board());
    h.hook("prepare", "begin", &domain(&[0x05, 0x06, 0x09, 0x0a]))
        .success()
        .stderr("");
    assert_eq!(h.active(), vec![0]);
}

#[test]
fn fm_without_pci_ids_is_matched_through_host_yamls_modules() {
    // FM on H100 and later boards lists its partitions without PCI bus ids.
    let mut fm = board();
    for p in fm["partitions"].as_array_mut().unwrap() {
        for g in p["gpus"].as_array_mut().unwrap() {
            g["pci"] = json!("");
        }
    }
    let h = Host::new(SHARED_DENY, &fm);
    h.hook("prepare", "begin", &domain(&[0x09, 0x0a]))
        .code(1)
        .stderr(predicate::str::contains(
            "Fabric Manager lists its 3 partitions without PCI addresses",
        ))
        .stderr(predicate::str::contains(
            "host.yaml's `fabric_manager: modules:`",
        ));
    assert_eq!(h.active(), Vec::<u64>::new());
    let modules = format!(
        "{SHARED_DENY}fabric_manager:\n  modules: {{1: \"0000:05:00.0\", 2: \"0000:06:00.0\", 3: \"0000:09:00.0\", 4: \"0000:0a:00.0\"}}\n"
    );
    let h = Host::new(&modules, &fm);
    h.hook("prepare", "begin", &domain(&[0x09, 0x0a]))
        .success()
        .stderr("");
    assert_eq!(h.active(), vec![2]);
    assert_eq!(reset_value(&h, "0000:09:00.0"), "1");
    assert_eq!(reset_value(&h, "0000:05:00.0"), "");
    // `fabric list` shows the addresses host.yaml gave.
    let out = h
        .cmd()
        .args(["fabric", "list", "--format", "json"])
        .assert()
        .success();
    let v: Value = serde_json::from_slice(&out.get_output().stdout).unwrap();
    assert_eq!(v["partitions"][0]["gpus"][3]["bdf"], "0000:0a:00.0");
}

#[test]
fn hosts_without_shared_nvswitch_never_ask_fm() {
    // `none`, and `auto` on a host without NVSwitches: FM's library is not even opened,
    // whatever it would answer (here: down, which would otherwise refuse under deny).
    let mut fm = board();
    fm["running"] = json!(false);
    for yaml in [
        "fabric: none\nhook_policy: deny\n",
        "hook_policy: deny\n",
        "fabric: full-passthrough\nhook_policy: deny\n",
    ] {
        let h = Host::new(yaml, &fm);
        h.hook("prepare", "begin", &domain(&[0x05, 0x06]))
            .success()
            .stderr("");
        assert!(h.calls().is_empty(), "{yaml}");
    }
}

#[test]
fn a_unix_socket_address_is_passed_as_one() {
    let h = Host::new(
        "fabric: shared-nvswitch\nfabric_manager:\n  address: unix:/run/nvidia-fabricmanager/fm.sock\n",
        &board(),
    );
    h.hook("prepare", "begin", &domain(&[0x05, 0x06])).success();
    assert_eq!(
        h.calls()[0],
        "connect unix /run/nvidia-fabricmanager/fm.sock -> 0"
    );
}

#[test]
fn fabric_list_shows_partitions_and_who_holds_them() {
    let mut fm = board();
    fm["unsupported"] = json!([{ "id": 2, "module_ids": [3, 4] }]);
    let h = Host::new(SHARED, &fm);
    h.hook("prepare", "begin", &domain(&[0x05, 0x06])).success();
    let out = h.cmd().args(["fabric", "list"]).assert().success();
    let text = String::from_utf8(out.get_output().stdout.clone()).unwrap();
    assert!(
        text.starts_with("Fabric Manager at 127.0.0.1:6666\n"),
        "{text}"
    );
    for row in [
        "│ 1           2      1, 2         0000:05:00.0, 0000:06:00.0 ",
        "active (guest vm1)",
        "unsupported",
        "inactive",
    ] {
        assert!(text.contains(row), "{row:?} missing in\n{text}");
    }
    let out = h
        .cmd()
        .args(["fabric", "list", "--format", "json"])
        .assert()
        .success();
    let v: Value = serde_json::from_slice(&out.get_output().stdout).unwrap();
    assert_eq!(
        v["partitions"][1]["held_by"],
        json!({"by": "guest", "guest": "vm1"})
    );
    assert_eq!(v["partitions"][2]["unsupported"], true);
    assert_eq!(v["partitions"][0]["gpus"][3]["bdf"], "0000:0a:00.0");
}

#[test]
fn operators_activate_deactivate_and_resync_after_an_fm_restart() {
    let h = Host::new(SHARED, &board());
    h.cmd()
        .args(["fabric", "activate", "2"])
        .assert()
        .success()
        .stdout(predicate::str::contains(
            "echo 1 > /sys/bus/pci/devices/0000:09:00.0/reset",
        ))
        .stdout(predicate::str::ends_with(
            "activated Fabric Manager partition 2\n",
        ));
    assert_eq!(h.active(), vec![2]);
    h.hook("prepare", "begin", &domain(&[0x05, 0x06])).success();
    assert_eq!(h.active(), vec![1, 2]);
    // FM restarts: nothing active, and it waits to be told.
    let mut fm = h.fm();
    for p in fm["partitions"].as_array_mut().unwrap() {
        p["active"] = json!(false);
    }
    fm["awaiting_resync"] = json!(true);
    h.set_fm(&fm);
    h.cmd()
        .args(["fabric", "activate", "0"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("FM_ST_NOT_CONFIGURED"))
        .stderr(predicate::str::contains("vfio-p2p fabric resync"));
    h.cmd()
        .args(["fabric", "resync"])
        .assert()
        .success()
        .stdout("told Fabric Manager at 127.0.0.1:6666: partitions 1, 2 are active\n");
    assert_eq!(h.active(), vec![1, 2]);
    assert_eq!(h.calls().last().unwrap(), "set_activated [1,2]");
    // The guest's partition is the hook's to deactivate; the operator's is the operator's.
    h.cmd()
        .args(["fabric", "deactivate", "1"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains(
            "activated for guest vm1 by the libvirt hook",
        ));
    h.cmd()
        .args(["fabric", "deactivate", "2"])
        .assert()
        .success()
        .stdout("deactivated Fabric Manager partition 2\n");
    assert_eq!(h.active(), vec![1]);
    h.cmd()
        .args(["fabric", "resync"])
        .assert()
        .success()
        .stdout("told Fabric Manager at 127.0.0.1:6666: partition 1 is active\n");
    h.cmd()
        .args(["fabric", "deactivate", "1", "--force"])
        .assert()
        .success();
    assert_eq!(h.record().unwrap()["partitions"], json!({}));
    h.cmd()
        .args(["fabric", "resync"])
        .assert()
        .success()
        .stdout("told Fabric Manager at 127.0.0.1:6666: no partition is active\n");
}

#[test]
fn fabric_commands_name_a_missing_library() {
    let h = Host::new(SHARED, &board());
    h.cmd()
        .env("VFIO_P2P_FM_LIBRARY", h.root().join("no-such-libnvfm.so"))
        .args(["fabric", "list"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains(
            "no-such-libnvfm.so cannot be loaded",
        ))
        .stderr(predicate::str::contains("install nvidia-fabricmanager-dev"))
        .stderr(predicate::str::contains("(named by VFIO_P2P_FM_LIBRARY)"));
}

#[test]
fn a_dry_run_says_what_it_would_activate_and_changes_nothing() {
    let h = Host::new(SHARED_DENY, &board());
    h.cmd()
        .args(["hook", "run", "--dry-run", "vm1", "prepare", "begin", "-"])
        .write_stdin(domain(&[0x05, 0x06]))
        .assert()
        .success()
        .stdout("would reset 0000:05:00.0, 0000:06:00.0 and activate Fabric Manager partition 1\n");
    assert_eq!(h.active(), Vec::<u64>::new());
    assert_eq!(reset_value(&h, "0000:05:00.0"), "");
    assert!(h.record().is_none());
}

#[test]
fn release_warns_when_fm_is_gone_and_still_gives_the_gpus_back() {
    let h = Host::new(SHARED, &board());
    h.hook("prepare", "begin", &domain(&[0x05, 0x06])).success();
    // vm1 also has a device in the bind record (here already back on its driver).
    let gpu = "0000:0a:00.0";
    fs::write(
        h.root().join("run/vfio-p2p/state.json"),
        format!(r#"{{"devices": {{"{gpu}": {{"original": {{"driver": "nvidia", "driver_override": null}}, "bound_with": "{gpu}", "guest": "vm1"}}}}}}"#),
    )
    .unwrap();
    let mut fm = h.fm();
    fm["running"] = json!(false);
    h.set_fm(&fm);
    h.hook("release", "end", "")
        .success()
        .stderr(predicate::str::starts_with(
            "warning: hook: vm1: deactivating Fabric Manager partition 1: Fabric Manager at 127.0.0.1:6666: fmConnect failed",
        ))
        .stderr(predicate::str::contains("systemctl start nvidia-fabricmanager"));
    let bound = fs::read_to_string(h.root().join("run/vfio-p2p/state.json")).unwrap();
    assert!(
        !bound.contains(gpu),
        "the GPU was given back anyway: {bound}"
    );
    assert_eq!(
        h.record().unwrap()["partitions"]["1"]["guest"],
        "vm1",
        "kept for a later deactivate"
    );
}
