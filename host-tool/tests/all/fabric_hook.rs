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

/// The warning for a GPU reset for `partition` while still on its host driver.
fn on_host_driver(bdf: &str, partition: u32) -> impl predicates::Predicate<str> {
    predicate::str::contains(format!(
        "warning: hook: vm1: {bdf} was reset for partition {partition} while still on its host driver nvidia (a managed='yes' hostdev"
    ))
}

fn reset_value(h: &Host, bdf: &str) -> String {
    fs::read_to_string(h.root().join("sys/bus/pci/devices").join(bdf).join("reset")).unwrap()
}

#[test]
fn prepare_resets_and_activates_the_vms_partition_and_release_deactivates_it() {
    let h = Host::new(SHARED_DENY, &board());
    // The hostdevs are managed='yes': libvirt binds them after the hook, so FM's reset
    // happens on the host driver, and that is said (FM's sequence resets on vfio-pci).
    h.hook("prepare", "begin", &domain(&[0x05, 0x06]))
        .success()
        .stdout("")
        .stderr(on_host_driver("0000:05:00.0", 1))
        .stderr(on_host_driver("0000:06:00.0", 1));
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
        .stderr(on_host_driver("0000:0a:00.0", 0));
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
        .stderr(on_host_driver("0000:09:00.0", 2));
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

/// The hook and the reading commands facing an FM whose library blocks in `call` (the
/// stand-in's `hang`): each returns within FM's call deadline (6 s) plus its own work.
fn hung(call: &str) -> Value {
    let mut fm = board();
    fm["hang"] = json!([call]);
    fm
}

const WITHIN: std::time::Duration = std::time::Duration::from_secs(40);
const SAID: &str = "did not return within 6 s (Fabric Manager hangs, or its socket stalls)";

#[test]
fn a_hung_fm_activation_starts_the_guest_under_warn_and_refuses_it_under_deny() {
    let h = Host::new(SHARED, &hung("activate"));
    let t = std::time::Instant::now();
    h.cmd()
        .args(["hook", "run", "vm1", "prepare", "begin", "-"])
        .write_stdin(domain(&[0x05, 0x06]))
        .timeout(WITHIN)
        .assert()
        .success()
        .stderr(predicate::str::contains(format!(
            "fmActivateFabricPartition(1) {SAID}"
        )))
        .stderr(predicate::str::contains(
            "the guest starts without NVLink (hook_policy: warn)",
        ));
    assert!(
        t.elapsed() < std::time::Duration::from_secs(20),
        "{:?}",
        t.elapsed()
    );
    assert_eq!(h.calls().last().unwrap(), "activate 1 (hangs)");
    assert!(h.record().is_none());
    let h = Host::new(SHARED_DENY, &hung("activate"));
    h.cmd()
        .args(["hook", "run", "vm1", "prepare", "begin", "-"])
        .write_stdin(domain(&[0x05, 0x06]))
        .timeout(WITHIN)
        .assert()
        .code(1)
        .stderr(predicate::str::contains(SAID))
        .stderr(predicate::str::contains("(hook_policy: deny)"));
    assert!(h.record().is_none(), "nothing recorded active");
    // The bind lock was given back with the hook: the next operation takes it at once.
    h.cmd()
        .args(["hook", "run", "vm1", "release", "end", "-"])
        .timeout(std::time::Duration::from_secs(10))
        .assert()
        .success();
}

#[test]
fn a_hung_fm_connect_or_query_starts_the_guest_under_warn_and_refuses_under_deny() {
    for call in ["connect", "get_supported"] {
        let h = Host::new(SHARED, &hung(call));
        h.cmd()
            .args(["hook", "run", "vm1", "prepare", "begin", "-"])
            .write_stdin(domain(&[0x05, 0x06]))
            .timeout(WITHIN)
            .assert()
            .success()
            .stderr(predicate::str::contains(SAID))
            .stderr(predicate::str::contains("hook_policy: warn"));
        let h = Host::new(SHARED_DENY, &hung(call));
        h.cmd()
            .args(["hook", "run", "vm1", "prepare", "begin", "-"])
            .write_stdin(domain(&[0x05, 0x06]))
            .timeout(WITHIN)
            .assert()
            .code(1)
            .stderr(predicate::str::contains(SAID));
        assert_eq!(reset_value(&h, "0000:05:00.0"), "", "{call}: nothing done");
    }
}

#[test]
fn a_hung_fm_deactivation_warns_and_release_still_gives_the_gpus_back() {
    for yaml in [SHARED, SHARED_DENY] {
        let h = Host::new(yaml, &board());
        h.hook("prepare", "begin", &domain(&[0x05, 0x06])).success();
        let mut fm = h.fm();
        fm["hang"] = json!(["deactivate"]);
        h.set_fm(&fm);
        h.cmd()
            .args(["hook", "run", "vm1", "release", "end", "-"])
            .timeout(WITHIN)
            .assert()
            .success()
            .stderr(predicate::str::contains(format!(
                "warning: hook: vm1: deactivating Fabric Manager partition 1: Fabric Manager at 127.0.0.1:6666: fmDeactivateFabricPartition(1) {SAID}"
            )));
        assert_eq!(h.record().unwrap()["partitions"]["1"]["guest"], "vm1");
    }
}

#[test]
fn place_and_check_facing_a_hung_fm_finish_with_a_warning() {
    // (`topo` shows the PCIe tree only: it never asks FM.)
    for args in [&["place", "--shape", "1x2"][..], &["check"][..]] {
        let h = Host::new(SHARED, &hung("get_supported"));
        let out = h
            .cmd()
            .args(args)
            .arg("--host-config")
            .arg(h.root().join("etc/vfio-p2p/host.yaml"))
            .timeout(WITHIN)
            .output()
            .unwrap();
        let all = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.code().is_some(), "{args:?} was killed: {all}");
        assert!(all.contains(SAID), "{args:?}: {all}");
        assert_eq!(h.calls().last().unwrap(), "get_supported (hangs)");
    }
}

