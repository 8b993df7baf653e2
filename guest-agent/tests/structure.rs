//! The agent's layout, as the host tool's `tests/structure.rs` holds the host's: each
//! command in its own module under `src/commands/`, which never imports a sibling command
//! (what several share lives in `commands/mod.rs`), and `main.rs` only parses and hands over.

use std::path::PathBuf;

fn src() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The sibling modules of `commands/` that `line` imports (`super::NAME::`).
fn sibling_imports(line: &str, siblings: &[String]) -> Vec<String> {
    siblings
        .iter()
        .filter(|s| {
            line.contains(&format!("super::{s}::")) || line.contains(&format!("commands::{s}::"))
        })
        .cloned()
        .collect()
}

#[test]
fn commands_do_not_import_each_other() {
    let dir = src().join("commands");
    let mut siblings: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "rs"))
        .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
        .filter(|s| s != "mod")
        .collect();
    siblings.sort();
    assert!(siblings.len() >= 9, "{siblings:?}");
    let mut broken = Vec::new();
    for s in &siblings {
        let code = std::fs::read_to_string(dir.join(format!("{s}.rs"))).unwrap();
        for line in code.lines() {
            for other in sibling_imports(line, &siblings) {
                broken.push(format!(
                    "commands/{s}.rs imports commands/{other}: {}",
                    line.trim()
                ));
            }
        }
    }
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

#[test]
fn the_checker_sees_a_sibling_import() {
    let siblings = vec!["topo".to_string(), "report".to_string()];
    assert_eq!(
        sibling_imports("use super::topo::topo_report;", &siblings),
        ["topo"]
    );
    assert!(sibling_imports("use super::{emit, topo_report};", &siblings).is_empty());
}

#[test]
fn main_only_parses_and_hands_over() {
    let main = std::fs::read_to_string(src().join("main.rs")).unwrap();
    let fns = main
        .lines()
        .filter(|l| l.trim_start().starts_with("fn "))
        .count();
    assert_eq!(
        fns, 1,
        "main.rs holds `main` alone; commands go under commands/"
    );
    assert!(main.lines().count() < 60);
}
