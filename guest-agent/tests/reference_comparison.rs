//! The runs of `guest-agent/bench/compare-with-reference.sh` on 2 and 4 NVLink H200s
//! (`nvidia-h200-x2`, `nvidia-h200-x4`, 2026-11-28; `tests/fixtures/agent/reference-comparison/`),
//! replayed: 5 processes each of the reference probe (every ordered pair), the team's
//! probe as it is, p2pBandwidthLatencyTest and the agent's full report, alternating; agent
//! runs with `CUDA_DEVICE_MAX_CONNECTIONS=8`; the 4-byte copy on 8 streams; the NCCL stage
//! with NCCL's own topology detection, with the host's topology file and with a wrong one.

use std::path::PathBuf;

use assert_cmd::Command;
use serde_json::Value;
use vfio_p2p_agent::bench::pingpong::Placements;
use vfio_p2p_agent::bench::{BenchPlan, PairBench};
use vfio_p2p_agent::report::Report;

const RUNS: usize = 5;

/// The spread over 5 processes allowed to each statistic of the one-way distribution
/// (issue 42: 3 %).
const STEADY: f64 = 3.0;

/// The machines recorded, with their GPU count.
const MACHINES: [(&str, usize); 2] = [("h200x2", 2), ("h200x4", 4)];

fn fixture(m: &str, name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/agent/reference-comparison")
        .join(m)
        .join(name)
}

fn text(m: &str, name: &str) -> String {
    std::fs::read_to_string(fixture(m, name)).unwrap_or_else(|e| panic!("{m}/{name}: {e}"))
}

fn reports(m: &str) -> Vec<Report> {
    (1..=RUNS)
        .map(|i| serde_json::from_str(&text(m, &format!("report-{i}.json"))).unwrap())
        .collect()
}

/// Every ordered pair of `n` GPUs.
fn ordered(n: usize) -> Vec<(usize, usize)> {
    (0..n)
        .flat_map(|s| (0..n).filter(move |&d| d != s).map(move |d| (s, d)))
        .collect()
}

/// The CUDA ordinal of each ordered pair's GPUs in a report.
fn ordinals(r: &Report, src: pci_config::Bdf, dst: pci_config::Bdf) -> (usize, usize) {
    let o = |b| r.gpus.iter().find(|g| g.bus_id == b).unwrap().ordinal as usize;
    (o(src), o(dst))
}

/// Every bench of ordered pair `(s, d)` over the 5 processes.
fn benches(m: &str, s: usize, d: usize) -> Vec<PairBench> {
    reports(m)
        .iter()
        .flat_map(|r| {
            r.pairs
                .iter()
                .filter(|p| ordinals(r, p.src, p.dst) == (s, d))
                .map(|p| p.bench.clone().unwrap())
                .collect::<Vec<_>>()
        })
        .collect()
}

