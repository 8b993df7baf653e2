//! The import rules of docs/architecture.md, checked on the sources: data flows
//! read → model → decide → emit, no stage reaches up to the CLI, commands do not import
//! each other. Test modules (`#[cfg(test)]` onwards) may use anything.

use std::fs;
use std::path::{Path, PathBuf};

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

/// Production code of every file below `src/`, keyed by its path relative to `src/`.
fn production() -> Vec<(String, String)> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let text = fs::read_to_string(&p).unwrap();
            // A module's tests in their own file (`mod tests;` → `tests.rs`) are all test code.
            let code = if p.ends_with("tests.rs") {
                String::new()
            } else {
                text.split("#[cfg(test)]").next().unwrap().to_string()
            };
            let rel = p.strip_prefix(&src).unwrap().display().to_string();
            (rel, code)
        })
        .collect()
}

/// The stage a file belongs to: its first path component (`read/sysfs.rs` → `read`).
fn stage(rel: &str) -> &str {
    rel.split('/').next().unwrap().trim_end_matches(".rs")
}

/// `crate::X` paths used in `code` (imports, groups, inline paths), as X.
fn crate_uses(code: &str) -> Vec<String> {
    let code: Vec<&str> = code
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect();
    let code = code.join("\n");
    let ident = |s: &str| -> String {
        s.trim_start()
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    let mut found = Vec::new();
    let mut rest = code.as_str();
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        let Some(group) = rest.strip_prefix('{') else {
            found.push(ident(rest));
            continue;
        };
        // `crate::{a::b, c::{d, e}}`: the first name of each top-level item.
        let (mut depth, mut start) = (0, 0);
        for (j, ch) in group.char_indices() {
            match ch {
                '{' => depth += 1,
                '}' if depth == 0 => {
                    found.push(ident(&group[start..j]));
                    break;
                }
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    found.push(ident(&group[start..j]));
                    start = j + 1;
                }
                _ => {}
            }
        }
    }
    found.retain(|n| !n.is_empty());
    found
}

#[test]
fn imports_point_down_the_flow() {
    let rules: &[(&str, &[&str])] = &[
        (
            "read",
            &["decide", "emit", "config", "cli", "commands", "context"],
        ),
        ("model", &["decide", "emit", "cli", "commands", "context"]),
        ("decide", &["read", "emit", "cli", "commands", "context"]),
        ("emit", &["read", "cli", "commands", "context"]),
        ("config", &["decide", "emit", "cli", "commands", "context"]),
        ("hook", &["cli", "commands", "context"]),
        ("vfio_bind", &["cli", "commands", "context", "emit"]),
        ("host_probe", &["cli", "commands", "context", "emit"]),
        ("snapshot", &["cli", "commands", "context"]),
        ("synth", &["cli", "commands", "context", "decide", "emit"]),
    ];
    let mut broken = Vec::new();
    for (rel, code) in production() {
        let Some((_, banned)) = rules.iter().find(|(s, _)| *s == stage(&rel)) else {
            continue;
        };
        for used in crate_uses(&code) {
            if banned.contains(&used.as_str()) {
                broken.push(format!("{rel} uses crate::{used}"));
            }
        }
    }
    assert!(
        broken.is_empty(),
        "imports against the flow:\n{}",
        broken.join("\n")
    );
}

#[test]
fn commands_do_not_import_each_other() {
    let mut broken = Vec::new();
    for (rel, code) in production() {
        if !rel.starts_with("commands/") || rel == "commands/mod.rs" {
            continue;
        }
        for line in code.lines() {
            if line.contains("super::") || line.contains("crate::commands") {
                broken.push(format!("{rel}: {}", line.trim()));
            }
        }
    }
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

#[test]
fn the_checker_sees_imports() {
    assert_eq!(
        crate_uses(
            "use vfio_p2p_read::{a, b};\nlet x = vfio_p2p_model::T::new();\n\
             use crate::{\n    cli,\n    emit::{data, qemu},\n    decide,\n};\n// crate::commands"
        ),
        ["read", "model", "cli", "emit", "decide"]
    );
    assert_eq!(stage("read/sysfs.rs"), "read");
    assert_eq!(stage("context.rs"), "context");
    assert!(production().iter().any(|(rel, _)| rel == "decide/plan.rs"));
}

/// Production code of every crate in the workspace (test modules cut off, as above),
/// keyed by its path relative to the workspace root.
fn workspace_production() -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let mut files = Vec::new();
    for krate in fs::read_dir(root).unwrap() {
        let src = krate.unwrap().path().join("src");
        if src.join("lib.rs").is_file() || src.join("main.rs").is_file() {
            sources(&src, &mut files);
        }
    }
    files.sort();
    files
        .into_iter()
        .filter(|p| !p.ends_with("tests.rs"))
        .map(|p| {
            let text = fs::read_to_string(&p).unwrap();
            let code = text.split("#[cfg(test)]").next().unwrap().to_string();
            (p.strip_prefix(root).unwrap().display().to_string(), code)
        })
        .collect()
}

