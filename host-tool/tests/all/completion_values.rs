//! The shell completions (`cargo xtask dist` renders them with clap_complete from the clap
//! definition) offer the path levels for `--p2p-level` and `--max-path` (issue 40: they
//! were free text, so nothing was completed), and the parsers take exactly those.

use clap::CommandFactory;
use vfio_p2p::commands::Cli;

fn possible_values(path: &[&str], long: &str) -> Vec<String> {
    let mut cmd = Cli::command();
    cmd.build();
    let mut sub = &cmd;
    for name in path {
        sub = sub
            .find_subcommand(name)
            .unwrap_or_else(|| panic!("no subcommand {name}"));
    }
    let arg = sub
        .get_arguments()
        .find(|a| a.get_long() == Some(long))
        .unwrap_or_else(|| panic!("{path:?} has no --{long}"));
    arg.get_possible_values()
        .iter()
        .filter(|v| !v.is_hide_set())
        .map(|v| v.get_name().to_string())
        .collect()
}

#[test]
fn path_levels_are_offered_to_the_completions() {
    let levels = ["pix", "pxb", "phb", "node", "sys"];
    for path in [&["plan"][..], &["check"], &["gen"], &["libvirt", "patch"]] {
        assert_eq!(possible_values(path, "p2p-level"), levels, "{path:?}");
    }
    assert_eq!(possible_values(&["place"], "max-path"), levels);
}

#[test]
fn the_levels_parse_in_any_case_and_nothing_else_does() {
    let run = |level: &str| {
        crate::cli::vfio_p2p()
            .args(["--example", "flat-vm", "plan", "--p2p-level", level])
            .output()
            .unwrap()
    };
    assert!(run("PXB").status.success());
    assert!(run("node").status.success());
    let bad = run("pcie");
    assert_eq!(bad.status.code(), Some(2));
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(
        err.contains("[possible values: pix, pxb, phb, node, sys]"),
        "{err}"
    );
}
