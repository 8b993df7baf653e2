//! The lab's verdict on why level A ended (tests/lab/level-a-end.sh), fed made-up runs: the
//! words every "not reached" row carries, and which deaths are not ours and earn a rerun. A cold
//! CI run once lost three stages to a second TCG kernel panic with no word of why.

use std::path::Path;
use std::process::Command;

/// Runs `level_a_end RUN RC` and `level_a_died_not_ours` on a run whose console is `serial`
/// (and, with `wedged`, whose watcher stopped it), with `unreached` stages left.
fn verdict(serial: &str, rc: i32, wedged: Option<&str>, unreached: u32) -> (String, bool) {
    let run = tempfile::tempdir().unwrap();
    std::fs::write(run.path().join("serial.log"), serial).unwrap();
    if let Some(why) = wedged {
        std::fs::write(run.path().join("wedged"), why).unwrap();
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/lab/level-a-end.sh");
    let out = Command::new("bash")
        .arg("-c")
        .arg(
            r#"set -euo pipefail; . "$1"; A_END=$(level_a_end "$2" "$3"); A_UNREACHED=$4
            echo "$A_END"; if level_a_died_not_ours; then echo rerun; else echo keep; fi"#,
        )
        .arg("lab-script")
        .arg(&script)
        .arg(run.path())
        .arg(rc.to_string())
        .arg(unreached.to_string())
        .env("LAB_TIMEOUT", "1800")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let mut lines = text.lines();
    let end = lines.next().unwrap().to_string();
    (end, lines.next() == Some("rerun"))
}

const STAGES: &str = "LAB-STAGE boot PASS 3.1 kernel 6.12\r\nLAB-PROGRESS guest-wrap ...\r\n";

#[test]
fn a_kernel_panic_is_named_and_run_again() {
    let serial = format!(
        "{STAGES}[  812.4] Oops: int3\r\n[  812.5] Kernel panic - not syncing: Fatal exception in interrupt\r\n"
    );
    let (end, rerun) = verdict(&serial, 0, None, 3);
    assert_eq!(
        end,
        "kernel died: [  812.5] Kernel panic - not syncing: Fatal exception in interrupt"
    );
    assert!(rerun);
    // the same death after every selected stage reported: nothing to run again
    assert!(!verdict(&serial, 0, None, 0).1);
}

#[test]
fn a_reset_before_the_power_off_names_the_last_console_line() {
    let serial = format!("{STAGES}[guest-wrap] starting level B\r\n\r\n");
    let (end, rerun) = verdict(&serial, 0, None, 3);
    assert!(end.starts_with("reset without powering off"), "{end}");
    assert!(
        end.ends_with("last console line: [guest-wrap] starting level B)"),
        "{end}"
    );
    assert!(rerun);
}

#[test]
fn the_power_off_a_deadline_and_a_wedge_are_not_run_again() {
    let done = format!("{STAGES}LAB-END poweroff\r\n");
    let (end, rerun) = verdict(&done, 0, None, 0);
    assert_eq!(end, "powered off after its last stage (exit 0)");
    assert!(!rerun);
    // a stage left unreached by a level A that powered off is ours (level-a.sh skipped it)
    assert!(!verdict(&done, 0, None, 2).1);
    let (end, rerun) = verdict(STAGES, 124, None, 3);
    assert_eq!(end, "ran out of its deadline (LAB_TIMEOUT=1800s)");
    assert!(!rerun);
    let why = "no console output and no file written for 240s";
    let (end, rerun) = verdict(STAGES, 143, Some(why), 3);
    assert_eq!(end, format!("was stopped: {why}"));
    assert!(!rerun);
    let (end, rerun) = verdict(STAGES, 1, None, 3);
    assert_eq!(end, "QEMU exited 1 before level A powered off");
    assert!(!rerun);
}
