//! The runs of the H100 bench script (in git history; its successor is
//! `guest-agent/bench/compare-with-reference.sh`) on 2 and 4 NVLink H100s behind NVSwitch
//! (`nvidia-h100-x2`, `nvidia-h100-x4`, 2026-11-26), replayed: the full report beside
//! p2pBandwidthLatencyTest and the reference probe, cross-process with a child per GPU,
//! the `--inject` self-test, and the fabric check (issue 30) passing and failing. `*-one-queue`:
//! the same script's runs of the build with one hardware queue a context, the staged
//! copies 4 × 64 MiB, no dropped warm-up round and the both-ways copies started at a gate
//! (5 processes of each side by side, `ideas/` the alternatives measured before).

use std::path::PathBuf;

use assert_cmd::Command;
use serde_json::Value;
use vfio_p2p_agent::bench::BenchPlan;
use vfio_p2p_agent::expect::ExpectReport;
use vfio_p2p_agent::fabric;
use vfio_p2p_contract::Expectation;

const MACHINES: [(&str, usize); 4] = [
    ("h100x2", 2),
    ("h100x4", 4),
    ("h100x2-one-queue", 2),
    ("h100x4-one-queue", 4),
];

/// The first recordings (3 processes of each side by side): issue 31's short batches.
const SHORT_BATCHES: [(&str, usize); 2] = [("h100x2", 2), ("h100x4", 4)];

/// The recordings of the build with one hardware queue a context (5 processes of each).
const ONE_QUEUE: [(&str, usize); 2] = [("h100x2-one-queue", 2), ("h100x4-one-queue", 4)];

fn fixture(machine: &str, name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/agent/h100-nvswitch")
        .join(machine)
        .join(name)
}

fn text(machine: &str, name: &str) -> String {
    std::fs::read_to_string(fixture(machine, name)).unwrap()
}

fn json(machine: &str, name: &str) -> Value {
    serde_json::from_str(&text(machine, name)).unwrap()
}