#[test]
fn fm_answers_it_cannot_have_are_refused_under_deny_and_warned_under_warn() {
    // Partition 1 listed twice (the second with partition 2's GPUs): activating "1" for
    // 09+0a would hand this VM another VM's GPUs.
    let mut twice = board();
    twice["partitions"][2]["id"] = json!(1);
    // A GPU with failed NVLinks that FM names by no address: which one cannot be told.
    let mut nameless = board();
    nameless["nvlink_failed_gpus"] = json!([{ "pci": "", "ports": [3] }]);
    // One PCI address under two module ids.
    let mut two_ids = board();
    two_ids["partitions"][2]["gpus"][0]["module_id"] = json!(7);
    two_ids["partitions"][2]["gpus"][0]["pci"] = json!("00000000:05:00.0");
    for (fm, words) in [
        (&twice, "partition 1 is listed twice"),
        (
            &nameless,
            "a GPU with failed NVLinks is listed without a PCI bus id",
        ),
        (
            &two_ids,
            "0000:05:00.0 is listed as module 1 and as module 7",
        ),
    ] {
        let h = Host::new(SHARED_DENY, fm);
        h.hook("prepare", "begin", &domain(&[0x09, 0x0a]))
            .code(1)
            .stderr(predicate::str::contains(format!(
                "Fabric Manager at 127.0.0.1:6666 answered a partition list it cannot have: {words}"
            )));
        assert_eq!(h.active(), Vec::<u64>::new(), "{words}");
        let h = Host::new(SHARED, fm);
        h.hook("prepare", "begin", &domain(&[0x09, 0x0a]))
            .success()
            .stderr(predicate::str::contains(words))
            .stderr(predicate::str::contains("hook_policy: warn"));
        assert_eq!(h.active(), Vec::<u64>::new(), "{words}");
    }
}

#[test]
fn modules_mapped_to_a_nic_are_refused_before_anything_is_reset() {
    let mut fm = board();
    for p in fm["partitions"].as_array_mut().unwrap() {
        for g in p["gpus"].as_array_mut().unwrap() {
            g["pci"] = json!("");
        }
    }
    // Module 3 at 0b:00.0, the example's ConnectX NIC.
    let yaml = format!(
        "{SHARED_DENY}fabric_manager:\n  modules: {{1: \"0000:05:00.0\", 2: \"0000:06:00.0\", 3: \"0000:0b:00.0\", 4: \"0000:0a:00.0\"}}\n"
    );
    let h = Host::new(&yaml, &fm);
    h.hook("prepare", "begin", &domain(&[0x09, 0x0a]))
        .code(1)
        .stderr(predicate::str::contains(
        "fabric_manager.modules maps module 3 to 0000:0b:00.0, which is no NVIDIA GPU on this host",
    ));
    h.cmd()
        .args(["fabric", "activate", "2"])
        .assert()
        .failure()
        .stderr(predicate::str::contains(
            "fabric_manager.modules maps module 3 to 0000:0b:00.0",
        ));
    let nic_reset = h.root().join("sys/bus/pci/devices/0000:0b:00.0/reset");
    assert_eq!(
        fs::read_to_string(nic_reset).unwrap_or_default(),
        "",
        "the NIC was not reset"
    );
    assert_eq!(h.active(), Vec::<u64>::new());
}

