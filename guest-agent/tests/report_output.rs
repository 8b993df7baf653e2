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
