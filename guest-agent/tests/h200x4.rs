//! The run on a VM with four NVLink H200s (`guest-agent/bench/multi-gpu.sh`): the recorded
//! report and the host tool's sysfs snapshot of that VM, beside the reference probe's output.

use std::path::PathBuf;

use assert_cmd::Command;
use serde_json::Value;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/agent/h200x4")
        .join(name)
}

/// One-way latency of the reference probe for a pair, from its recorded output.
fn probe_latency(src: u32, dst: u32) -> f64 {
    let text = std::fs::read_to_string(fixture("reference.txt")).unwrap();
    let section = text
        .split(&format!("pair {src}->{dst}"))
        .nth(1)
        .expect("pair in the probe output");
    let line = section
        .lines()
        .find(|l| l.starts_with("pingpong one-way latency"))
        .unwrap();
    line.split_whitespace()
        .rev()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn recorded_report_has_every_ordered_pair_and_judges_ok() {
    let out = Command::cargo_bin("vfio-p2p-agent")
        .unwrap()
        .args(["report", "--format", "json", "--from"])
        .arg(fixture("report.json"))
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let pairs = v["pairs"].as_array().unwrap();
    assert_eq!(pairs.len(), 12, "4 GPUs: 12 ordered pairs");
    for p in pairs {
        assert_eq!(p["as_expected"], true, "{p}");
    }
}

#[test]
fn one_way_latency_agrees_with_the_probe_on_the_same_gpus() {
    let text = std::fs::read_to_string(fixture("report.json")).unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    let latency = |a: &str, b: &str| {
        v["pairs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["src"] == a && p["dst"] == b)
            .and_then(|p| p["bench"]["one_way_latency_us"]["median"].as_f64())
            .unwrap_or_else(|| panic!("no one-way latency for {a} → {b}"))
    };
    for (src, dst, a, b) in [
        (0, 1, "0000:00:06.0", "0000:00:07.0"),
        (0, 3, "0000:00:06.0", "0000:00:09.0"),
    ] {
        let (agent, probe) = (latency(a, b), probe_latency(src, dst));
        assert!(
            (agent / probe - 1.0).abs() < 0.10,
            "{a} → {b}: agent {agent} µs, probe {probe} µs"
        );
    }
}
