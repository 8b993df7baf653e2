//! How a saved report prints: every line within the width, and errors that name the file
//! by its role (issue 17, item 7).

use assert_cmd::Command;
use predicates::prelude::PredicateBooleanExt;
use predicates::str::contains;

const REPORT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../tests/fixtures/agent/h200x2-report.json"
);

#[test]
fn every_line_fits_the_width() {
    for columns in [80usize, 100, 120] {
        let out = Command::cargo_bin("vfio-p2p-agent")
            .unwrap()
            .env("COLUMNS", columns.to_string())
            .args(["report", "--from", REPORT])
            .assert()
            .success();
        let text = String::from_utf8(out.get_output().stdout.clone()).unwrap();
        let widest = text.lines().map(|l| l.chars().count()).max().unwrap();
        assert!(widest <= columns, "{widest} > {columns}:\n{text}");
        assert!(text.contains("→ 0000:00:07.0: P2P OK"), "{text}");
    }
}

#[test]
fn a_report_with_a_timing_line_after_it_is_called_a_report() {
    // What bench/multi-gpu.sh used to write: the JSON, then its wall time on the same stream.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("report.json");
    let mut text = std::fs::read_to_string(REPORT).unwrap();
    text.push_str("6.93 s (exit 0)");
    std::fs::write(&path, text).unwrap();
    Command::cargo_bin("vfio-p2p-agent")
        .unwrap()
        .arg("report")
        .arg("--from")
        .arg(&path)
        .assert()
        .code(2)
        .stderr(contains("report ").and(contains("is not a report of this agent")))
        .stderr(contains("baseline").not());
    Command::cargo_bin("vfio-p2p-agent")
        .unwrap()
        .args(["report", "--from", REPORT, "--baseline"])
        .arg(&path)
        .assert()
        .code(2)
        .stderr(contains("baseline ").and(contains("is not a report of this agent")));
}

#[test]
fn eight_gpus_estimated_from_the_two_gpu_h200_run() {
    use vfio_p2p_agent::measure::Phases;
    use vfio_p2p_agent::report::Report;
    use vfio_p2p_agent::schedule::Fabric;
    let mut r: Report = serde_json::from_str(&std::fs::read_to_string(REPORT).unwrap()).unwrap();
    // Phases of a 2-GPU run: 1.0 s setup, 6.0 s for the two ordered pairs.
    let phases = Phases {
        verbose: false,
        laps: vec![
            ("scan and expectation".into(), 0.2),
            ("CUDA contexts (a thread per GPU; NVML beside)".into(), 0.5),
            ("peer access and ping-pong flags".into(), 0.1),
            ("kernels JIT-compiled (a thread per GPU)".into(), 0.2),
            ("verify (one-way writes checked)".into(), 1.0),
            ("bench (latency, bandwidth)".into(), 5.0),
        ],
    };
    let e = r.eight_gpu_estimate(&phases).unwrap();
    // NV18 between H200s: all 18 links to the peer → the NVSwitch fabric.
    assert_eq!(e.fabric, Fabric::NonBlocking);
    // 7 rounds of 4 pairs, each pair both ways at 3.0 s a direction.
    assert_eq!((e.rounds, e.pairs_per_round), (7, 4));
    assert!(
        (e.total_s - (0.5 * 8.0 + 2.0 * 3.0 * 7.0)).abs() < 1e-9,
        "{e:?}"
    );
    r.schedule = Some(e);
    r.phases = Some(phases);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.json");
    std::fs::write(&path, serde_json::to_string(&r).unwrap()).unwrap();
    Command::cargo_bin("vfio-p2p-agent")
        .unwrap()
        .env("COLUMNS", "300")
        .arg("report")
        .arg("--from")
        .arg(&path)
        .assert()
        .success()
        .stdout(contains("8 GPUs go disjoint pairs at once (NVSwitch fabric, non-blocking): 7 round(s) of 4 pair(s), estimated 46.0 s"))
        .stdout(contains("time: scan and expectation 0.20 s"));
}

#[test]
fn a_cross_process_section_is_shown_and_judged() {
    let mut r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(REPORT).unwrap()).unwrap();
    let result = |kind: &str, bad: u64| {
        serde_json::json!({"src": "0000:00:06.0", "dst": "0000:00:07.0", "kind": kind,
            "words": 16777216u64, "write": {"bad_words": bad, "first_bad": if bad > 0 { Some(0) } else { None }},
            "write_gbps": 350.0, "error": null})
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.json");
    r["cross_process"] = serde_json::json!([result("posix_fd", 0), result("legacy", 0)]);
    std::fs::write(&path, r.to_string()).unwrap();
    let run = || {
        Command::cargo_bin("vfio-p2p-agent")
            .unwrap()
            .env("COLUMNS", "200")
            .arg("report")
            .arg("--from")
            .arg(&path)
            .assert()
    };
    run()
        .success()
        .stdout(contains("posix-fd"))
        .stdout(contains("ok, checked on dst"));
    r["cross_process"] = serde_json::json!([result("posix_fd", 0), result("legacy", 7)]);
    std::fs::write(&path, r.to_string()).unwrap();
    run().code(1).stdout(contains("7 BAD (first 0)"));
}

