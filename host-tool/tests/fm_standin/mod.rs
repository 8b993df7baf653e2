//! The stand-in Fabric Manager library for the tests: built once per test run with cargo
//! (the workspace's `vfio-p2p-fm-standin`), and the board it plays.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use serde_json::{json, Value};

/// The built `libvfio_p2p_fm_standin.so`, for `VFIO_P2P_FM_LIBRARY`.
pub fn standin_library() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let out = Command::new(env!("CARGO"))
                .args([
                    "build",
                    "--quiet",
                    "-p",
                    "vfio-p2p-fm-standin",
                    "--message-format=json",
                ])
                .current_dir(env!("CARGO_MANIFEST_DIR"))
                .output()
                .expect("running cargo to build the FM stand-in");
            assert!(
                out.status.success(),
                "building tests/fm-standin failed:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                .filter(|m| {
                    m["reason"] == "compiler-artifact"
                        && m["target"]["name"] == "vfio_p2p_fm_standin"
                })
                .flat_map(|m| m["filenames"].as_array().cloned().unwrap_or_default())
                .filter_map(|f| f.as_str().map(PathBuf::from))
                .find(|f| f.extension().is_some_and(|e| e == "so"))
                .expect("cargo named no libvfio_p2p_fm_standin.so")
        })
        .clone()
}

fn gpu(module: u32, bus: u8) -> Value {
    json!({ "module_id": module, "pci": format!("00000000:{bus:02x}:00.0"), "links": 18, "max_links": 18 })
}

/// FM's partitions of the dual-socket-pcie example's socket-0 GPUs, as an 4-GPU board:
/// 0 = all four, 1 = 05+06, 2 = 09+0a; none active.
pub fn board() -> Value {
    json!({
        "running": true,
        "partitions": [
            { "id": 0, "gpus": [gpu(1, 0x05), gpu(2, 0x06), gpu(3, 0x09), gpu(4, 0x0a)] },
            { "id": 1, "gpus": [gpu(1, 0x05), gpu(2, 0x06)] },
            { "id": 2, "gpus": [gpu(3, 0x09), gpu(4, 0x0a)] }
        ]
    })
}
