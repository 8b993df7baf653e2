//! `--format prometheus` and `--send` (the vsock sending itself is proven in the lab:
//! this machine has no vsock peer).

use assert_cmd::Command;
use predicates::str::contains;

const REPORT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../tests/fixtures/agent/h200x2-report.json"
);

fn agent() -> Command {
    Command::cargo_bin("vfio-p2p-agent").unwrap()
}

#[test]
fn a_recorded_report_as_prometheus_text() {
    let out = agent()
        .args(["report", "--format", "prometheus", "--from", REPORT])
        .assert()
        .success();
    let text = String::from_utf8(out.get_output().stdout.clone()).unwrap();
    assert!(text.contains("# TYPE vfio_p2p_pair_bandwidth_bytes_per_second gauge\n"));
    assert!(text.lines().any(|l| l == "vfio_p2p_agent_exit 0"), "{text}");
    let ok = "vfio_p2p_pair_p2p_ok{src=\"0000:00:06.0\",dst=\"0000:00:07.0\",link=\"nvlink\"} 1";
    assert!(text.lines().any(|l| l == ok), "{text}");
    let bw = text
        .lines()
        .find(|l| l.starts_with("vfio_p2p_pair_bandwidth_bytes_per_second{src=\"0000:00:06.0\""))
        .unwrap();
    let v: f64 = bw.rsplit(' ').next().unwrap().parse().unwrap();
    assert!((3.5e11..4.5e11).contains(&v), "{bw}");
    // nothing but metrics on standard output
    assert!(
        text.lines()
            .all(|l| l.starts_with("# ") || l.starts_with("vfio_p2p_")),
        "{text}"
    );
}

#[test]
fn prometheus_is_refused_where_there_is_no_report() {
    agent()
        .args(["scan", "--format", "prometheus"])
        .assert()
        .code(2)
        .stderr(contains("--format prometheus is for expect and report"));
}

#[test]
fn send_without_a_channel_in_the_expectation_warns_and_sends_nothing() {
    let t = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(t.path().join("sys/bus/pci/devices")).unwrap();
    let e = t.path().join("expect.json");
    std::fs::write(&e, r#"{"version":1,"vm":"vm0","gpus":[]}"#).unwrap();
    agent()
        .args(["expect", "--send", "--sysfs-root"])
        .arg(t.path())
        .arg("--expect")
        .arg(&e)
        .assert()
        .success()
        .stderr(contains(
            "warning: the host's expectation names no report channel",
        ));
}
