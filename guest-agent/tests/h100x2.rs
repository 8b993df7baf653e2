//! The run on a VM with two NVLink H100s (a bench script of the time, since folded into
//! `guest-agent/bench/compare-with-reference.sh`, on `nvidia-h100-x2`, 2026-11-25): the report of the current full plan, and (`plan-compare/`)
//! three processes of the previous plan beside three of this one, alternating, in one run
//! on the same GPUs.

use std::path::PathBuf;

use assert_cmd::Command;
use serde_json::Value;
use vfio_p2p_agent::bench::{BenchPlan, PairBench};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/agent/h100x2")
        .join(name)
}

fn json(name: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(fixture(name)).unwrap()).unwrap()
}

/// The bench of each ordered pair of a recorded report, in its order.
fn benches(report: &Value) -> Vec<PairBench> {
    report["pairs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| serde_json::from_value(p["bench"].clone()).unwrap())
        .collect()
}

/// The full plan as recorded here, issue 17's: before the ping-pong's adaptive stop and
/// the shorter batches of issue 31 (`tests/fixtures/agent/h100-nvswitch` has the runs with them).
const ISSUE17_PLAN: BenchPlan = BenchPlan {
    samples: 5,
    pingpong_samples: 9,
    pingpong_positions: 5,
    pingpong_rounds_per_place: 0,
    pingpong_iters: 5_000,
    chase_steps: 10_000,
    local_chase_steps: 0,
    chase_words: 1 << 22,
    memcpy_copies: 2_000,
    memcpy_streams: 0,
    bw_bytes: 256 << 20,
    bw_copies: 10,
    disabled_copies: 4,
    disabled_bytes: 0,
    disabled_memcpy_copies: 500,
    bidir_gate: false,
    warmup_rounds: 1,
    min_samples: 3,
    target_spread_permille: 10,
    pingpong_min_samples: 0,
};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[test]
fn recorded_report_is_the_full_plan_within_the_time_and_judges_ok() {
    let report = json("report.json");
    let elapsed = report["elapsed_s"].as_f64().unwrap();
    assert!(elapsed <= 2.5, "the recorded full report took {elapsed} s");
    for b in benches(&report) {
        assert_eq!(
            b.plan, ISSUE17_PLAN,
            "re-record the fixture after changing BenchPlan::FULL"
        );
        let ce = b.ce_bandwidth_gbps.median;
        assert!((ce - 396.0).abs() < 396.0 * 0.02, "CE {ce} GB/s");
    }
    let out = Command::cargo_bin("vfio-p2p-agent")
        .unwrap()
        .env("COLUMNS", "120")
        .args(["report", "--from"])
        .arg(fixture("report.json"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert_eq!(
        text.matches("P2P OK over NVLink (NV18)").count(),
        2,
        "{text}"
    );
}

/// Every median of the current plan, over its three processes, against the previous
/// plan's over three processes of the same run: within 1 % (peer-disabled bandwidth,
/// which moves 1.5 % between processes of either plan: 2 %); the one-way latency within
/// the previous plan's spread over flag places. The 4-byte copy latencies are left out:
/// they move between processes of either plan by more than that (1.6–2.6 µs,
/// 14.8–18.7 µs with peer access disabled), see guest-agent/README.md.
#[test]
fn shorter_batches_keep_the_previous_plans_medians() {
    let runs = |kind: &str| -> Vec<Vec<PairBench>> {
        (1..=3)
            .map(|i| benches(&json(&format!("plan-compare/{kind}-{i}.json"))))
            .collect()
    };
    let (old, new) = (runs("old"), runs("new"));
    assert!(old
        .iter()
        .flatten()
        .all(|b| b.plan.pingpong_iters == 100_000));
    assert!(new.iter().flatten().all(|b| b.plan == ISSUE17_PLAN));
    type Figure = fn(&PairBench) -> f64;
    let figures: [(&str, Figure, f64); 6] = [
        ("remote read", |b| b.remote_read_latency_us.median, 0.01),
        ("local read", |b| b.local_read_latency_us.median, 0.01),
        ("CE", |b| b.ce_bandwidth_gbps.median, 0.01),
        ("CE both ways", |b| b.ce_bidir_bandwidth_gbps.median, 0.01),
        ("SM copy", |b| b.sm_copy_bandwidth_gbps.median, 0.01),
        ("disabled", |b| b.disabled_bandwidth_gbps.median, 0.02),
    ];
    for dir in 0..2 {
        let of =
            |runs: &[Vec<PairBench>], f: Figure| median(runs.iter().map(|r| f(&r[dir])).collect());
        for (name, f, tolerance) in figures {
            let (o, n) = (of(&old, f), of(&new, f));
            assert!(
                (n / o - 1.0).abs() <= tolerance,
                "pair {dir} {name}: {n} against {o}"
            );
        }
        let one_way = |b: &PairBench| b.one_way_latency_us.as_ref().unwrap().median;
        let n = of(&new, one_way);
        let low = old
            .iter()
            .map(|r| one_way(&r[dir]))
            .fold(f64::INFINITY, f64::min);
        let high = old
            .iter()
            .map(|r| {
                r[dir]
                    .pingpong_position_spread
                    .as_ref()
                    .unwrap()
                    .one_way_latency_us
                    .max
            })
            .fold(0.0, f64::max);
        assert!(
            (low..=high).contains(&n),
            "pair {dir} one-way {n} outside {low}–{high}"
        );
    }
}