/// `(name, lines)` of every `fn` with a body in `code`, by brace counting on the
/// text with string and char literals and comments blanked out.
fn function_lengths(code: &str) -> Vec<(String, usize)> {
    let lines: Vec<String> = code.lines().map(without_literals).collect();
    let mut found = Vec::new();
    for (start, line) in lines.iter().enumerate() {
        let Some(name) = fn_name(line) else { continue };
        let (mut depth, mut opened) = (0i64, false);
        for (i, l) in lines[start..].iter().enumerate() {
            if !opened && l.contains(';') && !l.contains('{') {
                break; // a declaration without a body (trait item, extern)
            }
            depth += l.matches('{').count() as i64 - l.matches('}').count() as i64;
            opened |= l.contains('{');
            if opened && depth <= 0 {
                found.push((name.clone(), i + 1));
                break;
            }
        }
    }
    found
}

fn fn_name(line: &str) -> Option<String> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let at = words.iter().position(|w| *w == "fn")?;
    let qualifiers = ["pub", "const", "async", "unsafe", "extern", "\"C\""];
    if !words[..at]
        .iter()
        .all(|w| qualifiers.contains(w) || w.starts_with("pub("))
    {
        return None;
    }
    let name: String = words
        .get(at + 1)?
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    Some(name)
}

/// A line with its comment, string and char literals removed (enough for brace counting).
fn without_literals(line: &str) -> String {
    let mut out = String::new();
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '/' if chars.peek() == Some(&'/') => break,
            '"' => {
                while let Some(s) = chars.next() {
                    match s {
                        '\\' => {
                            chars.next();
                        }
                        '"' => break,
                        _ => {}
                    }
                }
            }
            '\'' => {
                // A char literal ('{', '\''), or a lifetime ('a), which is kept.
                let rest: String = chars.clone().take(3).collect();
                if rest.starts_with('\\') {
                    for s in chars.by_ref() {
                        if s == '\'' {
                            break;
                        }
                    }
                } else if rest.chars().nth(1) == Some('\'') {
                    chars.next();
                    chars.next();
                }
            }
            _ => out.push(c),
        }
    }
    out
}

#[test]
fn functions_and_files_stay_short() {
    const MAX_FN: usize = 120;
    const MAX_FILE: usize = 700;
    let mut broken = Vec::new();
    for (rel, code) in workspace_production() {
        let lines = code.lines().count();
        if lines > MAX_FILE {
            broken.push(format!(
                "{rel}: {lines} lines of production code (at most {MAX_FILE})"
            ));
        }
        for (name, len) in function_lengths(&code) {
            if len > MAX_FN {
                broken.push(format!("{rel}: fn {name} is {len} lines (at most {MAX_FN}): split it at its named steps"));
            }
        }
    }
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

#[test]
fn the_length_checker_counts_bodies() {
    let code = "pub fn a() {\n    let s = \"}}}\";\n    let c = '{';\n}\nfn b<'x>(v: &'x str) -> &'x str {\n    // }\n    v\n}\ntrait T {\n    fn decl(&self);\n}\n";
    assert_eq!(
        function_lengths(code),
        [("a".to_string(), 4), ("b".to_string(), 4)]
    );
    assert!(workspace_production()
        .iter()
        .any(|(rel, _)| rel == "guest-agent/src/main.rs"));
}
