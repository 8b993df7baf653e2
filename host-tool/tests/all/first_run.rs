//! What a new operator meets first (issue 16): the examples tell the truth, a host with no
//! GPU says so, summaries fit the screen, and messages come in one style.

use assert_cmd::Command;
use predicates::prelude::*;

fn vfio_p2p() -> Command {
    let mut c = crate::cli::vfio_p2p();
    c.env("COLUMNS", "120");
    c
}

/// Widest line of `text`, in characters.
fn widest(text: &[u8]) -> usize {
    String::from_utf8_lossy(text)
        .lines()
        .map(|l| l.chars().count())
        .max()
        .unwrap_or(0)
}

#[test]
fn flat_vm_shows_the_nvlink_of_its_capture() {
    vfio_p2p()
        .args(["--example", "flat-vm", "topo"])
        .assert()
        .success()
        .stdout(predicate::str::contains("GPU0    X   NV18"));
    vfio_p2p()
        .args(["--example", "flat-vm", "plan"])
        .assert()
        .success()
        .stdout(predicate::str::contains("NV18 (PHB)"))
        .stdout(predicate::str::contains("nvlink"));
}

#[test]
fn the_dual_socket_example_boots_like_an_intel_host() {
    let out = vfio_p2p()
        .args(["--example", "dual-socket-pcie", "topo", "--format", "json"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        !text.contains("amd_iommu"),
        "Intel root ports with amd_iommu=on"
    );
}

#[test]
fn a_host_without_gpus_says_so() {
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("sys/bus/pci/devices")).unwrap();
    for cmd in ["check", "plan"] {
        vfio_p2p()
            .arg("--sysfs-root")
            .arg(root.path())
            .arg(cmd)
            .assert()
            .code(2)
            .stderr(predicate::str::contains("no GPUs on this host"))
            .stderr(predicate::str::contains("--gpus").not());
    }
}

#[test]
fn summaries_fit_120_columns() {
    let gpus = "0000:05:00.0,0000:06:00.0,0000:09:00.0,0000:0a:00.0";
    for args in [
        vec!["plan"],
        vec!["check", "--gpus", gpus],
        vec!["place", "--shape", "2x4"],
    ] {
        let out = vfio_p2p()
            .args(["--example", "dual-socket-pcie"])
            .args(&args)
            .output()
            .unwrap();
        assert!(
            widest(&out.stdout) <= 120,
            "{args:?}: {}",
            widest(&out.stdout)
        );
    }
    let summary = vfio_p2p()
        .args(["--example", "dual-socket-pcie", "plan"])
        .output()
        .unwrap();
    let details = vfio_p2p()
        .args(["--example", "dual-socket-pcie", "plan", "--details"])
        .output()
        .unwrap();
    let lines = |o: &std::process::Output| String::from_utf8_lossy(&o.stdout).lines().count();
    assert!(lines(&summary) < 50, "{}", lines(&summary));
    assert!(lines(&details) > 3 * lines(&summary));
    assert!(String::from_utf8_lossy(&details.stdout).contains("no ACS"));
    assert!(!String::from_utf8_lossy(&details.stdout).contains("(absent)"));
}

#[test]
fn warnings_are_plain_lines_not_log_records() {
    vfio_p2p()
        .args([
            "--example",
            "dual-socket-pcie",
            "gen",
            "qemu",
            "--gpus",
            "0000:05:00.0,0000:85:00.0",
        ])
        .assert()
        .success()
        .stderr(predicate::str::starts_with("warning: "))
        .stderr(predicate::str::contains("WARN").not())
        .stderr(predicate::str::contains("vfio_p2p::").not());
}

/// Round two (issue 29): a host without GPUs says so once, not on stdout and stderr both.
#[test]
fn a_host_without_gpus_says_so_once() {
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("sys/bus/pci/devices")).unwrap();
    let out = vfio_p2p()
        .arg("--sysfs-root")
        .arg(root.path())
        .arg("topo")
        .output()
        .unwrap();
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
    .to_lowercase();
    assert_eq!(all.matches("no gpus").count(), 1, "{all}");
    assert!(all.contains("--example hgx-h100 topo"), "{all}");
}

/// Help names files as the package installs them, and options the command has.
#[test]
fn help_names_what_exists() {
    let manifest = include_str!("../../Cargo.toml");
    for args in [
        &["gen", "--help"][..],
        &["libvirt", "patch", "--help"],
        &["plan", "--help"],
        &["hook", "run", "--help"],
    ] {
        let out = vfio_p2p().args(args).output().unwrap();
        let help = String::from_utf8_lossy(&out.stdout).replace("\n  ", " ");
        let help: String = help.split_whitespace().collect::<Vec<_>>().join(" ");
        for (at, _) in help.match_indices("/usr/share/doc/vfio-p2p/examples/") {
            let path = help[at..].split([' ', ')', ';']).next().unwrap();
            let dir = &path[..path.rfind('/').unwrap() + 1];
            let dest = dir.trim_start_matches('/');
            assert!(
                manifest.contains(&format!("\"{dest}\"")),
                "{args:?}: {path} is not where the .deb puts anything"
            );
        }
        if args[0] == "libvirt" {
            assert!(!help.contains("config's `gpus`"), "{help}");
            assert!(!help.contains("--config"), "{help}");
        }
    }
}

