//! The hook's transaction end to end in one process: the bind on the simulated kernel
//! (`vfio_bind::sim`, which moves driver links as Linux does), then the activation through
//! FM's API in the stand-in library, and, when FM refuses, every device back on the driver
//! and `driver_override` it had, no partition active, nothing recorded. One test: the
//! stand-in's library state is per process.

mod fm_standin;

use std::fs;
use std::time::Duration;

use pci_config::Bdf;
use serde_json::{json, Value};
use vfio_p2p_bind::partition_activation::guest::activate_or_roll_back;
use vfio_p2p_bind::partition_activation::ActivationRecord;
use vfio_p2p_bind::sim::{write_tree, SimKernel};
use vfio_p2p_bind::{bind, BindOptions, BindState, SessionOptions};
use vfio_p2p_fm_ffi::FmFailure;
use vfio_p2p_model::Topology;
use vfio_p2p_read::fm_api::FmSession;
use vfio_p2p_read::synth::example;
use vfio_p2p_read::{read_binding, read_host, Binding};

use fm_standin::{board, standin_library};

fn b(s: &str) -> Bdf {
    s.parse().unwrap()
}

/// Every function of the two GPUs (the audio functions move with them).
const DEVICES: [&str; 4] = [
    "0000:05:00.0",
    "0000:05:00.1",
    "0000:06:00.0",
    "0000:06:00.1",
];

fn bindings(root: &std::path::Path) -> Vec<Binding> {
    DEVICES
        .iter()
        .map(|d| read_binding(root, b(d)).unwrap())
        .collect()
}

fn active(fm: &std::path::Path) -> Vec<u64> {
    let v: Value = serde_json::from_str(&fs::read_to_string(fm).unwrap()).unwrap();
    v["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["active"] == json!(true))
        .map(|p| p["id"].as_u64().unwrap())
        .collect()
}

/// `gpus` onto vfio-pci, on the host as the tree under `root` describes it now.
fn bind_to_vfio(
    root: &std::path::Path,
    kernel: &mut SimKernel,
    gpus: &[Bdf],
    opts: &SessionOptions,
) {
    let topo = Topology::from_record(&read_host(root).unwrap());
    bind(root, &topo, kernel, gpus, &BindOptions::default(), opts).unwrap();
}

#[test]
fn a_refused_activation_gives_the_gpus_back_and_an_accepted_one_keeps_them() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let host = example("dual-socket-pcie").unwrap();
    write_tree(&host, root).unwrap();
    let fm_state = root.join("fm.json");
    std::env::set_var("VFIO_P2P_FM_LIBRARY", standin_library());
    std::env::set_var("VFIO_P2P_FM_STANDIN", &fm_state);
    let gpus = [b("0000:05:00.0"), b("0000:06:00.0")];
    let opts = SessionOptions {
        dry_run: false,
        lock_timeout: Duration::from_secs(5),
        guest: Some("vm1".into()),
        memory_offline_wait: Duration::ZERO,
    };
    let before = bindings(root);
    assert!(before
        .iter()
        .all(|b| b.driver.as_deref() != Some("vfio-pci")));

    // FM down: the connection fails as unreachable; a later session opens normally.
    let mut fm = board();
    fm["running"] = json!(false);
    fs::write(&fm_state, fm.to_string()).unwrap();
    let e = FmSession::open("127.0.0.1:6666").err().unwrap();
    assert_eq!(e.failure(), FmFailure::Unreachable, "{e}");

    let mut fm = board();
    fm["fail_activate"] = json!({ "1": "nvlink_error" });
    fs::write(&fm_state, fm.to_string()).unwrap();
    let mut kernel = SimKernel::new(&host);
    bind_to_vfio(root, &mut kernel, &gpus, &opts);
    assert!(bindings(root)
        .iter()
        .all(|b| b.driver.as_deref() == Some("vfio-pci")));
    let mut session = FmSession::open("127.0.0.1:6666").unwrap();
    let e =
        activate_or_roll_back(root, &mut kernel, &mut session, 1, &gpus, "vm1", &opts).unwrap_err();
    assert_eq!(e.failed.fm_failure(), Some(FmFailure::Refused));
    let text = e.to_string();
    assert!(text.contains("FM_ST_NVLINK_ERROR"), "{text}");
    assert!(text.contains("rolled back: 0000:05:00.0"), "{text}");
    assert_eq!(bindings(root), before, "every device back as it was");
    assert!(BindState::load(root).unwrap().devices.is_empty());
    assert!(ActivationRecord::load(root).unwrap().partitions.is_empty());
    assert_eq!(active(&fm_state), Vec::<u64>::new());
    // The resets came after the bind and before FM's call.
    let log: Vec<String> = kernel
        .log
        .iter()
        .map(|(f, _)| f.display().to_string())
        .collect();
    let first_reset = log.iter().position(|f| f.ends_with("/reset")).unwrap();
    assert!(log[..first_reset]
        .iter()
        .any(|f| f.contains("drivers_probe") || f.ends_with("/bind")));
    drop(session);

    fs::write(&fm_state, board().to_string()).unwrap();
    bind_to_vfio(root, &mut kernel, &gpus, &opts);
    let mut session = FmSession::open("127.0.0.1:6666").unwrap();
    let r = activate_or_roll_back(root, &mut kernel, &mut session, 1, &gpus, "vm1", &opts).unwrap();
    assert_eq!(r.resets.len(), 2);
    assert_eq!(active(&fm_state), vec![1]);
    assert!(bindings(root)
        .iter()
        .all(|b| b.driver.as_deref() == Some("vfio-pci")));
    assert_eq!(
        ActivationRecord::load(root).unwrap().of_guest("vm1"),
        vec![1]
    );
}
