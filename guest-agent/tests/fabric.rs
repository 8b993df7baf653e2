//! The fabric check (issue 30, the guest side) on NVML's readings from a real Fabric
//! Manager partition (4 × H100 of an 8-GPU HGX board), and on the agent's own recordings.

use serde_json::Value;
use vfio_p2p_agent::fabric::{judge, FabricView, GpuFabric};
use vfio_p2p_contract::Expectation;

const CAPTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../tests/fixtures/agent/fabric/h100x4-partition-nvml-fabric.json"
);

/// The capture (NVML called directly: `module_id`, `state`, `status`, `cliqueId`, …) as
/// the agent's view.
fn captured_view() -> FabricView {
    let c: Value = serde_json::from_str(&std::fs::read_to_string(CAPTURE).unwrap()).unwrap();
    let gpus = c["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            assert_eq!(
                (g["module_rc"].as_i64(), g["fabric_rc"].as_i64()),
                (Some(0), Some(0))
            );
            let bus = g["busId"].as_str().unwrap().to_ascii_lowercase();
            GpuFabric {
                bdf: bus.strip_prefix("0000").unwrap().parse().unwrap(),
                module_id: g["module_id"].as_u64().map(|m| m as u32),
                module_error: None,
                state: g["state"].as_u64().map(|s| s as u8),
                status: g["status"].as_i64().map(|s| s as i32),
                clique_id: g["cliqueId"].as_u64().map(|s| s as u32),
                cluster_uuid: g["clusterUuid"].as_str().map(str::to_string),
                fabric_error: None,
            }
        })
        .collect();
    FabricView {
        driver_version: c["driver"].as_str().map(str::to_string),
        gpus,
    }
}

/// The host's plan for that VM: the four GPUs at 00:06.0–00:09.0 with `modules`.
fn plan(modules: [u32; 4], fm_version: &str) -> Expectation {
    let gpus: Vec<String> = modules
        .iter()
        .enumerate()
        .map(|(i, m)| {
            format!(
                r#"{{"host_bdf":"0000:1{i}:00.0","guest_bdf":"0000:00:0{}.0","clique":null,
                "vendor":"0x10de","device":"0x2330","module_id":{m}}}"#,
                6 + i
            )
        })
        .collect();
    Expectation::from_json(&format!(
        r#"{{"version":1,"vm":"vm0","gpus":[{}],
        "fabric":{{"model":"shared-nvswitch","partition_id":2,"fm_version":"{fm_version}"}}}}"#,
        gpus.join(",")
    ))
    .unwrap()
}

#[test]
fn the_real_partition_is_as_planned() {
    let view = captured_view();
    assert_eq!(view.gpus.len(), 4);
    let r = judge(&view, Some(&plan([7, 5, 6, 8], "580.159.04")));
    assert!(r.problems.is_empty(), "{:?}", r.problems);
    assert!(r.gpus.iter().all(|g| g.ok));
    let table = vfio_p2p_agent::render::fabric(&r);
    assert!(
        table.contains("completed") && table.contains("FM partition 2"),
        "{table}"
    );
}

#[test]
fn a_wrong_module_id_fm_version_or_state_fails_on_the_real_readings() {
    let view = captured_view();
    // GPUs passed through in another order than FM's partition has them
    let r = judge(&view, Some(&plan([5, 7, 6, 8], "580.159.04")));
    assert_eq!(r.mismatches(), 2, "{:?}", r.problems);
    assert!(r.problems[0].starts_with("0000:00:06.0: module id 7, the host planned module 5"));
    assert!(r.problems[1].starts_with("0000:00:07.0: module id 5, the host planned module 7"));
    // FM on the host is another version than the guest driver
    let r = judge(&view, Some(&plan([7, 5, 6, 8], "570.172.08")));
    assert_eq!(r.mismatches(), 1);
    assert!(
        r.problems[0].contains("guest driver is 580.159.04"),
        "{:?}",
        r.problems
    );
    // a GPU whose registration has not completed, and one that completed with an error
    let mut v = view.clone();
    v.gpus[2].state = Some(2);
    v.gpus[3].status = Some(-1);
    let r = judge(&v, Some(&plan([7, 5, 6, 8], "580.159.04")));
    assert_eq!(r.mismatches(), 2, "{:?}", r.problems);
    assert!(r.problems[0].contains("0000:00:08.0: fabric state in progress"));
    assert!(
        r.problems[1].contains("0000:00:09.0: fabric registration completed with NVML error -1")
    );
}