/// `report --from FILE`: its exit status and table.
fn replay(machine: &str, name: &str) -> (i32, String) {
    let out = Command::cargo_bin("vfio-p2p-agent")
        .unwrap()
        .env("COLUMNS", "200")
        .args(["report", "--from"])
        .arg(fixture(machine, name))
        .output()
        .unwrap();
    (
        out.status.code().unwrap(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// The wall time step.sh recorded for `name`.
fn wall(machine: &str, name: &str) -> f64 {
    let t = text(machine, "timings.txt");
    let line = t
        .lines()
        .find(|l| l.split_whitespace().next() == Some(name))
        .unwrap_or_else(|| panic!("{name} in timings.txt"));
    let s = line.split_whitespace().nth(2).unwrap();
    s.parse().unwrap()
}

#[test]
fn the_full_report_judges_ok_with_every_pair_measured_and_ce_as_the_probe() {
    for (m, n) in MACHINES {
        let (code, table) = replay(m, "report.json");
        assert_eq!(code, 0, "{m}: {table}");
        let r = json(m, "report.json");
        let pairs = r["pairs"].as_array().unwrap();
        assert_eq!(pairs.len(), n * (n - 1), "{m}");
        // The reference probe measured GPU 0 → 1 (p2p_lat.txt, `uni bw 0->1`).
        let probe: f64 = text(m, "p2p_lat.txt")
            .lines()
            .find_map(|l| l.strip_prefix("uni bw 0->1: "))
            .and_then(|v| v.trim_end_matches(" GB/s").parse().ok())
            .unwrap();
        // Within 1 % on 2 GPUs (396.2 against 396.5); on 4 GPUs the probe's one run read
        // 391.1 against the agent's median 395.5 (1.1 %), while p2pBandwidthLatencyTest
        // read 361-376 GB/s from GPU 0 and 392-394 from the others in the same run.
        let ce = pairs[0]["bench"]["ce_bandwidth_gbps"]["median"]
            .as_f64()
            .unwrap();
        let tolerance = if n == 2 { 0.01 } else { 0.015 };
        assert!(
            (ce - probe).abs() <= probe * tolerance,
            "{m}: CE {ce} against the probe's {probe}"
        );
        assert!(
            table.contains("on this fabric 8 GPUs go disjoint pairs at once"),
            "{table}"
        );
    }
}

#[test]
fn cross_process_checks_every_pair_and_kind_with_a_child_per_gpu() {
    for (m, n) in MACHINES {
        let x: Vec<Value> = serde_json::from_value(json(m, "cross-process.json")).unwrap();
        assert_eq!(
            x.len(),
            n * (n - 1) * 2,
            "{m}: every ordered pair, both handle kinds"
        );
        for c in &x {
            assert!(c["error"].is_null(), "{m}: {c}");
            assert_eq!(c["write"]["bad_words"], 0, "{m}: {c}");
            assert_eq!(c["words"], 16 << 20);
        }
        for kind in ["posix_fd", "legacy"] {
            assert_eq!(x.iter().filter(|c| c["kind"] == kind).count(), n * (n - 1));
        }
        // the recorded wall of all the checks (the issue asks at most 3 s on 4 GPUs)
        assert!(wall(m, "cross-process.json") <= 3.0, "{m}");
        let (code, table) = replay(m, "report-cross-process.json");
        assert_eq!(code, 0, "{m}: {table}");
    }
}

#[test]
fn the_self_test_flags_exactly_the_destination_word_and_never_the_source() {
    for (m, n) in MACHINES {
        let (code, table) = replay(m, "inject-report.json");
        assert_eq!(
            code, 1,
            "{m}: a corrupted destination word fails the report"
        );
        let r = json(m, "inject-report.json");
        let pairs = r["pairs"].as_array().unwrap();
        assert_eq!(pairs.len(), n * (n - 1));
        for p in pairs {
            let v = &p["verify"];
            assert_eq!(v["injected"]["dst_words"], serde_json::json!([4097]));
            assert_eq!(v["injected"]["src_words"], serde_json::json!([12]));
            for write in ["kernel_write", "ce_copy"] {
                assert_eq!(v[write]["bad_words"], 1, "{m}: {p}");
                assert_eq!(v[write]["first_bad"], 4097, "{m}: {p}");
            }
        }
        assert_eq!(
            table.matches("(first at word 4097)").count(),
            2 * n * (n - 1),
            "{table}"
        );
        assert_eq!(
            table.matches("self-test passed").count(),
            n * (n - 1),
            "{table}"
        );
        assert!(!table.contains("word 12 "), "{table}");
        // the source's word alone: every pair still OK
        let v: Vec<Value> = serde_json::from_value(json(m, "inject-src-only.json")).unwrap();
        assert_eq!(v.len(), n * (n - 1));
        for p in &v {
            assert_eq!(
                (
                    p["kernel_write"]["bad_words"].as_u64(),
                    p["ce_copy"]["bad_words"].as_u64()
                ),
                (Some(0), Some(0))
            );
        }
    }
}

/// The fabric report of a recorded `expect --format json`.
fn recorded_fabric(machine: &str, name: &str) -> fabric::FabricReport {
    let r: ExpectReport = serde_json::from_value(json(machine, name)).unwrap();
    r.fabric.expect("a planned fabric was checked")
}

fn plan(machine: &str, name: &str) -> Expectation {
    Expectation::from_json(&text(machine, name)).unwrap()
}

#[test]
fn the_fabric_check_passes_as_planned_and_fails_on_a_swapped_module_id() {
    for (m, n) in MACHINES {
        let good = recorded_fabric(m, "expect-good.json");
        assert!(good.problems.is_empty(), "{m}: {:?}", good.problems);
        assert_eq!(good.gpus.len(), n);
        for g in &good.gpus {
            assert_eq!(
                (g.found.state, g.found.status),
                (Some(fabric::STATE_COMPLETED), Some(0))
            );
        }
        // judged again from the recorded readings: the same verdicts
        let view = good.view();
        assert_eq!(fabric::judge(&view, Some(&plan(m, "plan-good.json"))), good);
        let wrong = recorded_fabric(m, "expect-wrong-module.json");
        assert_eq!(
            fabric::judge(&view, Some(&plan(m, "plan-wrong-module.json"))),
            wrong
        );
        assert_eq!(wrong.mismatches(), 2, "{m}: {:?}", wrong.problems);
        assert!(wrong
            .problems
            .iter()
            .all(|p| p.contains("the host planned module")));
        assert_eq!(replay(m, "report-expect-good.json").0, 0, "{m}");
        let (code, table) = replay(m, "report-expect-wrong-module.json");
        assert_eq!(code, 1, "{m}");
        assert!(
            table.contains("DIFFERS") && table.contains("the host planned module"),
            "{table}"
        );
    }
}

/// The processes recorded side by side of each build: 3, or 5 in the one-queue runs.
fn runs(machine: &str) -> usize {
    if machine.ends_with("one-queue") {
        5
    } else {
        3
    }
}

/// Median over the processes `side-by-side/{who}-N.json` of each pair's median of
/// `metric`, by "src->dst".
fn medians(machine: &str, who: &str, metric: &str) -> Vec<(String, f64)> {
    let runs: Vec<Value> = (1..=runs(machine))
        .map(|i| json(machine, &format!("side-by-side/{who}-{i}.json")))
        .collect();
    let pairs = runs[0]["pairs"].as_array().unwrap();
    (0..pairs.len())
        .map(|p| {
            let mut v: Vec<f64> = runs
                .iter()
                .map(|r| r["pairs"][p]["bench"][metric]["median"].as_f64().unwrap())
                .collect();
            v.sort_by(f64::total_cmp);
            let pair = &runs[0]["pairs"][p];
            (format!("{}->{}", pair["src"], pair["dst"]), v[v.len() / 2])
        })
        .collect()
}

/// The largest |this build − previous build| of `metric` over the pairs, in % of the
/// previous build's median.
fn largest_shift(machine: &str, metric: &str) -> f64 {
    let new = medians(machine, "report", metric);
    let base = medians(machine, "base", metric);
    new.iter()
        .zip(&base)
        .map(|((a, x), (b, y))| {
            assert_eq!(a, b);
            ((x - y) / y * 100.0).abs()
        })
        .fold(0.0, f64::max)
}

#[test]
fn the_short_batches_keep_the_medians_of_the_previous_build() {
    for (m, _) in SHORT_BATCHES {
        let plan = &json(m, "report.json")["pairs"][0]["bench"]["plan"];
        assert_eq!(
            (plan["bw_copies"].as_u64(), plan["disabled_copies"].as_u64()),
            (Some(3), Some(1))
        );
        assert_eq!(plan["local_chase_steps"], 10_000, "{m}");
        let base_plan = &json(m, "side-by-side/base-1.json")["pairs"][0]["bench"]["plan"];
        assert_eq!(
            base_plan["bw_copies"], 10,
            "{m}: the previous build's batches"
        );
        // Within 1 %: the copy-engine and SM-copy bandwidths and both pointer chases.
        for metric in [
            "ce_bandwidth_gbps",
            "sm_copy_bandwidth_gbps",
            "remote_read_latency_us",
            "local_read_latency_us",
        ] {
            let d = largest_shift(m, metric);
            assert!(d < 1.0, "{m}: {metric} moved {d:.2} %");
        }
        // Not within 1 % (README, the report beside p2pBandwidthLatencyTest): both ways at once 1.1 % lower (3 copies a way
        // start apart by more of a batch), peer-disabled 1.2–2.0 % higher (one staged
        // copy a sample instead of 4).
        let bidir = largest_shift(m, "ce_bidir_bandwidth_gbps");
        let disabled = largest_shift(m, "disabled_bandwidth_gbps");
        assert!(
            bidir < 1.2 && disabled < 2.1,
            "{m}: {bidir:.2} % / {disabled:.2} %"
        );
    }
}

#[test]
fn four_gpus_report_within_p2p_bandwidth_latency_tests_wall_and_8_gpus_under_5_s() {
    let median = |name: &str| median_wall("h100x4", name);
    assert!(
        median("report") <= median("p2pblt"),
        "{} {}",
        median("report"),
        median("p2pblt")
    );
    for (m, _) in MACHINES {
        let est = json(m, "report.json")["schedule"]["total_s"]
            .as_f64()
            .unwrap();
        assert!(est <= 5.0, "{m}: 8-GPU estimate {est} s");
    }
}

/// The median of the recorded walls of `name`-1..N (p2pBandwidthLatencyTest's `.txt`).
fn median_wall(m: &str, name: &str) -> f64 {
    let mut v: Vec<f64> = (1..=runs(m))
        .map(|i| {
            let ext = if name == "p2pblt" { "txt" } else { "json" };
            wall(m, &format!("{name}-{i}.{ext}"))
        })
        .collect();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[test]
fn one_queue_report_is_within_p2p_bandwidth_latency_tests_wall_on_2_and_4_gpus() {
    for (m, _) in ONE_QUEUE {
        let (report, p2pblt) = (median_wall(m, "report"), median_wall(m, "p2pblt"));
        assert!(
            report <= p2pblt,
            "{m}: report {report} s, p2pblt {p2pblt} s"
        );
        let plan: BenchPlan =
            serde_json::from_value(json(m, "report.json")["pairs"][0]["bench"]["plan"].clone())
                .unwrap();
        // The full plan of that build (issue 42 changed the ping-pong and the 4-byte
        // copy; `tests/fixtures/agent/reference-comparison` holds the runs of the plan now).
        assert_eq!(
            plan,
            BenchPlan {
                pingpong_samples: 9,
                pingpong_positions: 5,
                pingpong_rounds_per_place: 0,
                pingpong_iters: 1_000,
                memcpy_copies: 1_000,
                memcpy_streams: 0,
                disabled_copies: 4,
                disabled_memcpy_copies: 200,
                pingpong_min_samples: 5,
                ..BenchPlan::FULL
            },
            "{m}: the plan of the one-queue build"
        );
        let summary = text(m, "summary.txt");
        assert!(
            summary.contains("report / p2pBandwidthLatencyTest: 0."),
            "{m}"
        );
    }
}

#[test]
fn one_queue_keeps_the_medians_of_the_earlier_batches() {
    for (m, n) in ONE_QUEUE {
        // Within 1 % of the build before issue 31's batches (side by side, 5 processes
        // each): both bandwidths of the copy engines, the SM copy and both pointer chases.
        for metric in [
            "ce_bandwidth_gbps",
            "ce_bidir_bandwidth_gbps",
            "sm_copy_bandwidth_gbps",
            "remote_read_latency_us",
            "local_read_latency_us",
        ] {
            let d = largest_shift(m, metric);
            assert!(d < 1.0, "{m}: {metric} moved {d:.2} %");
        }
        let disabled = largest_shift(m, "disabled_bandwidth_gbps");
        if n == 2 {
            assert!(disabled < 1.0, "{m}: peer-disabled moved {disabled:.2} %");
        } else {
            // On 4 GPUs two pairs run at once and their staged copies share the host: the
            // earlier build read 35.6–38.0 GB/s over the pairs, this one 37.3–38.1.
            let spread = |who: &str| {
                let v: Vec<f64> = medians(m, who, "disabled_bandwidth_gbps")
                    .into_iter()
                    .map(|(_, x)| x)
                    .collect();
                let (lo, hi) = v
                    .iter()
                    .fold((f64::MAX, 0f64), |(l, h), x| (l.min(*x), h.max(*x)));
                (hi - lo) / hi * 100.0
            };
            assert!(
                spread("report") < spread("base") && disabled < 5.0,
                "{m}: peer-disabled moved {disabled:.2} %, spread {:.2} % against {:.2} %",
                spread("report"),
                spread("base")
            );
        }
    }
}
