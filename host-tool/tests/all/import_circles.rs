//! No import circle anywhere (issue 41): within every workspace crate, the modules'
//! `crate::`/`super::`/`self::` paths in production code (comments and test modules left out)
//! form no cycle. A module reaching into its own parent or child is not an edge (the parent
//! declares the child); a path between cousins is an edge between the siblings that hold them.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

type Module = Vec<String>;

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The module a file is (`src/a/mod.rs` and `src/a.rs` are `a`; lib.rs and main.rs the root).
fn module_of(src: &Path, file: &Path) -> Module {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Module = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

/// Production code: up to the first `#[cfg(test)]`, without `//` comments.
fn production(text: &str) -> String {
    let code = text.split("#[cfg(test)]").next().unwrap();
    code.lines()
        .map(|l| l.split("//").next().unwrap())
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every `crate::…`, `super::…` or `self::…` path in `code`, as its segments.
fn paths(code: &str) -> Vec<Vec<&str>> {
    let mut out = Vec::new();
    for start in ["crate::", "super::", "self::"] {
        for (i, _) in code.match_indices(start) {
            if code[..i].ends_with(|c: char| c.is_alphanumeric() || c == '_') {
                continue;
            }
            let tail = &code[i..];
            let end = tail
                .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                .unwrap_or(tail.len());
            out.push(tail[..end].split("::").filter(|s| !s.is_empty()).collect());
        }
    }
    out
}

/// The module a path from `from` lands in: the longest known module prefix.
fn target(from: &Module, path: &[&str], known: &BTreeSet<Module>) -> Module {
    let (mut base, mut rest) = (from.clone(), path);
    match rest.first() {
        Some(&"crate") => (base, rest) = (Vec::new(), &rest[1..]),
        Some(&"self") => rest = &rest[1..],
        _ => {
            while rest.first() == Some(&"super") {
                base.pop();
                rest = &rest[1..];
            }
        }
    }
    for seg in rest {
        let mut next = base.clone();
        next.push(seg.to_string());
        if !known.contains(&next) {
            break;
        }
        base = next;
    }
    base
}

fn edges(src: &Path) -> BTreeMap<Module, BTreeSet<Module>> {
    let mut files = Vec::new();
    sources(src, &mut files);
    let modules: BTreeMap<Module, String> = files
        .iter()
        .filter(|f| !f.to_string_lossy().ends_with("tests.rs"))
        .map(|f| {
            (
                module_of(src, f),
                production(&fs::read_to_string(f).unwrap()),
            )
        })
        .collect();
    let known: BTreeSet<Module> = modules.keys().cloned().collect();
    let mut graph: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
    for (from, code) in &modules {
        for path in paths(code) {
            let to = target(from, &path, &known);
            // the edge runs between the two children of their nearest common ancestor that
            // hold them: `check::rules` naming `fabric` makes `check` depend on `fabric`
            let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
            if common < from.len() && common < to.len() {
                graph
                    .entry(from[..=common].to_vec())
                    .or_default()
                    .insert(to[..=common].to_vec());
            }
        }
    }
    graph
}

/// One cycle of `graph`, if any (depth-first search, white/grey/black).
fn cycle(graph: &BTreeMap<Module, BTreeSet<Module>>) -> Option<Vec<Module>> {
    fn visit(
        m: &Module,
        graph: &BTreeMap<Module, BTreeSet<Module>>,
        done: &mut BTreeSet<Module>,
        stack: &mut Vec<Module>,
    ) -> Option<Vec<Module>> {
        if let Some(at) = stack.iter().position(|s| s == m) {
            return Some(stack[at..].to_vec());
        }
        if done.contains(m) {
            return None;
        }
        stack.push(m.clone());
        for next in graph.get(m).into_iter().flatten() {
            if let Some(c) = visit(next, graph, done, stack) {
                return Some(c);
            }
        }
        stack.pop();
        done.insert(m.clone());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|m| visit(m, graph, &mut done, &mut Vec::new()))
}

fn workspace_sources() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let manifest = fs::read_to_string(root.join("Cargo.toml")).unwrap();
    let members = manifest.split("members = [").nth(1).unwrap();
    let members = members.split(']').next().unwrap();
    members
        .split(',')
        .map(|m| m.trim().trim_matches('"'))
        .filter(|m| !m.is_empty())
        .map(|m| root.join(m).join("src"))
        .filter(|src| src.is_dir())
        .collect()
}

#[test]
fn no_crate_has_an_import_circle() {
    let srcs = workspace_sources();
    assert!(srcs.len() > 10, "{srcs:?}");
    for src in srcs {
        if let Some(c) = cycle(&edges(&src)) {
            let names: Vec<String> = c.iter().map(|m| m.join("::")).collect();
            panic!("{}: import circle {}", src.display(), names.join(" -> "));
        }
    }
}

#[test]
fn the_circle_finder_sees_a_circle_and_not_a_parent() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    fs::create_dir_all(src.join("a")).unwrap();
    fs::write(src.join("lib.rs"), "mod a; mod b;").unwrap();
    fs::write(
        src.join("a/mod.rs"),
        "mod c; use crate::b::X; pub struct Y;",
    )
    .unwrap();
    fs::write(
        src.join("a/c.rs"),
        "use super::Y; // crate::b is only named here",
    )
    .unwrap();
    fs::write(src.join("b.rs"), "pub struct X;").unwrap();
    assert_eq!(cycle(&edges(src)), None);
    fs::write(src.join("b.rs"), "use crate::a::c::Z; pub struct X;").unwrap();
    fs::write(src.join("a/c.rs"), "pub struct Z; use super::super::b::X;").unwrap();
    let c = cycle(&edges(src)).expect("a::c -> b -> a::c");
    assert_eq!(c.len(), 2, "{c:?}");
}