#[test]
fn a_capture_with_one_gpu_under_two_module_ids_is_an_error_naming_it() {
    let h = Host::new(SHARED, &board());
    let capture = h.root().join("partitions.json");
    fs::write(
        &capture,
        r#"{"partitions": [
  {"id": 1, "gpus": [{"module_id": 1, "bdf": "0000:05:00.0"}, {"module_id": 2, "bdf": "0000:06:00.0"}]},
  {"id": 2, "gpus": [{"module_id": 3, "bdf": "0000:05:00.0"}, {"module_id": 4, "bdf": "0000:0a:00.0"}]}
]}"#,
    )
    .unwrap();
    let yaml = h.root().join("host-capture.yaml");
    fs::write(
        &yaml,
        format!(
            "{SHARED}fabric_manager:\n  partitions: {}\n",
            capture.display()
        ),
    )
    .unwrap();
    h.cmd()
        .args(["place", "--shape", "2x2", "--host-config"])
        .arg(&yaml)
        .assert()
        .failure()
        .stderr(predicate::str::contains(format!(
            "{}: 0000:05:00.0 is listed as module 1 and as module 3",
            capture.display()
        )));
}

#[test]
fn a_record_fm_contradicts_is_said_and_the_partition_activated_again() {
    let h = Host::new(SHARED_DENY, &board());
    h.hook("prepare", "begin", &domain(&[0x05, 0x06])).success();
    // FM down when the guest stops: the record stays.
    let mut fm = h.fm();
    fm["running"] = json!(false);
    h.set_fm(&fm);
    h.hook("release", "end", "").success();
    assert_eq!(h.record().unwrap()["partitions"]["1"]["guest"], "vm1");
    // FM restarted (no partition active), the guest started again.
    fm["running"] = json!(true);
    for p in fm["partitions"].as_array_mut().unwrap() {
        p["active"] = json!(false);
    }
    h.set_fm(&fm);
    h.hook("prepare", "begin", &domain(&[0x05, 0x06]))
        .success()
        .stderr(predicate::str::contains(
            "warning: hook: vm1: partition 1 was recorded active for vm1, but Fabric Manager lists it inactive",
        ));
    assert_eq!(h.active(), vec![1]);
    assert_eq!(h.calls().last().unwrap(), "activate 1");
    assert_eq!(h.record().unwrap()["partitions"]["1"]["guest"], "vm1");
}

#[test]
fn release_deactivates_before_the_gpus_go_back_to_the_host() {
    let h = Host::new(SHARED, &board());
    h.hook("prepare", "begin", &domain(&[0x05, 0x06])).success();
    // vm1 has a device in the bind record, for release to give back after the deactivation.
    let gpu = "0000:0a:00.0";
    let bound = h.root().join("run/vfio-p2p/state.json");
    fs::write(
        &bound,
        format!(r#"{{"devices": {{"{gpu}": {{"original": {{"driver": "nvidia", "driver_override": null}}, "bound_with": "{gpu}", "guest": "vm1"}}}}}}"#),
    )
    .unwrap();
    let mut fm = h.fm();
    fm["observe"] = json!({ "file": bound, "text": gpu });
    h.set_fm(&fm);
    h.hook("release", "end", "").success();
    // FM's sequence: deactivate while the GPUs are still on vfio-pci, then give them back.
    assert_eq!(h.fm()["observations"], json!(["deactivate 1: present"]));
    assert!(!fs::read_to_string(&bound).unwrap().contains(gpu));
}

#[test]
fn a_resync_past_fms_limit_names_the_record_not_fm() {
    let h = Host::new(SHARED, &board());
    let entries: Vec<String> = (0..65)
        .map(|i| format!(r#""{i}": {{"guest": null, "gpus": []}}"#))
        .collect();
    fs::create_dir_all(h.root().join("run/vfio-p2p")).unwrap();
    fs::write(
        h.root().join("run/vfio-p2p/fabric.json"),
        format!(r#"{{"partitions": {{{}}}}}"#, entries.join(", ")),
    )
    .unwrap();
    h.cmd()
        .args(["fabric", "resync"])
        .assert()
        .failure()
        .stderr(predicate::str::contains(
            "fmSetActivatedFabricPartitions not made: vfio-p2p's partition record lists 65 active partitions, more than the 64",
        ));
    assert!(!h.calls().iter().any(|c| c.starts_with("set_activated")));
}