fn round(
    pairs: &[(&str, &str)],
    concurrent: bool,
    verify_s: f64,
    bench_s: f64,
) -> serde_json::Value {
    let pairs: Vec<_> = pairs
        .iter()
        .map(|(a, b)| serde_json::json!([a, b]))
        .collect();
    let n = pairs.len();
    serde_json::json!({"pairs": pairs, "concurrent": concurrent,
        "why": if concurrent { "all 2 pairs non-blocking: NV18" } else { "one pair in this round" },
        "verify_s": verify_s, "bench_s": bench_s, "pair_bench_s": vec![bench_s; n]})
}

#[test]
fn the_rounds_are_printed_and_the_estimate_uses_them() {
    use vfio_p2p_agent::measure::Phases;
    use vfio_p2p_agent::report::Report;
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(REPORT).unwrap()).unwrap();
    v["rounds"] = serde_json::json!([round(&[("0000:00:06.0", "0000:00:07.0")], false, 0.2, 1.0)]);
    let r: Report = serde_json::from_value(v.clone()).unwrap();
    let phases = Phases {
        verbose: false,
        laps: vec![("CUDA contexts (a thread per GPU; NVML beside)".into(), 0.4)],
    };
    let e = r.eight_gpu_estimate(&phases).unwrap();
    // One round of one pair, both ways in 1.2 s: 0.6 s a direction.
    assert!((e.pair_s - 0.6).abs() < 1e-9, "{e:?}");
    assert!(
        (e.total_s - (0.2 * 8.0 + 2.0 * 0.6 * 7.0)).abs() < 1e-9,
        "{e:?}"
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.json");
    std::fs::write(&path, v.to_string()).unwrap();
    for columns in [80usize, 120] {
        let out = Command::cargo_bin("vfio-p2p-agent")
            .unwrap()
            .env("COLUMNS", columns.to_string())
            .arg("report")
            .arg("--from")
            .arg(&path)
            .assert()
            .success();
        let text = String::from_utf8(out.get_output().stdout.clone()).unwrap();
        let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(
            flat.contains("round 1: 0000:00:06.0 ↔ 0000:00:07.0: one pair at a time (one pair in this round); verify 0.20 s, bench 1.00 s"),
            "{text}"
        );
        assert!(text.lines().all(|l| l.chars().count() <= columns), "{text}");
    }
}

#[test]
fn a_simulated_schedule_prints_a_row_per_pair() {
    use vfio_p2p_agent::measure::SimulatedRun;
    use vfio_p2p_agent::schedule::RoundRecord;
    let r: vfio_p2p_agent::report::Report =
        serde_json::from_str(&std::fs::read_to_string(REPORT).unwrap()).unwrap();
    let benches: Vec<_> = r.pairs.iter().filter_map(|p| p.bench.clone()).collect();
    assert_eq!(benches.len(), 2);
    let gpu = r.gpus[0].bus_id;
    let rec = |k: usize| -> RoundRecord {
        serde_json::from_value(round(
            &[("0000:00:06.0", "0000:00:06.0"); 2],
            true,
            0.0,
            1.5 + k as f64,
        ))
        .unwrap()
    };
    let sim = SimulatedRun {
        simulated_gpus: 4,
        gpus: vec![gpu],
        rounds: (0..3).map(rec).collect(),
        schedule: vfio_p2p_agent::schedule::rounds(4),
        pairs: (0..6).flat_map(|_| benches.clone()).collect(),
        phases: None,
        elapsed_s: 8.0,
    };
    let text = vfio_p2p_agent::render::simulated(&sim);
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    assert_eq!(text.matches("at once").count(), 6, "{text}");
    assert!(flat.contains("0 ↔ 3"), "{text}");
    assert!(
        flat.contains("4 GPUs simulated on 0000:00:06.0: 3 round(s), 7.50 s of rounds"),
        "{text}"
    );
}

/// The bench table never breaks a number, an address or a header word (issue 29): at 80
/// and 120 columns every one of them stands whole on a line, and every line fits.
#[test]
fn the_bench_table_never_breaks_a_number() {
    for columns in [80usize, 120] {
        let out = Command::cargo_bin("vfio-p2p-agent")
            .unwrap()
            .env("COLUMNS", columns.to_string())
            .args(["report", "--from", REPORT])
            .assert()
            .success();
        let text = String::from_utf8(out.get_output().stdout.clone()).unwrap();
        let tokens: Vec<&str> = text.lines().flat_map(str::split_whitespace).collect();
        for whole in [
            "0000:00:06.0",
            "0000:00:07.0",
            "0.665",
            "0.647–0.692",
            "0.648–0.691",
            "394.5",
            "780.0",
            "367.7",
            "37.4",
            "17.87",
            "18.23",
            "±11%",
            "disabled",
            "one-way",
            "places",
        ] {
            assert!(
                tokens.contains(&whole),
                "{columns} columns: `{whole}` is not whole:\n{text}"
            );
        }
        let widest = text.lines().map(|l| l.chars().count()).max().unwrap();
        assert!(widest <= columns, "{widest} > {columns}:\n{text}");
    }
}