/// A figure of the probe's outputs `probe-S-D-I.txt` (and the team's probe as it is,
/// `ref-I.txt`, for 0→1), one per process.
fn probe(m: &str, s: usize, d: usize, prefix: &str) -> Vec<f64> {
    let mut files: Vec<String> = (1..=RUNS)
        .map(|i| format!("probe-{s}-{d}-{i}.txt"))
        .collect();
    if (s, d) == (0, 1) && prefix == "pingpong one-way latency" {
        files.extend((1..=RUNS).map(|i| format!("ref-{i}.txt")));
    }
    files
        .iter()
        .filter_map(|f| {
            text(m, f).lines().find_map(|l| {
                let rest = l.strip_prefix(prefix)?;
                if l.contains("disabled") {
                    return None;
                }
                rest.split_whitespace().find_map(|w| w.parse::<f64>().ok())
            })
        })
        .collect()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// (max − min) / median over processes, in percent.
fn spread(v: &[f64]) -> f64 {
    let (lo, hi) = v
        .iter()
        .fold((f64::INFINITY, 0f64), |(l, h), &x| (l.min(x), h.max(x)));
    (hi - lo) / median(v.to_vec()) * 100.0
}

/// The wall time the script recorded for `name` (timings.txt).
fn wall(m: &str, name: &str) -> f64 {
    let t = text(m, "timings.txt");
    let line = t
        .lines()
        .find(|l| l.split_whitespace().next() == Some(name))
        .unwrap_or_else(|| panic!("no wall for {name}"));
    assert!(line.contains("rc=0"), "{line}");
    line.split_whitespace()
        .find_map(|w| w.parse::<f64>().ok().filter(|_| w.contains('.')))
        .unwrap()
}

/// Issue 42 asks for the report at most p2pBandwidthLatencyTest's wall: 2 GPUs 0.789
/// against 0.825 s (0.96×), 4 GPUs 2.084 against 2.501 s (0.83×), medians of 5 alternating.
#[test]
fn recorded_reports_are_of_the_full_plan_and_within_p2p_bandwidth_latency_tests_wall() {
    for (m, n) in MACHINES {
        for r in reports(m) {
            assert_eq!(r.pairs.len(), n * (n - 1));
            for p in &r.pairs {
                assert_eq!(
                    p.bench.as_ref().unwrap().plan,
                    BenchPlan::FULL,
                    "{m}: re-record"
                );
            }
        }
        let walls = |f: &str| {
            median(
                (1..=RUNS)
                    .map(|i| wall(m, &f.replace('I', &i.to_string())))
                    .collect(),
            )
        };
        let (report, blt) = (walls("report-I.json"), walls("p2pblt-I.txt"));
        assert!(
            report <= blt,
            "{m}: report {report} s, p2pBandwidthLatencyTest {blt} s"
        );
    }
}

/// The recorded distribution rebuilt from its passes by the agent's rule: each place the
/// mean of its passes, the min the fastest pass ([`Placements::of_passes`]).
fn rebuilt(pl: &Placements) -> Placements {
    Placements::of_passes(&pl.offsets, pl.passes_us.clone()).unwrap()
}

/// One-way latency as a distribution over the same 48 flag places, rebuilt from every
/// recorded pass by the agent's rule (so a change of the rule shows here): it equals what
/// each process reported; the min (the fastest pass), the median (the verdict's
/// statistic), the quarters' means and the max steady over 5 processes within [`STEADY`];
/// the probe's figure (every process of it) inside each process's range ±2 %, and each
/// statistic's place named.
#[test]
fn one_way_latency_distribution_is_stable_and_holds_the_probes_figure() {
    for (m, n) in MACHINES {
        for (s, d) in ordered(n) {
            let b = benches(m, s, d);
            assert_eq!(b.len(), RUNS);
            let places: Vec<Placements> = b
                .iter()
                .map(|x| x.one_way_placements.clone().unwrap())
                .collect();
            for (x, pl) in b.iter().zip(&places) {
                let passes = BenchPlan::FULL.pingpong_rounds_per_place;
                assert_eq!((pl.figure.as_str(), pl.rounds_per_place), ("mean", passes));
                assert_eq!((pl.timing.as_str(), pl.passes_us.len()), ("kernel", passes));
                let again = rebuilt(pl);
                let (got, said) = (again.stat(), x.one_way_latency_us.clone().unwrap());
                for (g, r) in [
                    (got.min, said.min),
                    (got.median, said.median),
                    (got.max, said.max),
                ] {
                    assert!(
                        (g - r).abs() < 1e-9,
                        "{m} {s}->{d}: rebuilt {g}, reported {r}"
                    );
                }
                assert_eq!((again.min_at, again.max_at), (pl.min_at, pl.max_at));
                assert_eq!(again.one_way_latency_us.len(), pl.one_way_latency_us.len());
                for (a, r) in again.one_way_latency_us.iter().zip(&pl.one_way_latency_us) {
                    assert!(
                        (a - r).abs() < 1e-9,
                        "{m} {s}->{d}: rebuilt {a}, reported {r}"
                    );
                }
            }
            let rebuilt: Vec<Placements> = places.iter().map(rebuilt).collect();
            let of = |f: fn(&Placements) -> f64| -> Vec<f64> { rebuilt.iter().map(f).collect() };
            for (name, v, limit) in [
                ("min", of(|p| p.stat().min), STEADY),
                (
                    "fastest quarter",
                    of(|p| p.fastest_quarter_us.unwrap()),
                    STEADY,
                ),
                ("median", of(|p| p.stat().median), STEADY),
                (
                    "slowest quarter",
                    of(|p| p.slowest_quarter_us.unwrap()),
                    STEADY,
                ),
                ("max", of(|p| p.stat().max), STEADY),
            ] {
                assert!(
                    spread(&v) <= limit,
                    "{m} {s}->{d} {name}: {v:?} spread {:.1} %",
                    spread(&v)
                );
            }
            let probes = probe(m, s, d, "pingpong one-way latency");
            assert!(probes.len() >= RUNS);
            for x in &b {
                let l = x.one_way_latency_us.as_ref().unwrap();
                let pl = x.one_way_placements.as_ref().unwrap();
                assert_eq!(
                    pl.offsets,
                    b[0].one_way_placements.as_ref().unwrap().offsets
                );
                assert_eq!(pl.offsets.len(), BenchPlan::FULL.pingpong_positions);
                assert!([pl.min_at, pl.median_at, pl.max_at]
                    .iter()
                    .all(|o| pl.offsets.contains(o)));
                for p in &probes {
                    assert!(
                        l.min * 0.98 <= *p && *p <= l.max * 1.02,
                        "{m} {s}->{d}: probe {p} outside {}–{}",
                        l.min,
                        l.max
                    );
                }
            }
        }
    }
}

/// One figure of a pair's bench.
type Figure = fn(&PairBench) -> f64;

/// Remote read and the copy bandwidths within 2 % of the probe (medians over processes).
#[test]
fn remote_read_and_bandwidths_are_within_2_percent_of_the_probe() {
    for (m, n) in MACHINES {
        for (s, d) in ordered(n) {
            let b = benches(m, s, d);
            let figures: [(&str, Figure); 3] = [
                ("remote read pointer-chase latency", |b| {
                    b.remote_read_latency_us.median
                }),
                ("uni bw", |b| b.ce_bandwidth_gbps.median),
                ("bidir bw", |b| b.ce_bidir_bandwidth_gbps.median),
            ];
            for (prefix, f) in figures {
                let agent = median(b.iter().map(f).collect());
                let probe = median(probe(m, s, d, prefix));
                assert!(
                    (agent / probe - 1.0).abs() <= 0.02,
                    "{m} {s}->{d} {prefix}: agent {agent}, probe {probe}"
                );
            }
        }
    }
}

/// The 4-byte copy's modes: every process reports them with their streams; over the
/// processes both modes show, as in the probe's own processes.
#[test]
fn the_4_byte_copys_modes_are_reported_with_their_streams() {
    for (m, n) in MACHINES {
        let (mut seen, mut p) = (Vec::new(), Vec::new());
        for (s, d) in ordered(n) {
            for b in benches(m, s, d) {
                let streams: usize = b.memcpy_modes.iter().map(|m| m.count).sum();
                assert_eq!(streams, b.plan.memcpy_streams);
                assert_eq!(b.memcpy_latency_by_stream_us.len(), b.plan.memcpy_streams);
                seen.extend(b.memcpy_modes.iter().map(|m| m.us));
            }
            p.extend(probe(m, s, d, "memcpyPeerAsync 4B per-copy"));
        }
        for (who, v) in [("the probe", &p), ("the agent", &seen)] {
            let (lo, hi) = v
                .iter()
                .fold((f64::INFINITY, 0f64), |(l, h), &x| (l.min(x), h.max(x)));
            assert!(hi / lo > 1.2, "{m}: {who}'s 4-byte copy is bimodal: {v:?}");
        }
    }
}

/// Each pair's figures against its link: NV18 H200, every figure passing with its
/// threshold in the JSON and in the replayed table.
#[test]
fn every_pair_has_a_verdict_against_its_link_with_the_threshold() {
    for r in MACHINES.iter().flat_map(|(m, _)| reports(m)) {
        for p in &r.pairs {
            let v = p.link_verdict.as_ref().expect("a link verdict");
            assert!(v.ok, "{}", v.line);
            assert_eq!(v.expectation.uni_gbps, 450.0);
            assert!(v.figures.iter().all(|f| f.threshold > 0.0 && f.pass));
            assert!(p.summary.contains("link 18 × NVLink 4"), "{}", p.summary);
        }
    }
    let out = Command::cargo_bin("vfio-p2p-agent")
        .unwrap()
        .env("COLUMNS", "200")
        .args(["report", "--from"])
        .arg(fixture("h200x2", "report-1.json"))
        .output()
        .unwrap();
    // Long lines wrap with a two-space indent: join them.
    let table = String::from_utf8_lossy(&out.stdout).replace("\n  ", " ");
    assert_eq!(out.status.code(), Some(0), "{table}");
    assert!(
        table.contains("every figure passes; closest: ce_bidir_bandwidth_gbps 0.86×"),
        "{table}"
    );
    assert!(table.contains("(needs 0.80×)"), "{table}");
}

/// The nvbandwidth testcase of each figure is in the JSON as recorded.
#[test]
fn the_json_names_the_nvbandwidth_testcases() {
    let v: Value = serde_json::from_str(&text("h200x2", "report-1.json")).unwrap();
    let t = &v["pairs"][0]["bench"]["nvbandwidth_testcases"];
    assert_eq!(t["ce_bandwidth_gbps"], "device_to_device_memcpy_write_ce");
    assert_eq!(
        t["ce_bidir_bandwidth_gbps"],
        "device_to_device_bidirectional_memcpy_write_ce"
    );
    assert_eq!(
        t["sm_copy_bandwidth_gbps"],
        "device_to_device_memcpy_write_sm"
    );
    assert_eq!(t["remote_read_latency_us"], "device_to_device_latency_sm");
}

/// NCCL: passes with its own detection and the host's file, fails on the wrong file
/// naming why; without the library the stage says so.
#[test]
fn nccl_passes_with_and_without_the_host_file_and_fails_on_a_wrong_one() {
    for (m, n) in MACHINES {
        let runs = |name: &str| -> Vec<Value> {
            let v: Value = serde_json::from_str(&text(m, name)).unwrap();
            v["runs"].as_array().unwrap().clone()
        };
        let auto = runs("nccl-auto.json");
        assert_eq!(auto.len(), 1);
        assert_eq!(auto[0]["topology"], "auto");
        let host = runs("nccl-host-file.json");
        assert_eq!(host.len(), 2);
        for r in auto.iter().chain(&host) {
            assert_eq!(r["ok"], true, "{}", r["verdict"]);
            assert!(r["verdict"]
                .as_str()
                .unwrap()
                .contains("every element of every rank summed right"));
            assert!(r["busbw_gbps"].as_f64().unwrap() >= 0.5 * 450.0);
            assert_eq!(r["ranks"].as_array().unwrap().len(), n);
            for rank in r["ranks"].as_array().unwrap() {
                assert_eq!(rank["wrong"], 0);
                assert_eq!(rank["checked"], 64 << 20);
            }
        }
        let wrong = runs("nccl-wrong-file.json");
        assert_eq!(wrong[0]["ok"], true);
        assert_eq!(wrong[1]["ok"], false);
        let why = wrong[1]["verdict"].as_str().unwrap();
        assert!(why.starts_with("SLOW with the topology file"), "{why}");
        assert!(
            why.contains("the file gives GPU 0000:00:06.0 1 NVLink, NVML sees 18 active"),
            "{why}"
        );
        assert!(why.contains("SLOW against the link"), "{why}");
        assert!(text(m, "nccl-no-library.txt")
            .starts_with("NCCL stage skipped: /nonexistent/libnccl.so.2"));
    }
}

/// The bench table's note says what the report holds: this agent's places (each the mean of
/// its passes, the min the fastest pass), or an earlier agent's read with `report --from`
/// (each the median of its passes, the min the fastest place's).
#[test]
fn the_bench_note_describes_the_reports_own_rule() {
    let bench = |v: &Value| -> String {
        let b: PairBench = serde_json::from_value(v.clone()).unwrap();
        // Lines wrap: join them to read the note as one.
        vfio_p2p_agent::render::bench(&[b])
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    };
    let report: Value = serde_json::from_str(&text("h200x2", "report-1.json")).unwrap();
    let mut b = report["pairs"][0]["bench"].clone();
    let now = bench(&b);
    assert!(
        now.contains("each place the mean of its 24 passes"),
        "{now}"
    );
    assert!(
        now.contains("flag places: the fastest pass at any place – the slowest place"),
        "{now}"
    );
    let pl = b["one_way_placements"].as_object_mut().unwrap();
    pl.remove("fastest_pass_us");
    pl.insert("figure".into(), "median".into());
    let before = bench(&b);
    assert!(
        before.contains("each place the median of its 24 passes"),
        "{before}"
    );
    assert!(
        before.contains("flag places: the fastest–slowest place"),
        "{before}"
    );
}