/// Two GPUs far apart: their only pair is listed, not counted away; and the NVLink line
/// under the table says what holds for every NVLink pair, not one pair's PCIe path.
#[test]
fn a_small_plan_lists_every_pair_and_the_nvlink_line_fits_all() {
    let out = vfio_p2p()
        .args([
            "--example",
            "dual-socket-pcie",
            "plan",
            "--gpus",
            "05:00.0,85:00.0",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("0000:05:00.0   0000:85:00.0   SYS") && !text.contains("not listed"),
        "{text}"
    );
    let out = vfio_p2p()
        .args(["--example", "hgx-h100", "plan"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let nvlink = text.lines().find(|l| l.starts_with("nvlink: ")).unwrap();
    assert!(
        text.contains("NV18 (NODE)") && text.contains("NV18 (PIX)"),
        "{text}"
    );
    assert!(
        !nvlink.contains("PIX") && !nvlink.contains("PCIe path"),
        "{nvlink}"
    );
}

/// `verdicts --history` of a domain without a report says why, with no OS error: a
/// registered one has none yet (exit 0), an unknown one is named with its state directory.
#[test]
fn verdict_history_without_a_report_says_why() {
    let state = tempfile::tempdir().unwrap();
    let dir = state.path().to_str().unwrap();
    let out = vfio_p2p()
        .args(["verdicts", "--state-dir", dir, "--history", "train-01"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("no domain 'train-01' in") && !err.contains("os error"),
        "{err}"
    );
    std::fs::create_dir_all(state.path().join("plans")).unwrap();
    std::fs::write(state.path().join("plans/train-01.json"), "{}").unwrap();
    let out = vfio_p2p()
        .args(["verdicts", "--state-dir", dir, "--history", "train-01"])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("no report from train-01 yet"));
}

/// `hook run --dry-run` says what it found when all is well, instead of nothing.
#[test]
fn a_dry_run_of_the_hook_says_all_is_well() {
    let existing = include_str!("../../../tests/fixtures/libvirt/existing-domain.xml");
    let patched = vfio_p2p()
        .args([
            "--example",
            "dual-socket-pcie",
            "libvirt",
            "patch",
            "--libvirt-version",
            "9.0",
            "-",
        ])
        .write_stdin(existing)
        .output()
        .unwrap();
    assert!(patched.status.success());
    for (op, stdin, said) in [
        ("prepare", patched.stdout.clone(), "train-01: all well"),
        ("release", Vec::new(), "train-01: prepare bound nothing"),
    ] {
        let sub = if op == "prepare" { "begin" } else { "end" };
        let out = vfio_p2p()
            .args(["--example", "dual-socket-pcie", "hook", "run", "--dry-run"])
            .args(["train-01", op, sub, "-"])
            .write_stdin(stdin)
            .output()
            .unwrap();
        assert!(out.status.success());
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.starts_with(said), "{op}: {text:?}");
    }
}

/// `topo --format dot | dot` draws every example without a Graphviz warning (hgx-h100's
/// NVLink edges between NUMA clusters made it print seven).
#[test]
fn graphviz_draws_every_example_without_a_warning() {
    assert!(
        std::process::Command::new("dot").arg("-V").output().is_ok(),
        "`dot` not found: tests/setup installs graphviz"
    );
    for example in ["hgx-h100", "dual-socket-pcie", "lab", "flat-vm"] {
        let out = vfio_p2p()
            .args(["--example", example, "topo", "--format", "dot"])
            .output()
            .unwrap();
        let drawn = Command::new("dot")
            .arg("-Tsvg")
            .write_stdin(out.stdout)
            .output()
            .unwrap();
        assert!(drawn.status.success(), "{example}");
        assert!(
            drawn.stderr.is_empty(),
            "{example}: {}",
            String::from_utf8_lossy(&drawn.stderr)
        );
    }
}

/// Errors read one way: `error: …`, whether clap or the command found the problem.
#[test]
fn errors_read_one_way() {
    let usage = vfio_p2p()
        .args(["plan", "--no-such-option"])
        .output()
        .unwrap();
    let input = vfio_p2p()
        .args(["--sysfs-root", "/nonexistent/vfio-p2p", "topo"])
        .output()
        .unwrap();
    for out in [usage, input] {
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(err.starts_with("error: "), "{err}");
    }
}
