//! Colour on a terminal only (issue 40): `check`'s fail rows red and warn rows yellow when
//! stdout is a terminal, none in a pipe or with NO_COLOR set (no-color.org). The terminal is
//! util-linux's `script` (Debian: bsdutils, Essential): without it the test fails.

use std::process::Command;

/// `check` of the example with an unmanaged domain (fail rows) on a pseudo-terminal.
fn check_on_a_terminal(no_color: Option<&str>) -> String {
    let dir = tempfile::tempdir().unwrap();
    let gen = crate::cli::vfio_p2p()
        .args(["--example", "dual-socket-pcie", "gen", "libvirt"])
        .output()
        .unwrap();
    let domain = dir.path().join("domain.xml");
    let xml = String::from_utf8(gen.stdout).unwrap();
    std::fs::write(&domain, xml.replace("managed='yes'", "managed='no'")).unwrap();
    // the pseudo-terminal starts 0 columns wide: give it 160
    let command = format!(
        "stty cols 160 rows 50; {} --example dual-socket-pcie check --domain-xml {}",
        crate::cli::bin().display(),
        domain.display()
    );
    let mut script = Command::new("script");
    script
        .args(["-qec", &command, "/dev/null"])
        .env("COLUMNS", "120");
    match no_color {
        Some(v) => script.env("NO_COLOR", v),
        None => script.env_remove("NO_COLOR"),
    };
    let out = script
        .output()
        .expect("`script` (util-linux) runs a command on a terminal");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn fail_rows_are_red_on_a_terminal_only() {
    let coloured = check_on_a_terminal(None);
    // a fail row carries an escape sequence, a pass row none
    let red_fail = coloured
        .lines()
        .any(|l| l.contains("fail") && l.contains("\u{1b}["));
    let plain_pass = coloured
        .lines()
        .any(|l| l.contains("pass") && !l.contains("\u{1b}["));
    assert!(red_fail && plain_pass, "{coloured}");
    let plain = check_on_a_terminal(Some("1"));
    assert!(plain.contains("fail"), "{plain}");
    assert!(!plain.contains('\u{1b}'), "{plain}");
    // a pipe: never
    let piped = crate::cli::vfio_p2p()
        .args(["--example", "dual-socket-pcie", "check"])
        .output()
        .unwrap();
    assert!(!String::from_utf8_lossy(&piped.stdout).contains('\u{1b}'));
}
