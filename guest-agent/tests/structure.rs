//! The agent's layout, as the host tool's `tests/structure.rs` holds the host's: each
//! command in its own module under `src/commands/`, which never imports a sibling command
//! (what several share lives in `commands/mod.rs`), `main.rs` only parses and hands over, and
//! only `src/sysfs/` reads sysfs.

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

/// What reads sysfs in `code`: a path below a sysfs root (`"sys/…"`, `"/sys/…"`), the
/// fw_cfg blob's path, or a directory walk.
fn sysfs_reads(code: &str) -> Vec<&'static str> {
    const READS: [&str; 6] = [
        "\"sys/",
        "\"/sys/",
        "FW_CFG_SYSFS_PATH",
        "read_dir(",
        "read_link(",
        "canonicalize(",
    ];
    READS.into_iter().filter(|r| code.contains(r)).collect()
}

fn rust_files(dir: &std::path::Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn only_the_sysfs_module_reads_sysfs() {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    assert!(files.len() > 30, "{files:?}");
    let mut broken = Vec::new();
    for f in files.iter().filter(|f| !f.starts_with(src().join("sysfs"))) {
        let text = std::fs::read_to_string(f).unwrap();
        let production = text.split("#[cfg(test)]").next().unwrap();
        for r in sysfs_reads(production) {
            broken.push(format!(
                "{} reads sysfs ({r}): read it in src/sysfs/ (GuestSysfs) and pass the value",
                f.strip_prefix(src()).unwrap().display()
            ));
        }
    }
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

#[test]
fn the_sysfs_checker_sees_a_read() {
    assert_eq!(
        sysfs_reads("let d = root.join(\"sys/bus/pci/devices\");"),
        ["\"sys/"]
    );
    assert_eq!(
        sysfs_reads("fs::read_link(dir.join(\"driver\"))"),
        ["read_link("]
    );
    assert!(sysfs_reads("const BOOT_ID: &str = \"/proc/sys/kernel/random/boot_id\";").is_empty());
}

/// The `crate::NAME` modules `code` names.
fn crate_imports(code: &str) -> Vec<String> {
    let mut out: Vec<String> = code
        .split("crate::")
        .skip(1)
        .filter_map(|rest| {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            (!name.is_empty()).then_some(name)
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// The data flows one way through the library: the sysfs readers at the start import no
/// other module, and what prints or sends (`render`, `send`) is imported by no module of
/// the library (the commands, in the binary, call them last).
#[test]
fn the_data_flows_from_the_readers_to_the_renderers() {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let mut broken = Vec::new();
    for f in &files {
        let rel = f.strip_prefix(src()).unwrap().display().to_string();
        if rel.starts_with("commands/") || rel == "main.rs" {
            continue;
        }
        let text = std::fs::read_to_string(f).unwrap();
        let production = text.split("#[cfg(test)]").next().unwrap();
        for m in crate_imports(production) {
            if rel.starts_with("sysfs/") {
                broken.push(format!("{rel} (a reader) imports crate::{m}"));
            } else if m == "render" || m == "send" {
                broken.push(format!(
                    "{rel} imports crate::{m}, which only the commands call"
                ));
            }
        }
    }
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

#[test]
fn the_import_reader_sees_crate_paths() {
    assert_eq!(
        crate_imports("use crate::sysfs::gpus::Scan;\nlet r = crate::render::scan(&s);"),
        ["render", "sysfs"]
    );
    assert!(crate_imports("use super::read_sysfs_file;").is_empty());
}
